"""The paper's runs as the simulator takes them: suite rows resolved as a sweep resolves them, replayed on a stated
profile, and read in either FLOP convention. Shared by the paper's configured figures (``zerobench.sim.paper``) and
the statements whose run it leaves open (``zerobench.sim.paper_open``)."""

from __future__ import annotations

from zerobench.sim.gpu_costs import StatedProfile

CONVENTIONS = {
    "hardware": ("hw_tflops_per_gpu", "hw_pflops_aggregate"),
    "model": ("tflops_per_gpu", "pflops_aggregate"),
}
"""Convention -> the simulation's (TFLOP/s per GPU, aggregate PFLOP/s) keys: with and without the recompute."""


def spec(run: dict):
    """A suite row (or anchor) as the ``RunSpec`` a sweep would run (informational keys dropped)."""
    from zerobench.bench.spec import FIELDS, RunSpec

    return RunSpec(**{k: v for k, v in run.items() if k in FIELDS})


def train_config(run: dict):
    """A suite row (or anchor) resolved as a sweep resolves it (planner mode: the system not checked)."""
    from zerobench.bench.spec import to_train_config

    return to_train_config(spec(run), check_system=False)


def replay(run: dict, prof: StatedProfile) -> dict:
    """``run`` simulated on ``prof``: the simulation's figures without its timeline."""
    from zerobench.sim.simulate import simulate

    r = simulate(train_config(run), prof)
    r.pop("timeline")
    return r


def value(sim: dict, kind: str, convention: str) -> float:
    """A simulation's TFLOP/s per GPU (``kind`` ``tflops``) or aggregate PFLOP/s, read in ``convention``."""
    tflops, pflops = CONVENTIONS[convention]
    return sim[tflops if kind == "tflops" else pflops]


def suite_rows(suite: str) -> list[dict]:
    """A suite's runs, each merged over the suite's base."""
    from zerobench.plan.suites import load_suite

    s = load_suite(suite)
    return [{**s.get("base", {}), **r} for r in s["runs"]]


def largest_batch(run: dict, mem_bytes: float) -> int:
    """The largest micro-batch the memory planner fits for ``run`` (0 if none)."""
    from zerobench.bench.search import largest_fitting
    from zerobench.plan.memory_model import memory_per_gpu
    from zerobench.plan.suites import plan_config

    def fits(b: int) -> bool:
        return bool(memory_per_gpu(plan_config(spec({**run, "micro_batch": b}), 16, mem_bytes))["fits"])

    return largest_fitting(fits, 4096)
