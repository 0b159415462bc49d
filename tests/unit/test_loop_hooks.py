"""The training loop's hooks: built from the run's settings (no environment reads), called in order."""

from __future__ import annotations

import pytest

from zerobench.launch.worker import rank_settings
from zerobench.train.config import TrainConfig
from zerobench.train.hooks import (
    ConsoleHook,
    LockstepHook,
    LoopHooks,
    PlantHook,
    Plants,
    RankSettings,
    StepRecord,
    build_hooks,
)


def test_rank_settings_come_from_the_given_environment_only():
    env = {
        "ZEROBENCH_FAULT": "1:3:raise",
        "ZEROBENCH_PLANT_DELAY": "0.1:2",
        "ZEROBENCH_PLANT_BUFFER": "4096",
        "ZEROBENCH_TURNSTILE": "/tmp/s.sock:a",
        "ZEROBENCH_TURNSTILE_TIMEOUT": "7",
    }
    s = rank_settings(env)
    assert s == RankSettings(Plants("1:3:raise", "0.1:2", 4096), "/tmp/s.sock:a", 7.0)
    assert rank_settings({}) == RankSettings()


def test_hooks_per_rank_and_their_order():
    cfg = TrainConfig(steps=3)
    lines: list[str] = []
    h0 = build_hooks(cfg, RankSettings(), 0, lines.append, "r", lambda: None)
    assert [type(h) for h in h0.hooks] == [PlantHook, ConsoleHook]
    h1 = build_hooks(cfg, RankSettings(), 1, lines.append, "r", lambda: None)
    assert [type(h) for h in h1.hooks] == [PlantHook]  # only rank 0 prints
    # Lockstep on a rank other than 0: no referee connection, only the barrier every rank takes.
    waits = []
    h2 = build_hooks(cfg, RankSettings(turnstile="/nowhere:a"), 1, lines.append, "r", lambda: waits.append(1))
    assert [type(h) for h in h2.hooks] == [PlantHook, LockstepHook]
    h2.before_step(0)
    assert waits == [1]
    h0.after_step(StepRecord(2, 1.5, 0.25, 0.001, stepped=False))
    assert lines == ["step    2/3  loss 1.5000  step    250.0 ms   0.0010 TFLOPs/GPU  (skipped: fp16 overflow)"]


def test_planted_fault_fires_on_its_rank_and_step_only():
    hooks = LoopHooks([PlantHook(Plants(fault="1:2:raise"), rank=1, stage=0)])
    hooks.before_step(1)
    build = LoopHooks([PlantHook(Plants(fault="1:2:raise"), rank=0, stage=0)])
    build.before_step(2)  # another rank: nothing
    with pytest.raises(RuntimeError, match="planted fault on rank 1 at step 2"):
        hooks.before_step(2)


def test_close_runs_in_reverse_order():
    seen = []

    class H(PlantHook):
        def __init__(self, n):
            super().__init__(Plants(), 0, 0)
            self.n = n

        def close(self):
            seen.append(self.n)

    LoopHooks([H(1), H(2), H(3)]).close()
    assert seen == [3, 2, 1]


def test_a_tensorboard_directory_holding_a_run_s_events_is_refused_in_one_line(tmp_path):
    """A second writer under the same run id adds a second event file, which TensorBoard draws as more steps of the
    same curves: the second run is refused before it writes, and the first run's events stay as they were."""
    from zerobench.config import ConfigError
    from zerobench.train.hooks import refuse_held_events

    refuse_held_events(str(tmp_path), "r1")  # nothing there yet
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "notes.txt").write_text("not an event file")
    refuse_held_events(str(tmp_path), "r1")
    held = tmp_path / "r1" / "events.out.tfevents.1.host.1.0"
    held.write_bytes(b"first run")
    with pytest.raises(ConfigError) as e:
        refuse_held_events(str(tmp_path), "r1")
    assert "\n" not in str(e.value) and f"{tmp_path / 'r1'} already holds the TensorBoard events of a run 'r1'" in str(
        e.value
    )
    assert held.read_bytes() == b"first run"
    refuse_held_events(str(tmp_path), "r2")  # another run id beside it is fine
