"""Max-model-size search: the most layers a configuration trains within a per-device memory budget.

Each probe is a fresh run of a few steps (fresh processes, so nothing leaks between probes) with the
budget enforced — on CPU by the live-tensor tracker, on GPU by a real CUDA OOM under
``set_per_process_memory_fraction``. Memory grows with layers, so the search doubles until a probe runs
out of memory, then bisects; from a guess (``start``, e.g. the memory planner's answer) it steps away from the
guess instead, so a right guess costs two probes. This is the paper's Fig 4 / Fig 6 experiment at small scale.

Each probe's rows (its status, peak allocated and reserved bytes) are kept beside its log
(``zerobench maxsize --probes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zerobench.bench.search import largest_fitting
from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.config import RunFailed
from zerobench.launch.base import write_status
from zerobench.launch.cancel import Cancellation, Cancelled
from zerobench.launch.local import launch_local
from zerobench.models.sizes import num_params


@dataclass
class MaxSizeResult:
    max_layers: int
    max_params: int
    probes: dict[int, str]
    """layers -> status of each probe (ok / oom)."""
    kernels: dict[str, str] | None = None
    """The paths the fitting probes' kernels took (their rows' ``kernels_ran``): ``auto`` takes the reference path
    where the fused kernels do not load, and its working memory is not the fused path's."""


PROBE_STEPS = 2
"""Steps each probe trains: a size must train on, not only take its first step. The first step leaves state that
lives from the second on (840 B for the tiny GPT at DP 1, where the tracked peak is the same in every run), and
later steps measured add nothing to the second's peak; a one-step probe called a size at that edge a fit that
then ran out of memory at step 2. With several ranks the overlap of their collectives moves a stage-3 peak by up
to kilobytes from run to run, so an answer at the edge can differ by a layer between searches. (Three steps were
tried once and reverted after a test whose budget sat at such an edge failed on CI.)"""


def _kernels_ran(probe_dir: Path) -> dict[str, str]:
    """The kernels' paths a probe's rows record (empty where they record none)."""
    from zerobench.results.rows import read_rows

    rows = read_rows(probe_dir / "rows.jsonl") if (probe_dir / "rows.jsonl").exists() else []
    return next((dict(r["kernels_ran"]) for r in rows if isinstance(r.get("kernels_ran"), dict)), {})


def _host_oom(reason: str | None) -> bool:
    """Whether an ``oom`` probe on a CPU host ran out of the host's memory (the allocator failed) rather than out of
    the emulated device budget (the tracker's refusal): only the latter is an answer of the search."""
    import torch

    return not torch.cuda.is_available() and "would exceed the budget" not in (reason or "")


def search_max_layers(
    spec: RunSpec,
    budget: str,
    limit: int = 256,
    steps: int = PROBE_STEPS,
    work_dir: Path | None = None,
    on_probe=None,
    start: int = 1,
    cancel: Cancellation | None = None,
) -> MaxSizeResult:
    """The most layers of ``spec`` that train within ``budget``, one fresh run per probe (module docstring).

    Probes run under ``work_dir`` (default a temporary directory, removed at the end unless a probe failed:
    its log is kept and named in the error). Raises ``RunFailed`` when a probe fails other than by running
    out of memory, and ``Cancelled`` on SIGTERM/SIGINT (``cancel``, default one held for this search): the
    probe's ranks are stopped and the search ends at once, where a cancelled probe would else read as a
    failure."""
    probes: dict[int, str] = {}
    ran: dict[str, str] = {}
    tmp = work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="zerobench-maxsize-")) if tmp else work_dir
    keep = not tmp

    def fits(layers: int) -> bool:
        nonlocal keep
        if cancel.requested:  # a signal between two probes
            raise Cancelled(f"cancelled ({cancel.requested}) before the probe with {layers} layers")
        cfg = to_train_config(dataclasses.replace(spec, layers=layers, steps=steps, warmup=0, memory_budget=budget))
        d = work_dir / f"probe-{layers}"
        d.mkdir(parents=True, exist_ok=True)
        # each probe's rows (status, peak allocated and reserved bytes) stay beside its log
        res = launch_local(cfg, d, f"maxsize-{layers}", timeout_s=spec.timeout, log_path=d / "run.log", cancel=cancel)
        if res.status == "cancelled":
            raise Cancelled(
                f"cancelled ({cancel.requested}) during the probe with {layers} layers"
                + (f" (its log: {d / 'run.log'})" if keep else "")
            )
        write_status(res, d, f"maxsize-{layers}", cfg)
        if res.status not in ("ok", "oom"):
            keep = True
            raise RunFailed(f"probe with {layers} layers failed ({res.reason}); see {d / 'run.log'}")
        if res.status == "oom" and _host_oom(res.reason):
            keep = True
            raise RunFailed(
                f"probe with {layers} layers ran out of this host's memory, not of the "
                f"{spec.memory_budget or 'device'} budget ({res.reason}): its answer would be the host's limit; free memory or lower the budget; see "
                f"{d / 'run.log'}"
            )
        probes[layers] = res.status
        if res.ok:
            ran.update(_kernels_ran(d))
        if on_probe is not None:
            on_probe(layers, res.status)
        return res.ok

    try:
        with contextlib.ExitStack() as stack:
            cancel = cancel if cancel is not None else stack.enter_context(Cancellation())
            lo = largest_fitting(fits, limit, start)
        if lo == 0:
            return MaxSizeResult(0, 0, probes)
        model = dataclasses.replace(to_train_config(spec).model, layers=lo)
        return MaxSizeResult(lo, num_params(model), probes, ran or None)
    finally:
        if not keep:
            shutil.rmtree(work_dir, ignore_errors=True)
