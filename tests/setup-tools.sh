#!/usr/bin/env bash
# Install the system tools some tests use, from Debian packages: Slurm (slurmctld, slurmd, client) with
# munge for the tests marked `slurm`, shellcheck for the batch scripts, chromium for the report's
# browser check, valgrind (and a C compiler) for the regression gate's instruction counts. Tests never install anything themselves; without these tools they skip, naming this
# script. Needs root and apt-get; without them it says what is missing and exits 0 (the tests then skip).
set -euo pipefail

need=()
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
  || need+=(slurmctld slurmd slurm-client)
command -v munged >/dev/null || need+=(munge)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need+=(chromium)
command -v valgrind >/dev/null && [[ -e /usr/include/valgrind/callgrind.h ]] || need+=(valgrind)
command -v cc >/dev/null || need+=(gcc)

if [[ ${#need[@]} -eq 0 ]]; then
  echo "tests/setup-tools.sh: every tool is installed"
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "tests/setup-tools.sh: not installing ${need[*]} (needs root and apt-get); the tests using them will skip" >&2
  exit 0
fi
echo "tests/setup-tools.sh: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
