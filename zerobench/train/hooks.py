"""What the training loop calls around each step, as explicit hooks: the loop itself only trains and times.

- ``Plants``: test-only fault and regression planting (a failing rank, an exact slowdown of the step or of
  its host work, an extra buffer) — parsed once by the launcher's rank entry point (``launch/worker.py``), never read from the
  environment here;
- ``LockstepHook``: interleaved A/B turns (``train/turnstile.py``) around the timed region;
- ``ConsoleHook``: rank 0's per-step line; ``TensorBoardHook``: per-step scalars;
- ``ProfilerHook`` (``train/profiling.py``): torch.profiler traces of the last steps.

``LoopHooks`` holds them in the order they run; ``before_step`` runs before the clock starts,
``after_phase`` at the end of each phase of the step inside its measures (``train/probes.py``),
``after_compute`` inside the timed region, ``after_step`` once the step's figures are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from zerobench.config import ConfigError
from zerobench.train import faults
from zerobench.train.turnstile import Turnstile, from_spec


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as the hooks see it."""

    step: int
    """1-based step number."""
    loss: float
    """Mean loss over the global batch."""
    seconds: float
    """Wall-clock step time."""
    tflops: float
    """Model TFLOPs per GPU of this step."""
    stepped: bool
    """False when the step was skipped (fp16 overflow)."""


class StepHook(Protocol):
    def before_step(self, step: int) -> None: ...
    def after_phase(self, phase: str, cpu_seconds: float, meter=None) -> None: ...
    def after_compute(self, step: int, seconds: float) -> None: ...
    def after_step(self, rec: StepRecord) -> None: ...
    def close(self) -> None: ...


class _Hook:
    """No-op defaults."""

    def before_step(self, step: int) -> None:
        pass

    def after_phase(self, phase: str, cpu_seconds: float, meter=None) -> None:
        pass

    def after_compute(self, step: int, seconds: float) -> None:
        pass

    def after_step(self, rec: StepRecord) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Plants:
    """Test-only plantings; the defaults plant nothing."""

    fault: str | None = None
    """``RANK:STEP[:exit|raise|oom|stop|enospc|nospace|exit0]``: that rank fails at the start of that step."""
    delay: str | None = None
    """``FRACTION[:STAGE]``: spend FRACTION x each step's time (only at ZeRO stage STAGE when given)."""
    buffer_bytes: int = 0
    """Hold an extra buffer of this many bytes during training."""
    cpu: str | None = None
    """``FRACTION[:STAGE]``: spend FRACTION x each phase's CPU time more CPU time in that phase (only at ZeRO
    stage STAGE when given): a host-work slowdown, invisible to the Python-call and operator counts."""


class PlantHook(_Hook):
    def __init__(self, plants: Plants, rank: int, stage: int):
        self.plants, self.rank, self.stage = plants, rank, stage

    def before_step(self, step: int) -> None:
        faults.maybe_fail(self.plants.fault, self.rank, step)

    def after_phase(self, phase: str, cpu_seconds: float, meter=None) -> None:
        faults.planted_cpu(self.plants.cpu, self.stage, cpu_seconds, meter)

    def after_compute(self, step: int, seconds: float) -> None:
        faults.planted_delay(self.plants.delay, self.stage, seconds)


class LockstepHook(_Hook):
    """Rank 0 takes a turn from the A/B referee around each timed step; every rank waits at a barrier."""

    def __init__(self, turn: Turnstile | None, barrier):
        self.turn, self.barrier = turn, barrier

    def before_step(self, step: int) -> None:
        if self.turn is not None:
            self.turn.acquire()
        self.barrier()

    def after_step(self, rec: StepRecord) -> None:
        if self.turn is not None:
            self.turn.release()

    def close(self) -> None:
        if self.turn is not None:
            self.turn.close()


class ConsoleHook(_Hook):
    def __init__(self, say, steps: int):
        self.say, self.steps = say, steps

    def after_step(self, rec: StepRecord) -> None:
        self.say(
            f"step {rec.step:4d}/{self.steps}  loss {rec.loss:.4f}  step {rec.seconds * 1e3:8.1f} ms  "
            f"{rec.tflops:7.4f} TFLOPs/GPU" + ("" if rec.stepped else "  (skipped: fp16 overflow)")
        )


def refuse_held_events(directory: str, run_id: str) -> None:
    """Refuse (``ConfigError``) where ``directory/run_id`` already holds TensorBoard event files: a second writer
    there adds a second event file, and TensorBoard draws both runs' steps as one run's curves, with nothing to
    tell them apart. A run id reused with the same ``--tensorboard`` directory is the usual cause."""
    held = Path(directory) / run_id
    if any(held.glob("events.out.tfevents.*")):
        raise ConfigError(
            f"--tensorboard {directory}: {held} already holds the TensorBoard events of a run {run_id!r} "
            "(TensorBoard would draw the two as one): give another --run-id or another --tensorboard directory"
        )


class TensorBoardHook(_Hook):
    """Per-step scalars under ``directory/run_id``, written by rank 0 alone; a directory that already holds a
    run's events is refused (``refuse_held_events``)."""

    def __init__(self, directory: str, run_id: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--tensorboard needs the tensorboard package: pip install 'zerobench[tensorboard]'"
            ) from None
        refuse_held_events(directory, run_id)
        self.writer = SummaryWriter(str(Path(directory) / run_id))

    def after_step(self, rec: StepRecord) -> None:
        self.writer.add_scalar("loss", rec.loss, rec.step)
        self.writer.add_scalar("step_time_s", rec.seconds, rec.step)
        self.writer.add_scalar("tflops_per_gpu", rec.tflops, rec.step)

    def close(self) -> None:
        self.writer.close()


@dataclass
class LoopHooks:
    """The hooks of one run, called in order (``close`` in reverse)."""

    hooks: list[StepHook] = field(default_factory=list)
    extra_buffer_bytes: int = 0
    """Bytes of a planted extra buffer the loop holds (``Plants.buffer_bytes``)."""

    def before_step(self, step: int) -> None:
        for h in self.hooks:
            h.before_step(step)

    def after_phase(self, phase: str, cpu_seconds: float, meter=None) -> None:
        """``meter``: in the counted step under callgrind, how to add instructions to the phase
        (``train/probes.py``)."""
        for h in self.hooks:
            h.after_phase(phase, cpu_seconds, meter)

    def after_compute(self, step: int, seconds: float) -> None:
        for h in self.hooks:
            h.after_compute(step, seconds)

    def after_step(self, rec: StepRecord) -> None:
        for h in self.hooks:
            h.after_step(rec)

    def close(self) -> None:
        for h in reversed(self.hooks):
            h.close()


@dataclass(frozen=True)
class RankSettings:
    """What the launcher's environment asks of this rank, parsed once by ``launch/worker.py``."""

    plants: Plants = field(default_factory=Plants)
    """Test-only fault and regression planting."""
    turnstile: str | None = None
    """``SOCKET_PATH:SIDE`` of the A/B referee: take lockstep turns (every rank sees the same value)."""
    turnstile_timeout_s: float = 600.0
    """A turn not granted within this many seconds fails the run."""
    native_collectives: bool = False
    """Keep gloo's own reduce-scatter/all-gather (``ZEROBENCH_GLOO_NATIVE=1``; see distributed/collectives.py)."""
    callgrind: str | None = None
    """The directory for callgrind's dumps when this rank runs under callgrind (``ZEROBENCH_CALLGRIND``, set by
    the local launcher for ``zerobench sweep --instructions``): count the counted step's instructions."""
    rss_breakdown: bool = False
    """CPU runs that track memory: also break the peak RSS down by category (``ZEROBENCH_RSS_BREAKDOWN=1``;
    ``metrics/rss.py``); a measuring run's setting, it reads /proc after every operator."""


def build_hooks(cfg, settings: RankSettings, rank: int, say, run_id: str, barrier, device=None) -> LoopHooks:
    """The hooks of one run on this rank: plants, lockstep turns, console (rank 0), TensorBoard (rank 0), the
    profiler (``cfg.profile``; ``device`` is the rank's, default CPU)."""
    hooks: list[StepHook] = [PlantHook(settings.plants, rank, cfg.zero.stage)]
    if settings.turnstile:
        turn = from_spec(settings.turnstile, settings.turnstile_timeout_s) if rank == 0 else None
        hooks.append(LockstepHook(turn, barrier))
    if rank == 0:
        hooks.append(ConsoleHook(say, cfg.steps))
        if cfg.tensorboard_dir:
            hooks.append(TensorBoardHook(cfg.tensorboard_dir, run_id))
    if cfg.profile is not None:
        import torch

        from zerobench.train.profiling import ProfilerHook

        hooks.append(ProfilerHook(cfg.profile, cfg.steps, run_id, rank, device or torch.device("cpu"), say))
    return LoopHooks(hooks, settings.plants.buffer_bytes)
