"""Provenance stored with every result row: code version (the commit, its first parent and its time: a history of
results orders commits by them), hardware, software versions, time. torch is imported
only when a row is written, so reading rows (reports, gates, the simulator's refusals) does not load it."""

from __future__ import annotations

import datetime
import functools
import hashlib
import platform
import socket
import subprocess
from pathlib import Path

import zerobench

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _torch_build() -> dict:
    """torch's build facts (``__version__``; ``cuda``, ``hip``, ``xpu``: None where not built for them), read from
    its ``version.py`` without importing torch: a sweep's parent process writes rows but runs no tensor, and
    importing torch costs it seconds (an A/B round starts two of them)."""
    import importlib.util
    import runpy

    spec = importlib.util.find_spec("torch")
    return runpy.run_path(str(Path(spec.origin).parent / "version.py"))


def _unimported_torch_build() -> dict | None:
    """``_torch_build()`` where torch is not imported yet and its ``version.py`` reads; else None (ask torch)."""
    import sys

    if "torch" in sys.modules:
        return None
    try:
        return _torch_build()
    except (ImportError, OSError, AttributeError, TypeError, SyntaxError):
        return None


def _torch_version() -> str:
    build = _unimported_torch_build()
    if build is not None and "__version__" in build:
        return str(build["__version__"])
    import torch

    return torch.__version__


@functools.lru_cache(maxsize=1)
def hardware() -> dict:
    """Accelerator (name and count) or CPU model, with a short class used to key baselines."""
    build = _unimported_torch_build()
    if build is not None and all(build.get(k) is None for k in ("cuda", "hip", "xpu")):  # a CPU wheel
        return _cpu_hardware()
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return {
            "kind": "gpu",
            "device": name,
            "count": torch.cuda.device_count(),
            "class": name.replace(" ", "-").lower(),
        }
    return _cpu_hardware()


def _cpu_hardware() -> dict:
    import os

    cores = os.cpu_count() or 1
    return {"kind": "cpu", "device": cpu_model(), "count": cores, "class": f"cpu-{cores}core"}


@functools.lru_cache(maxsize=1)
def _static() -> dict:
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit,
        "parent": _git("rev-parse", "--verify", "--quiet", "HEAD^") or None,  # the first parent; None at a root
        "commit_time": _git("show", "-s", "--format=%cI", "HEAD") or None,
        "dirty": bool(status) if status is not None else None,
        "dirty_diff": _diff_hash() if status else None,
        "host": socket.gethostname(),
        "hardware": hardware(),
        "torch_version": _torch_version(),
        "zerobench_version": zerobench.__version__,
        "python_version": platform.python_version(),
    }


def _diff_hash() -> str | None:
    """A short hash of the tracked files' uncommitted changes (``git diff HEAD``): two runs of a dirty tree at one
    commit are the same code only where it is equal."""
    diff = _git("diff", "HEAD", "--binary")
    return None if diff is None else hashlib.sha256(diff.encode()).hexdigest()[:12]


def source_commit() -> str | None:
    """The commit this checkout is at (None outside a git checkout)."""
    return _static()["commit"]


def source_version() -> str | None:
    """This checkout's code: its commit, and with uncommitted changes to tracked files ``+<hash of the diff>``
    (``code_version`` of a row's provenance is the same); None outside a git checkout."""
    return code_version(_static())


def code_version(prov: dict | None) -> str | None:
    """The code a row's provenance was measured with: ``commit``, or ``commit+<diff hash>`` for a dirty tree
    (``commit+dirty`` where its rows predate the diff's hash: edits unknown)."""
    if not isinstance(prov, dict) or not prov.get("commit"):
        return None
    if not prov.get("dirty"):
        return str(prov["commit"])
    return f"{prov['commit']}+{prov.get('dirty_diff') or 'dirty'}"


def describe_version(version, width: int = 12) -> str:
    """A ``code_version`` in words: ``commit[:width]``, and ``with uncommitted changes (<diff hash>)`` where there
    are (messages)."""
    commit, _, diff = str(version).partition("+")
    return commit[:width] + (f" with uncommitted changes ({diff})" if diff else "")


def short_version(version, width: int = 12) -> str:
    """A ``code_version`` in short: ``commit[:width]``, and ``+<diff hash>[:width]`` where there are changes
    (labels, file names)."""
    commit, plus, diff = str(version).partition("+")
    return commit[:width] + plus + diff[:width]


def slurm() -> dict | None:
    """The Slurm job this process runs in (job id, node list, cluster, step), if any."""
    import os

    if "SLURM_JOB_ID" not in os.environ:
        return None
    keys = {
        "job_id": "SLURM_JOB_ID",
        "nodelist": "SLURM_JOB_NODELIST",
        "nnodes": "SLURM_JOB_NUM_NODES",
        "cluster": "SLURM_CLUSTER_NAME",
        "step_id": "SLURM_STEP_ID",
        "partition": "SLURM_JOB_PARTITION",
    }
    return {k: os.environ.get(v) for k, v in keys.items()}


def provenance() -> dict:
    return {
        **_static(),
        "slurm": slurm(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
