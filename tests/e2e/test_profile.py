"""``zerobench train --profile``: torch.profiler traces of a run's last steps, per rank, left out of the medians.

The hook alone is driven here as the loop drives it (one ``after_step`` per step): which steps it traced is
read back from the trace's own step markers. A two-rank stage-3 run checks the files every rank writes, that the
rows' medians leave the traced steps out, and that profiling moves no config hash (the regression gate and
``--resume`` key on it). Bad settings are one line.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.e2e.test_cli_train import rows, zb
from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.config import ConfigError
from zerobench.results.rows import run_hash
from zerobench.train.config import ProfileConfig
from zerobench.train.profiling import ProfilerHook
from zerobench.zero.interop.tooling import labelled


def _traced_steps(trace_path) -> list[int]:
    """The profiler's step numbers (0-based, ``ProfilerStep#N``) that the trace holds."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    return sorted({int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))})


def test_the_hook_traces_the_last_steps_and_writes_when_they_end(tmp_path):
    said: list[str] = []
    hook = ProfilerHook(
        ProfileConfig(str(tmp_path), steps=2),
        total_steps=6,
        run_id="r",
        rank=3,
        device=torch.device("cpu"),
        say=said.append,
    )
    a = torch.randn(64, 64)
    for step in range(6):
        hook.before_step(step)
        (a @ a).sum()
        hook.after_compute(step, 0.0)
        hook.after_step(None)
        assert (tmp_path / "r" / "rank3.trace.json").exists() == (step == 5), step
    hook.close()
    assert _traced_steps(tmp_path / "r" / "rank3.trace.json") == [4, 5]
    table = (tmp_path / "r" / "rank3.ops.txt").read_text()
    assert table.startswith("zerobench train: steps 5-6 traced on rank 3") and "aten::mm" in table
    assert said == [
        (
            f"profile of steps 5-6: {tmp_path / 'r' / 'rank3.trace.json'} (Perfetto or chrome://tracing) "
            "and rank3.ops.txt beside it"
        )
    ]


def test_a_run_never_overwrites_another_run_s_traces(tmp_path):
    """Two sweeps with one suite's ``profile:`` directory: the second's runs (same run ids) rewrote the first's
    traces and both exited 0. A run whose trace directory holds traces is refused before it writes anything."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "rank0.trace.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"already holds the traces of a run 'r' \(rank0\.trace\.json\)"):
        ProfilerHook(ProfileConfig(str(tmp_path), steps=2), 6, "r", 1, torch.device("cpu"), print)
    assert (tmp_path / "r" / "rank0.trace.json").read_text() == "{}"


def test_profiling_moves_no_config_hash():
    plain = to_train_config(RunSpec(steps=6, warmup=1))
    traced = to_train_config(RunSpec(steps=6, warmup=1, profile="/somewhere", profile_steps=3))
    assert traced.profile == ProfileConfig("/somewhere", 3) and plain.profile is None
    assert run_hash(traced) == run_hash(plain)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            RunSpec(steps=4, warmup=1, profile="d", profile_steps=3),
            (
                "--profile-steps 3 leaves no timed step of 4 after 1 warm-up (the traced steps are left out of the medians): "
                "give --steps 5 or more"
            ),
        ),
        (RunSpec(steps=4, warmup=1, profile="d", profile_steps=0), "profile_steps must be a positive integer, got 0"),
    ],
)
def test_bad_profile_settings_are_one_line(spec, message):
    with pytest.raises(ConfigError) as e:
        to_train_config(spec)
    assert str(e.value) == message


def test_profile_steps_without_a_directory_is_one_line(tmp_path):
    r = zb("train", "--preset", "tiny", "--steps", "5", "--profile-steps", "2", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and r.stderr.strip().endswith("--profile-steps needs --profile DIR (where the traces go)")
    assert not (tmp_path / "x").exists()


@pytest.mark.dist
def test_every_rank_traces_and_the_medians_leave_the_traced_steps_out(tmp_path):
    prof, out = tmp_path / "prof", tmp_path / "run"
    r = zb(
        "train",
        "--preset",
        "tiny",
        "--dp",
        "2",
        "--stage",
        "3",
        "--steps",
        "6",
        "--warmup",
        "1",
        "--profile",
        str(prof),
        "--profile-steps",
        "2",
        "--no-track-memory",
        "--run-id",
        "p",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert _traced_steps(prof / "p" / f"rank{rank}.trace.json") == [4, 5]
        assert "aten::mm" in (prof / "p" / f"rank{rank}.ops.txt").read_text()
        names = {e.get("name") for e in json.loads((prof / "p" / f"rank{rank}.trace.json").read_text())["traceEvents"]}
        assert {
            f"zerobench::{hook} (unit {i})"
            for hook in ("pre_forward", "post_forward", "pre_backward")
            for i in (0, 1, 2)
        } <= names  # stage 3's hooks by name, the root (0) and both blocks
    got = rows(out)
    losses = [x for x in got if x["metric"] == "loss"]
    timing = next(x for x in got if x["metric"] == "step_time_s")
    assert len(losses) == 6 and timing["n"] == 3 and len(timing["samples"]) == 3
    assert timing["aggregate"] == "median of 3 steps after 1 warm-up, the last 2 (traced by the profiler) left out"
    assert timing["config"]["profile"] == {"dir": str(prof), "steps": 2}


def test_a_hook_label_is_a_record_function_only_under_a_profiler(monkeypatch):
    class Hooks:
        @labelled("zerobench::pre_forward")
        def pre(self, i, x):
            return x + i

    with torch.profiler.profile() as p:
        assert Hooks().pre(2, 1) == 3
    assert "zerobench::pre_forward (unit 2)" in {e.key for e in p.key_averages()}

    def refuse(name):
        raise AssertionError(f"record_function({name!r}) without a profiler")

    monkeypatch.setattr(torch.profiler, "record_function", refuse)
    assert Hooks().pre(1, 1) == 2
