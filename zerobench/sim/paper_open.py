"""The paper's throughput statements whose run its artifact appendix does not configure, simulated over what the
sources leave open.

- **Turing-NLG** (§10.6): 17B parameters trained at 41.4 TFLOP/s per GPU. The shape and cluster are Microsoft's
  announcement of the model (78 layers, hidden 4256, 28 heads, MP 4 on 256 DGX-2 GPUs); the ZeRO stage is DeepSpeed's
  README of that release (ZeRO stage 1, the paper's P_os). The micro-batch is stated nowhere, so the run is simulated
  at every micro-batch from 1 to the largest the memory planner fits on the card.
- **Megatron-LM "near 30" TFLOP/s per GPU within a node** (§I of the SC20 text). Which run is not said; every Fig 2
  baseline whose MP fits inside one node is a candidate.

Each candidate is a figure beside the statement, never a claim of the bar on the paper's claims: the statement's run
is not known, so no single candidate is the claim's. What is reported is every candidate's error and the span that
lands within 15%, so a reader sees what the model says of every run the statement could be about.
"""

from __future__ import annotations

import dataclasses

from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.paper_runs import largest_batch, replay, suite_rows, value

WITHIN = 0.15
"""The tolerance of issue 59's point claims, applied to each candidate."""


@dataclasses.dataclass(frozen=True)
class OpenStatement:
    """A throughput the paper states for a run it does not configure."""

    what: str
    paper: float
    bound: str
    source: str
    left_open: str
    """What no source states about the run, and so what the candidates range over."""


TURING_NLG = OpenStatement(
    "Turing-NLG 17B on 256 V100 (MP 4, ZeRO stage 1)",
    41.4,
    "",
    "paper §10.6; shape and cluster: Microsoft's Turing-NLG announcement (Feb 2020); stage: DeepSpeed's README then",
    "micro-batch",
)
TURING_NLG_RUN = dict(layers=78, hidden=4256, heads=28, gpus=256, tp=4, system="zerobench", stage=1)
"""Laid over the paper's Fig 2 base, which no source states for this run (assumed: seq 1024, the GPT-2 vocabulary,
fp16, activation checkpointing, C_B 5e8 + M_D, no P_a)."""

MEGATRON_IN_NODE = OpenStatement(
    "Megatron-LM within a node",
    30.0,
    "near",
    "paper §I (SC20 text)",
    "which run: every Fig 2 baseline whose MP fits in one node",
)


def _candidate(label: str, sim: dict, paper: float, convention: str, **extra) -> dict:
    got = value(sim, "tflops", convention)
    return {
        "label": label,
        "simulated": got,
        "error": got / paper - 1,
        "step_time_s": sim["step_time_s"],
        "breakdown_s": sim["breakdown_s"],
        **extra,
    }


def _statement(s: OpenStatement, candidates: list[dict], convention: str) -> dict:
    return {
        **dataclasses.asdict(s),
        "unit": f"TFLOP/s per GPU ({convention} FLOPs)",
        "candidates": candidates,
        "within": [c["label"] for c in candidates if abs(c["error"]) <= WITHIN],
    }


def turing_nlg(prof: StatedProfile, mem_bytes: float, convention: str, say=lambda msg: None) -> dict:
    """Turing-NLG at every micro-batch from 1 to the planner's largest on ``mem_bytes`` cards."""
    base = suite_rows("paper/fig2")[0]
    run = {k: base[k] for k in ("seq", "vocab", "precision", "checkpoint_activations", "md", "bucket_size")}
    run.update(TURING_NLG_RUN)
    top = largest_batch(run, mem_bytes)
    cands = []
    for b in range(1, top + 1):
        say(f"Turing-NLG at micro-batch {b} of {top}")
        sim = replay({**run, "micro_batch": b}, prof)
        cands.append(_candidate(f"micro-batch {b}", sim, TURING_NLG.paper, convention, micro_batch=b))
    return _statement(TURING_NLG, cands, convention)


def megatron_in_node(fig2: dict, convention: str) -> dict:
    """Every Fig 2 baseline with MP at most a node's GPUs, from the simulated Fig 2 (``fig2``: label -> result)."""
    from zerobench.plan.suites import load_suite

    per_node = load_suite("paper/fig2")["cluster"]["gpus_per_node"]
    cands = [
        _candidate(f"{r['label']}, MP {r['tp']}", fig2[r["label"]], MEGATRON_IN_NODE.paper, convention, tp=r["tp"])
        for r in suite_rows("paper/fig2")
        if r["system"] == "megatron" and r["tp"] <= per_node
    ]
    return _statement(MEGATRON_IN_NODE, cands, convention)


def open_statements(prof: StatedProfile, mem_bytes: float, fig2: dict, convention: str, say) -> list[dict]:
    """Both statements, read in ``convention`` on ``prof`` (the paper's program on the fitted device)."""
    return [turing_nlg(prof, mem_bytes, convention, say), megatron_in_node(fig2, convention)]
