"""Every command that starts ranks on this host refuses a world past the local launcher's limit in one line, before
it starts anything: only ``sweep`` did, and ``maxsize --dp 100000`` started that many processes and took the host
down, ``profile`` died on open files with a traceback, ``train`` and ``peers`` had no limit either. The values are
just over the limit, and any process start fails the test instead of happening."""

from __future__ import annotations

import multiprocessing.process
import subprocess

import pytest

from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.cli import main
from zerobench.config import ConfigError
from zerobench.launch.local import MAX_LOCAL_WORLD, check_local_world, launch_local

OVER = MAX_LOCAL_WORLD + 1


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    """A process started here would be the defect itself: fail instead of starting it."""

    def refuse(*a, **k):
        raise AssertionError("a process was started before the world was refused")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)


def _refused(capsys, needle: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and f"the local launcher runs at most {MAX_LOCAL_WORLD}" in err[0], err


def test_the_limit_itself_passes_and_one_more_is_one_line():
    check_local_world(MAX_LOCAL_WORLD, "--dp 16", "fix")
    with pytest.raises(ConfigError, match=rf"^--dp {OVER} needs {OVER} processes; .* at most 16: fix$"):
        check_local_world(OVER, f"--dp {OVER}", "fix")


def test_launch_local_refuses_before_starting_a_rank(tmp_path):
    cfg = to_train_config(RunSpec(preset="tiny", dp=OVER, steps=2, warmup=1))
    with pytest.raises(ConfigError, match=f"run 'r' needs {OVER} processes"):
        launch_local(cfg, tmp_path, "r")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--dp", str(OVER), "--steps", "2", "--warmup", "1"], f"--dp {OVER} needs {OVER} processes"),
        (["train", "--dp", "9", "--tp", "2", "--steps", "2", "--warmup", "1"], "--dp 9 x --tp 2 needs 18 processes"),
        (["maxsize", "--budget", "8MiB", "--stage", "1", "--dp", str(OVER)], f"--dp {OVER} needs {OVER} processes"),
        (["peers", "--systems", "torch-ddp", "--dp", str(OVER)], f"--dp {OVER} needs {OVER} processes"),
    ],
)
def test_commands_refuse_a_world_over_the_limit(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    _refused(capsys, needle)
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def _suite(tmp_path, dp: int):
    p = tmp_path / "big.yaml"
    p.write_text(
        f"name: big\nbase: {{preset: tiny, steps: 2, warmup: 1}}\nruns:\n- {{label: small}}\n- {{label: big, dp: {dp}}}\n"
    )
    return p


def test_profile_refuses_a_suite_over_the_limit(tmp_path, capsys):
    code = main(["profile", "--suite", str(_suite(tmp_path, OVER)), "--out", str(tmp_path / "prof"), "--device", "cpu"])
    assert code == 2
    _refused(capsys, f"zerobench profile: the suite's world of dp {OVER} x tp 1 needs {OVER} processes")
    assert not (tmp_path / "prof").exists()


def test_the_ab_gate_refuses_a_suite_over_the_limit_before_any_checkout(tmp_path, capsys):
    code = main(["regress", "--ab", str(_suite(tmp_path, OVER)), "--baseline-tree", ".", "--out", str(tmp_path / "ab")])
    assert code == 2
    _refused(capsys, f"run 'big' needs {OVER} processes")
