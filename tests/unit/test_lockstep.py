"""Lockstep A/B turns without training: the referee alternates sides, never hangs on a finished or
crashed side, and a client that gets no turn fails with one clear error."""

import threading
from pathlib import Path

import pytest

from zerobench.bench.ab import ABConfig
from zerobench.bench.lockstep import Referee
from zerobench.config import ConfigError
from zerobench.train.turnstile import Turnstile, TurnstileError, from_spec


class _Proc:
    """Stands in for a side's Popen: finished once ``done`` is set."""

    def __init__(self):
        self.done = threading.Event()

    def poll(self):
        return 0 if self.done.is_set() else None


def _side(ref: Referee, name: str, steps: int, log: list, proc: _Proc | None = None, timeout: float = 10):
    def body():
        t = Turnstile(ref.path, name, timeout)
        for _ in range(steps):
            t.acquire()
            log.append(name)
            t.release()
        t.close()
        if proc is not None:
            proc.done.set()

    th = threading.Thread(target=body)
    th.start()
    return th


def test_steps_alternate_starting_with_the_first_side():
    for first in ("baseline", "candidate"):
        log: list[str] = []
        with Referee(("baseline", "candidate"), first=first) as ref:
            ref.start()
            threads = [_side(ref, "candidate", 5, log), _side(ref, "baseline", 5, log)]
            for th in threads:
                th.join(timeout=20)
            assert ref.grants == {"baseline": 5, "candidate": 5}
        other = "candidate" if first == "baseline" else "baseline"
        assert log == [first, other] * 5


def test_a_finished_side_lets_the_other_step_freely():
    log: list[str] = []
    with Referee(("a", "b"), first="a") as ref:
        ref.start()
        pa = _Proc()
        ref.watch("a", pa)
        ta = _side(ref, "a", 2, log, proc=pa)
        tb = _side(ref, "b", 5, log)
        ta.join(timeout=20)
        tb.join(timeout=20)
        assert not tb.is_alive()
    assert log[:4] == ["a", "b", "a", "b"] and log[4:] == ["b", "b", "b"]


def test_a_side_that_dies_inside_its_turn_hands_the_turn_over():
    with Referee(("a", "b"), first="a") as ref:
        ref.start()
        dead = Turnstile(ref.path, "a", 5)
        dead.acquire()
        dead.close()  # crashed mid-step: no "done"
        alive = Turnstile(ref.path, "b", 5)
        alive.acquire()  # must not hang
        alive.release()
        alive.close()
        assert ref.grants == {"a": 1, "b": 1}


def test_no_turn_in_time_is_one_clear_error():
    with Referee(("a", "b"), first="a") as ref:  # "a" is alive (never finishes) and never asks
        ref.start()
        t = Turnstile(ref.path, "b", 0.5)
        with pytest.raises(TurnstileError, match="no lockstep turn from the A/B referee"):
            t.acquire()
        t.close()


def test_missing_referee_and_bad_spec(tmp_path, monkeypatch):
    with pytest.raises(TurnstileError, match="cannot reach the A/B referee"):
        Turnstile(str(tmp_path / "nobody.sock"), "a", 1)
    from zerobench.launch.worker import rank_settings

    monkeypatch.setenv("ZEROBENCH_TURNSTILE", "no-side-given")
    settings = rank_settings()  # the launcher's environment is read here, once
    with pytest.raises(TurnstileError, match="expected SOCKET_PATH:SIDE"):
        from_spec(settings.turnstile, settings.turnstile_timeout_s)
    monkeypatch.delenv("ZEROBENCH_TURNSTILE")
    assert rank_settings().turnstile is None and from_spec(rank_settings().turnstile) is None


def test_lockstep_config_is_validated(tmp_path):
    repo = str(Path(__file__).resolve().parents[2])
    with pytest.raises(ConfigError, match="choose one of --concurrent"):
        ABConfig(suite="x", baseline_tree=repo, candidate_tree=repo, concurrent=True, lockstep=True).validate()
    old = tmp_path / "old"
    (old / "zerobench" / "train").mkdir(parents=True)
    (old / "zerobench" / "__init__.py").write_text("")
    with pytest.raises(ConfigError, match="predates lockstep A/B"):
        ABConfig(suite="x", baseline_tree=str(old), candidate_tree=repo, lockstep=True).validate()
    assert ABConfig(suite="x", baseline_tree=repo, candidate_tree=repo, lockstep=True).compared == "step_time_s"
