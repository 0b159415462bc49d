"""Session-wide test setup: Triton kernels run under the interpreter when there is no CUDA device, and a test
session that leaves new or changed files in the repository fails.

``TRITON_INTERPRET`` must be set before triton is first imported, hence here (the root conftest is
imported before any test module). The repository check compares ``git status`` before and after the session: a
test writes under ``tmp_path``, never beside a committed file (a regression gate's proposed baseline once landed in
``results/baselines/`` and was committed).
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


def _worktree() -> set[str] | None:
    """``git status`` lines of the repository (untracked files included), None outside a git checkout."""
    try:
        r = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(r.stdout.splitlines()) if r.returncode == 0 else None


def pytest_sessionstart(session):
    session.config.stash_worktree = _worktree()


def pytest_sessionfinish(session, exitstatus):
    before, after = getattr(session.config, "stash_worktree", None), _worktree()
    if before is None or after is None or not (new := sorted(after - before)):
        return
    say = session.config.pluginmanager.get_plugin("terminalreporter")
    say = say.write_line if say is not None else print
    say("")
    say(f"the test session left {len(new)} new or changed files in the repository (write under tmp_path):")
    for line in new[:20]:
        say(f"  {line}")
    session.exitstatus = 1


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    """A test that leaves a real process group initialised in the test process fails, and the group is destroyed.

    The next test in the same worker inherits it otherwise: ``zerobench.zero.initialize`` (as DeepSpeed's) makes a
    process without one a world of one, and the simulator's layout refuses to build its fake world beside a real
    one. Which test ran next depended on how xdist spread the files, so the failure moved with unrelated changes."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() != "fake":
        dist.destroy_process_group()
        pytest.fail("the test left a process group initialised: destroy it (torch.distributed.destroy_process_group)")
