"""Where this process sits in the job: rank, world size, local rank and rendezvous address.

Read from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) or, under ``srun``, from Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
first host of ``SLURM_JOB_NODELIST``). ``init_distributed`` initialises the backend ``choose_backend`` picks:
NCCL when every rank on a node has a GPU of its own, gloo on CPU and where ranks share a GPU (NCCL refuses
two ranks on one device; gloo moves CUDA tensors for the all-reduce and broadcast zerobench's gloo path is
built from), always with a collective timeout so that a dead rank fails the run instead of hanging it.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zerobench.config import ConfigError
from zerobench.distributed.backends import BACKENDS
from zerobench.distributed.rendezvous import connect_store

if TYPE_CHECKING:  # torch loads where a device or a process group is made: reading the layout needs none of it
    import torch

DEFAULT_PORT = 29500
PORT_SPAN = 10000
"""Under Slurm without ``MASTER_PORT``, the port is ``DEFAULT_PORT`` plus a hash of the job and step ids below
this."""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of processes in the job."""
    local_rank: int
    """Rank on this node (selects the GPU)."""
    master_addr: str
    """Host of rank 0."""
    master_port: int
    """Rendezvous TCP port on ``master_addr``."""
    source: str
    """``torchrun``, ``slurm`` or ``single``."""
    local_world_size: int | None = None
    """Processes on this node (torchrun's ``LOCAL_WORLD_SIZE``, Slurm's tasks per node); None: not known."""
    launch_id: str = ""
    """What names this launch (Slurm's ``<job id>.<step id>``, torchrun's ``TORCHELASTIC_RUN_ID``): the rendezvous
    keys its store's entries by it, so a rank of another launch that reaches this one's port (two steps of a job
    started together) waits for its own peers and fails at the timeout, and never joins this launch's run."""


def first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression: ``gpu[003-005,9],cpu1`` -> ``gpu003``, and with several ranges in
    one name, ``rack[1-2]-node[01-02]`` -> ``rack1-node01`` (each range at its first value)."""
    entry, depth = "", 0
    for ch in nodelist.strip():  # the first entry: up to the first comma outside brackets
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        entry += ch
    host = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], entry)
    if not entry or depth != 0 or not re.fullmatch(r"[\w.-]+", host):
        raise ConfigError(f"cannot parse the Slurm node list {nodelist!r}")
    return host


def tasks_per_node(value: str) -> int | None:
    """Slurm's tasks per node when every node has the same number (``4``, ``4(x2)``); else None (``2,1``)."""
    counts = {int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", value)}
    return counts.pop() if len(counts) == 1 and re.fullmatch(r"[\d(x),]+", value) else None


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ConfigError(f"environment variable {key}={env[key]!r} is not an integer") from None


def detect(env: Mapping[str, str] | None = None) -> DistEnv:
    """Read the job layout from the environment (torchrun first, then Slurm, else a single process),
    checked before any rendezvous: a rank outside its world, or Slurm's variables in a batch script
    without ``srun`` (which would wait for ranks that never come), is a one-line ``ConfigError``."""
    denv = _detect(os.environ if env is None else env)
    if denv.world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {denv.world_size} (from {denv.source}'s variables)")
    if not 0 <= denv.rank < denv.world_size:
        raise ConfigError(
            f"rank {denv.rank} is outside a world of {denv.world_size} (from {denv.source}'s "
            f"variables): ranks are 0..{denv.world_size - 1}"
        )
    if denv.local_rank < 0 or denv.local_rank > denv.rank:
        raise ConfigError(
            f"local rank {denv.local_rank} does not fit rank {denv.rank} (from {denv.source}'s variables)"
        )
    if not 0 < denv.master_port < 65536:
        raise ConfigError(f"MASTER_PORT {denv.master_port} is not a TCP port (1-65535)")
    return denv


def _detect(env: Mapping[str, str]) -> DistEnv:
    if ("RANK" in env) != ("WORLD_SIZE" in env):
        have, miss = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        raise ConfigError(f"{have} is set but {miss} is not: set both (torchrun does), or neither")
    if "RANK" in env and "WORLD_SIZE" in env:
        # torch's env:// reads RANK and WORLD_SIZE only; inside an srun task Slurm's local id is the local rank
        local = next((k for k in ("LOCAL_RANK", "SLURM_LOCALID") if k in env), None)
        return DistEnv(
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            _int(env, local) if local else 0,
            env.get("MASTER_ADDR", "127.0.0.1"),
            _int(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT,
            "torchrun",
            _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else None,
            env.get("TORCHELASTIC_RUN_ID", ""),
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
        if not in_step:
            if _int(env, "SLURM_NTASKS") > 1:
                raise ConfigError(
                    f"Slurm's variables say {env['SLURM_NTASKS']} tasks, but this process is not an srun step: "
                    "start the ranks with `srun zerobench train ...` (one per task); to start --dp N local processes "
                    "here instead, run it with SLURM_NTASKS=1"
                )
            return DistEnv(0, 1, 0, "127.0.0.1", DEFAULT_PORT, "single")
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        elif "SLURM_STEP_NODELIST" in env or "SLURM_JOB_NODELIST" in env:  # rank 0 is on the step's first node
            addr = first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        else:
            raise ConfigError("under Slurm but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set")
        step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", ""))
        launch = f"{env.get('SLURM_JOB_ID', '')}.{step}"
        if "MASTER_PORT" in env:
            port = _int(env, "MASTER_PORT")
        else:  # derived from the job and step ids, so that concurrent jobs and steps on a node rarely collide
            port = DEFAULT_PORT + int(hashlib.sha256(launch.encode()).hexdigest(), 16) % PORT_SPAN
        return DistEnv(
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_STEP_NUM_TASKS") if "SLURM_STEP_NUM_TASKS" in env else _int(env, "SLURM_NTASKS"),
            _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            addr,
            port,
            "slurm",
            tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))),
            launch,
        )
    return DistEnv(0, 1, 0, "127.0.0.1", DEFAULT_PORT, "single", 1)


def choose_backend(
    requested: str, device: torch.device, local_world_size: int | None, gpus: int, gpus_per_task: int | None = None
) -> str:
    """The process-group backend for ``requested`` (auto, nccl or gloo): gloo on CPU; on CUDA, NCCL unless the
    ranks of a node outnumber its ``gpus`` (they then share devices, which NCCL refuses). Every rank of a job
    decides alike from the same facts; one line for a request that cannot work.

    ``gpus_per_task``: Slurm's ``SLURM_GPUS_PER_TASK`` (``--gpus-per-task``, which binds each task to its own GPUs):
    a task then sees only its own ``gpus``, so fewer of them than the node's ranks is no sharing."""
    if requested not in BACKENDS:
        raise ConfigError(f"unknown backend {requested!r}: choose {', '.join(BACKENDS)}")
    bound = gpus_per_task is not None and 0 < gpus_per_task <= gpus
    sharing = local_world_size is not None and local_world_size > gpus and not bound
    if device.type != "cuda":
        if requested == "nccl":
            raise ConfigError("--backend nccl needs CUDA devices and this process has none: use --backend gloo or auto")
        return "gloo"
    if requested == "nccl" and sharing:
        raise ConfigError(
            f"--backend nccl needs one GPU per rank: {local_world_size} ranks on this node share "
            f"{gpus} GPU(s); use --backend gloo (or auto), which runs several ranks on one GPU"
        )
    return "gloo" if requested == "gloo" or sharing else "nccl"


def default_device(local_rank: int) -> torch.device:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


DEEPSPEED_TIMEOUT_MIN = 30.0
"""Minutes a collective of a process group ``zerobench.zero.initialize`` creates may wait: DeepSpeed's default (its
``default_pg_timeout``), which DeepSpeed users widen with ``DEEPSPEED_TIMEOUT`` (minutes)."""


def deepspeed_timeout_s(environ=None) -> float:
    """Seconds: ``DEEPSPEED_TIMEOUT`` minutes, as DeepSpeed reads it, else 30 minutes; a bad value is one line."""
    raw = (os.environ if environ is None else environ).get("DEEPSPEED_TIMEOUT")
    if raw is None:
        return DEEPSPEED_TIMEOUT_MIN * 60
    try:
        minutes = float(raw)
    except ValueError:
        minutes = -1.0
    if not (minutes > 0 and math.isfinite(minutes)):
        raise ConfigError(f"DEEPSPEED_TIMEOUT={raw!r}: give the collective timeout in minutes, a finite number above 0")
    return minutes * 60


def init_distributed(denv: DistEnv, timeout_s: float = 300.0, backend: str = "auto") -> torch.device:
    """Initialise the default process group (``choose_backend``); return this rank's device (ranks beyond a
    node's GPU count share them round-robin). The rendezvous is bounded by ``timeout_s`` and a failed one is
    a one-line ``RendezvousError`` (``distributed/rendezvous.py``)."""
    import torch
    import torch.distributed as dist

    device = default_device(denv.local_rank)
    per_task = os.environ.get("SLURM_GPUS_PER_TASK", "")
    chosen = choose_backend(
        backend,
        device,
        denv.local_world_size,
        torch.cuda.device_count() if device.type == "cuda" else 0,
        int(per_task) if per_task.isdigit() else None,
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        store = connect_store(denv.rank, denv.world_size, denv.master_addr, denv.master_port, timeout_s, denv.launch_id)
        dist.init_process_group(
            chosen,
            store=store,
            rank=denv.rank,
            world_size=denv.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return device
