"""Entry point of one launched rank: ``python -m zerobench.launch.worker CONFIG.json RUN_ID [OUT_DIR [SUITE]]``.

The composition root of a rank: it resolves the run's system from ``zerobench.systems`` and hands the
entry to the training loop.

``run_rank`` is also how ``zerobench train`` trains in its own process (one process, or one rank under
torchrun / srun): a bad configuration or running out of memory ends in one line and an exit code the
launcher understands, never a traceback, and the process group is torn down on every path.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench.config import ConfigError, RunFailed, from_dict
from zerobench.distributed.env import DistEnv, detect
from zerobench.launch.base import EXIT_CONFIG, EXIT_IO, EXIT_OOM, EXIT_PEER_TIMEOUT
from zerobench.launch.cancel import die_with_parent
from zerobench.metrics.memory import TrackedOutOfMemory
from zerobench.metrics.rss import ENV as RSS_BREAKDOWN_ENV
from zerobench.results.rows import RowWriteError, RowWriter
from zerobench.systems import validate_run
from zerobench.train import faults, turnstile
from zerobench.train.config import TrainConfig
from zerobench.train.hooks import Plants, RankSettings
from zerobench.train.loop import train
from zerobench.train.turnstile import TurnstileError


def main(argv: list[str]) -> int:
    launcher = os.environ.get("ZEROBENCH_LAUNCHER_PID")
    die_with_parent(int(launcher) if launcher else None)
    cfg_path, run_id = argv[0], argv[1]
    with open(cfg_path) as f:
        data = json.load(f)
    return run(data, run_id, argv[2] if len(argv) > 2 else None, argv[3] if len(argv) > 3 else None)


def rank_settings(environ=None) -> RankSettings:
    """The launcher's requests to this rank (A/B turns, test-only plantings): the one place in zerobench
    that reads them from the environment."""
    env = os.environ if environ is None else environ
    plants = Plants(fault=env.get(faults.FAULT_ENV), delay=env.get(faults.DELAY_ENV),
                    buffer_bytes=int(env.get(faults.BUFFER_ENV, "0")))
    return RankSettings(plants, env.get(turnstile.ENV), float(env.get(turnstile.TIMEOUT_ENV, "600")),
                        native_collectives=env.get("ZEROBENCH_GLOO_NATIVE") == "1",
                        rss_breakdown=env.get(RSS_BREAKDOWN_ENV) == "1")


def run(config: dict, run_id: str, out_dir: str | None, suite: str | None) -> int:
    """Train one rank of the run described by ``config`` (a resolved ``TrainConfig`` as plain data).

    The launcher that started this rank records the run's status from the exit code."""
    return run_rank(from_dict(TrainConfig, config), detect(), out_dir, run_id, suite=suite, record_failure=False)


def run_rank(cfg: TrainConfig, denv: DistEnv, out_dir: str | Path | None, run_id: str,
             suite: str | None = None, record_failure: bool = True) -> int:
    """Train this rank; return 0, ``EXIT_CONFIG``, ``EXIT_OOM``, ``EXIT_IO`` (results not written),
    ``EXIT_PEER_TIMEOUT`` (a collective timed out: a peer is stuck) or 1 (a run failure).

    With ``record_failure`` (no launcher above this process to do it) an out-of-memory end is also
    written to the run's rows as a ``run_status`` row with status ``oom``, so a probe that did not fit is
    a result, not a missing run; and a ``RunFailed`` (a run that could not go on) as one with status ``failed``."""
    t0 = time.monotonic()
    try:
        system = validate_run(cfg, denv.world_size)
        train(cfg, denv, system, out_dir, run_id, suite=suite, settings=rank_settings())
    except ConfigError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except RowWriteError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return EXIT_IO
    except TurnstileError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 1
    except RunFailed as e:  # e.g. an fp16 overflow at the minimum loss scale (zero/loss_scale.py)
        return _failed(e, cfg, denv, out_dir, run_id, suite, record_failure, t0)
    except (TrackedOutOfMemory, torch.OutOfMemoryError) as e:
        return _oom(e, cfg, denv, out_dir, run_id, suite, record_failure, t0)
    except (RuntimeError, MemoryError) as e:
        kind = classify(e)
        if kind is None:
            raise
        if kind == "timeout":
            print(f"zerobench: error: rank {denv.rank} timed out in a collective after "
                  f"{cfg.collective_timeout_s:.0f}s: a peer rank is stuck or dead ({_first_line(e)})", file=sys.stderr)
            return EXIT_PEER_TIMEOUT
        return _oom(e, cfg, denv, out_dir, run_id, suite, record_failure, t0)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


_OOM_TEXT = ("DefaultCPUAllocator", "can't allocate memory", "not enough memory", "Cannot allocate memory")
_TIMEOUT_TEXT = ("timed out", "timeout")


def classify(e: BaseException) -> str | None:
    """``oom`` for a host allocator failure, ``timeout`` for a collective or rendezvous timeout, else None."""
    if isinstance(e, MemoryError):
        return "oom"
    text = str(e)
    if any(t in text for t in _OOM_TEXT):
        return "oom"
    if any(t in text.lower() for t in _TIMEOUT_TEXT):
        return "timeout"
    return None


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


def _failed(e: RunFailed, cfg, denv, out_dir, run_id, suite, record_failure, t0) -> int:
    """A valid run that could not go on: its one line, exit 1; with ``record_failure`` a ``failed`` status row
    with that line as its reason (a launcher above this rank writes its own from the line)."""
    print(f"zerobench: error: {e}", file=sys.stderr)
    if record_failure and out_dir is not None:
        RowWriter(out_dir, run_id, cfg, suite=suite).write(
            "run_status", 0, "bool", status="failed", reason=str(e), rank=denv.rank,
            elapsed_s=round(time.monotonic() - t0, 3))
    return 1


def _oom(e, cfg, denv, out_dir, run_id, suite, record_failure, t0) -> int:
    """Out of (device, budgeted or host) memory: one line, exit ``EXIT_OOM``; with ``record_failure`` an
    ``oom`` status row too."""
    reason = f"rank {denv.rank} ran out of memory: {_first_line(e)}"
    print(f"zerobench: {reason}", file=sys.stderr)
    if record_failure and out_dir is not None:
        RowWriter(out_dir, run_id, cfg, suite=suite).write(
            "run_status", 0, "bool", status="oom", reason=reason, rank=denv.rank,
            elapsed_s=round(time.monotonic() - t0, 3))
    return EXIT_OOM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
