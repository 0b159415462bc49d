"""Where an A/B comparison's sides come from and where they run: a git ref checked out into a temporary worktree
(the baseline code), and the CPUs both sides are pinned to."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from zerobench.config import ConfigError


def parse_cpus(spec: str) -> tuple[int, ...]:
    """``"1"``, ``"0,2"``, ``"2-3"`` -> CPU ids (taskset's list syntax)."""
    out: list[int] = []
    try:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise ConfigError(f"--cpus {spec!r}: expected CPU ids like 1, 0,2 or 2-3") from None
    if not out:
        raise ConfigError(f"--cpus {spec!r}: no CPUs named")
    return tuple(sorted(set(out)))


@contextlib.contextmanager
def worktree(ref: str, repo: str | Path = "."):
    """A temporary detached git worktree of ``ref`` (removed afterwards). A ref starting with ``-`` is refused:
    git would read it as an option (``--baseline-ref=-q`` checked out HEAD as the baseline)."""
    if not ref or ref.startswith("-"):
        raise ConfigError(f"--baseline-ref {ref!r}: give a commit, branch or tag (a ref never starts with '-')")
    tmp = tempfile.mkdtemp(prefix="zerobench-ab-")
    tree = os.path.join(tmp, "tree")
    try:  # from the checkout on: a failure or a signal (Cancelled) at any point unregisters and removes it
        r = subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", tree, ref],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode:
            raise ConfigError(
                f"cannot check out {ref!r} as the baseline: {(r.stderr.strip().splitlines() or ['git failed'])[-1]}"
            )
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", tree], capture_output=True, check=False
        )
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
