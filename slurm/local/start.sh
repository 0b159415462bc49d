#!/usr/bin/env bash
# Start a real Slurm on this host: munged, slurmctld and one slurmd per emulated node, then wait until
# every node is idle. Installs Debian's slurmctld/slurmd/slurm-client/munge when missing (needs root): with
# apt-get, or, on a host without network, from the packages in ZB_SLURM_DEBS (scripts/fetch_gpu_debs.sh makes
# them). Idempotent: if the cluster is already up it only prints how to use it.
#
#   ZB_SLURM_NODES   emulated nodes (default 2)        ZB_SLURM_CPUS  CPUs declared per node (default 8)
#   ZB_SLURM_GPUS    fake GPUs per node (default 2)    ZB_SLURM_DIR   state directory (default /tmp/zerobench-slurm)
#   ZB_SLURM_GPU_FILES  the GPUs' device files (default: the host's /dev/nvidia0, /dev/nvidia1, ... if any);
#                    when there are some, every node declares them as its GRES gpu (ZB_SLURM_GPUS is then
#                    their count) and a job's --gres=gpu:N gets CUDA_VISIBLE_DEVICES from Slurm; without
#                    any, each node has ZB_SLURM_GPUS fake GPUs backed by /dev/null. "none": fake ones always.
#   ZB_SLURM_DEBS    a directory of .deb files to install from when Slurm is missing and apt-get cannot
#
# Afterwards: export SLURM_CONF="$ZB_SLURM_DIR/slurm.conf" (printed on the last line).
set -euo pipefail

nodes=${ZB_SLURM_NODES:-2}
cpus=${ZB_SLURM_CPUS:-8}
gpus=${ZB_SLURM_GPUS:-2}
dir=${ZB_SLURM_DIR:-/tmp/zerobench-slurm}
conf="$dir/slurm.conf"

die() { echo "slurm/local/start.sh: $*" >&2; exit 1; }

if [[ -f "$dir/pids" ]] && SLURM_CONF="$conf" timeout 10 sinfo -h >/dev/null 2>&1; then
  echo "local Slurm already running ($dir)"
  echo "export SLURM_CONF=$conf"
  exit 0
fi

# Unpack carried packages under ROOT (default /) without replacing anything there: each file is copied only
# where no file is (the host's own libc, zlib, ... stay). On a merged-/usr host (/lib a link to usr/lib) the
# packages' /lib, /bin, /sbin files go where those links point.
unpack_debs() {
  local debs=$1 root=${2:-/} stage d t
  stage=$(mktemp -d)
  for f in "$debs"/*.deb; do dpkg -x "$f" "$stage"; done
  for d in bin sbin lib lib64; do
    if [[ -L "$root/$d" && -d "$stage/$d" ]]; then
      t=$(readlink "$root/$d")
      mkdir -p "$stage/$t"
      cp -rn "$stage/$d"/. "$stage/$t"/
      rm -rf "${stage:?}/$d"
    fi
  done
  cp -rn "$stage"/. "$root"/
  rm -rf "$stage"
}

install_debs() {
  unpack_debs "$1" /
  # Debian names its daemons *-wlm and links the plain names in its install scripts, which unpacking skips
  for x in slurmctld slurmd slurmstepd; do
    [[ -e /usr/sbin/$x || ! -e /usr/sbin/$x-wlm ]] || ln -s "$x-wlm" "/usr/sbin/$x"
  done
  ldconfig
  id munge >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin munge
}

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null; then
  [[ $(id -u) -eq 0 ]] || die "Slurm is not installed and installing it needs root"
  if [[ -n "${ZB_SLURM_DEBS:-}" ]]; then
    compgen -G "$ZB_SLURM_DEBS/*.deb" >/dev/null || die "ZB_SLURM_DEBS=$ZB_SLURM_DEBS holds no .deb files"
    install_debs "$ZB_SLURM_DEBS"
  else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  fi
fi

mkdir -p "$dir"/{ctld,log,run,dev} "$dir/spool"
: > "$dir/pids"
host=$(hostname -s)

# munge: a key, a socket directory owned by munge, and munged running as the munge user
if [[ ! -s /etc/munge/munge.key ]]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
if ! pgrep -u munge -x munged >/dev/null; then
  runuser -u munge -- /usr/sbin/munged
fi
pgrep -u munge -x munged >> "$dir/pids" || die "munged did not start"

# GPUs: the host's cards where it has some (every emulated node declares them: they are one host's), else
# fake ones, GRES files backed by /dev/null
cards=()
if [[ ${ZB_SLURM_GPU_FILES:-} == none ]]; then
  :
elif [[ -n ${ZB_SLURM_GPU_FILES:-} ]]; then
  read -r -a cards <<< "$ZB_SLURM_GPU_FILES"
  for c in "${cards[@]}"; do [[ -c $c ]] || die "ZB_SLURM_GPU_FILES: $c is not a character device"; done
else
  for c in /dev/nvidia[0-9]*; do [[ -c $c ]] && cards+=("$c"); done
fi
[[ ${#cards[@]} -eq 0 ]] || gpus=${#cards[@]}
{
  echo "AutoDetect=off"
  for n in $(seq 1 "$nodes"); do
    if [[ ${#cards[@]} -gt 0 ]]; then
      for c in "${cards[@]}"; do echo "NodeName=n$n Name=gpu File=$c"; done
    else
      for g in $(seq 0 $((gpus - 1))); do ln -sfn /dev/null "$dir/dev/n$n-gpu$g"; done
      echo "NodeName=n$n Name=gpu File=$dir/dev/n$n-gpu[0-$((gpus - 1))]"
    fi
  done
} > "$dir/gres.conf"

cat > "$conf" <<CONF
ClusterName=zerobench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
KillWait=5
MinJobAge=600
CONF
for n in $(seq 1 "$nodes"); do
  echo "NodeName=n$n NodeAddr=127.0.0.1 NodeHostname=$host Port=$((17000 + n)) CPUs=$cpus Gres=gpu:$gpus State=UNKNOWN" >> "$conf"
done
echo "PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >> "$conf"
cp "$dir/gres.conf" "$(dirname "$conf")/gres.conf" 2>/dev/null || true
# Nothing here uses cgroups (proctrack/linuxproc, task/none, jobacct_gather/none), but slurmd 22.05 still loads a
# cgroup plugin: on a cgroup-v2 host it autodetects cgroup/v2, whose start-up asks systemd over D-Bus for a scope
# and fails where there is none (containers, GPU machines' images). Pinning cgroup/v1 loads the plugin that needs
# nothing until a cgroup consumer asks.
echo "CgroupPlugin=cgroup/v1" > "$(dirname "$conf")/cgroup.conf"

export SLURM_CONF="$conf"
/usr/sbin/slurmctld -f "$conf" -i
for n in $(seq 1 "$nodes"); do
  /usr/sbin/slurmd -f "$conf" -N "n$n"
done
# record the PIDs now: the daemons remove their pid files before they have finished exiting
pidfiles=("$dir/run/slurmctld.pid")
for n in $(seq 1 "$nodes"); do pidfiles+=("$dir/run/slurmd-n$n.pid"); done
for f in "${pidfiles[@]}"; do
  for _ in $(seq 100); do [[ -s "$f" ]] && break; sleep 0.1; done
  [[ -s "$f" ]] || die "no pid file $f: the daemon did not start (see $dir/log)"
  cat "$f" >> "$dir/pids"
done

for _ in $(seq 120); do
  states=$(sinfo -h -N -o '%t' 2>/dev/null | sort -u | tr '\n' ' ')
  if [[ "$states" == "idle " ]]; then
    kind="fake GPUs"; [[ ${#cards[@]} -eq 0 ]] || kind="GPUs (${cards[*]})"
    echo "local Slurm up: $nodes nodes x $cpus CPUs x $gpus $kind ($dir)"
    echo "export SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.5
done
die "nodes not idle after 60 s (states: ${states:-none}); see $dir/log"
