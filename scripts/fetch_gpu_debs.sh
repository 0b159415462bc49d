#!/usr/bin/env bash
# Builds .debs/: Debian's Slurm and munge with the libraries they link, for a lent GPU machine that has no
# network, so that scripts/gpu_first.sh's Slurm section can run `slurm/local/start.sh` there
# (ZB_SLURM_DEBS=.debs). Made here, where apt-get reaches the archive; carry `.debs` with the run.
# start.sh unpacks them without replacing any file the machine already has (its libc, zlib, ... stay).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libmunge2
  libhwloc15 libnuma1 liblz4-1 libreadline8 libjson-c5 libyaml-0-2 liblua5.1-0 libdbus-1-3 libudev1
  libpam0g libaudit1 libcap-ng0 libgcrypt20 libgpg-error0 libbz2-1.0 zlib1g)
rm -rf .debs && mkdir .debs
(cd .debs && apt-get download -qq "${pkgs[@]}")
ls -1 .debs
du -sh .debs
