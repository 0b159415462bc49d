"""The paper's cluster figures predicted by the simulator on a stated V100 DGX-2 profile, next to the paper.

One free factor, the device's ``compute_scale``, is fitted on one non-ZeRO anchor: Megatron-LM's single-V100
baseline (1.2B parameters, 39 TFLOP/s; Shoeybi et al. 2019, arXiv 1909.08053). A second Megatron-LM figure
(8.3B on 512 V100s, MP 8 x DP 64: 15.1 PFLOP/s) is predicted, not fitted. Every ZeRO figure is predicted:
the 100B model at 400 GPUs, the 8B-100B average, Fig 3's 60B scaling from 64 to 400 GPUs (with the
critical path that explains it, at the paper's batch and at the largest batch the memory planner fits) and
Fig 4's DP-only points (throughput, and the largest model the planner fits, next to the paper's). The two
statements whose run the paper does not configure (Turing-NLG, Megatron-LM within a node) are simulated over what
their sources leave open (``zerobench.sim.paper_open``), beside the claims and not among them.

FLOP convention: neither paper prints its formula. Megatron-LM's later count (Narayanan et al. 2021) includes
the recompute pass (hardware FLOPs); DeepSpeed's reports follow Megatron-LM's. Both readings are computed,
each with its own fit of the anchor read the same way, and the one under which the *predicted* Megatron-LM
anchor comes out closer is named as the one the figures agree with (a choice made on non-ZeRO data only).
The ZeRO figures are read in the same convention as Megatron-LM's (the paper builds on its code).
"""

from __future__ import annotations

import dataclasses
import statistics

from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.paper_open import open_statements
from zerobench.sim.paper_runs import CONVENTIONS, largest_batch
from zerobench.sim.paper_runs import replay as _sim
from zerobench.sim.paper_runs import spec as _spec
from zerobench.sim.paper_runs import suite_rows as _rows
from zerobench.sim.paper_runs import value as _value
from zerobench.sim.stated import DEVICES

MEGATRON_SRC = "Shoeybi et al. 2019, Megatron-LM (arXiv 1909.08053), abstract and Table 1"


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A published non-ZeRO figure on V100s."""

    what: str
    run: dict
    """The run as suite keys (``bench.spec.RunSpec``)."""
    device: str
    kind: str
    """``tflops`` (per GPU) or ``pflops`` (aggregate)."""
    value: float
    source: str
    fitted: bool


ANCHORS = (
    Anchor(
        "Megatron-LM 1.2B on one V100",
        dict(layers=40, hidden=1536, heads=16, gpus=1, tp=1, micro_batch=8),
        "v100-dgx2h",
        "tflops",
        39.0,
        MEGATRON_SRC,
        True,
    ),
    Anchor(
        "Megatron-LM 8.3B on 512 V100 (MP 8 x DP 64)",
        dict(layers=72, hidden=3072, heads=32, gpus=512, tp=8, micro_batch=8),
        "v100-dgx2h",
        "pflops",
        15.1,
        MEGATRON_SRC,
        False,
    ),
)
"""Both: seq 1024, the GPT-2 vocabulary padded to 51,200 as Megatron-LM states (§5.1), fp16, activation
checkpointing, Megatron's data parallelism (one all-reduce of all gradients after backward). Both are rows of the
published table too (``meg19-1.2b-1gpu``, its V100 calibration row, and ``meg19-8.3b-tp8-dp64``)."""

_MEGATRON_BASE = dict(
    seq=1024, vocab=51200, precision="fp16", checkpoint_activations=True, system="megatron", stage=0, bucket_size=None
)


CALIBRATED = ("v100-dgx2", "v100-dgx2h")
"""Stated devices with the anchors' GPUs (V100-SXM3): ``--paper`` predicts on them."""

PAPER_STACK = "megatron-2019+deepspeed-0.2"
"""The program the paper's runs are replayed as: the ZeRO paper's code is built on Megatron-LM's 2019 GPT, in eager
PyTorch with the attention softmax unfused, and its ZeRO is DeepSpeed 0.2's, whose gradient reductions backward
waits for (``zerobench.sim.software``)."""


ANCHOR_STACK = "megatron-2019"
"""The program Megatron-LM's own figures (the anchors) are replayed as: Megatron-LM 2019's code on its container's
PyTorch 1.1, as the published table replays them. The paper's runs differ from it only where their PyTorch 1.2 (the
version the paper's artifact description lists) does, keeping the CUDA RNG state on the host, and in their ZeRO."""


def stated_profile(device: str, stack: str = "zerobench") -> StatedProfile:
    """A stated device running ``stack``, at its device class's fitted ``compute_scale`` (fitted on the class's one
    calibration figure, ``results/reference/sim-published``; scale 1 where the class has none)."""
    from zerobench.sim.published_validate import calibration

    dev = DEVICES[device]
    fit = calibration(dev.name.split("-")[0].lower())
    return StatedProfile(dataclasses.replace(dev, compute_scale=fit["value"]), stack)


def fitted_profile(device: str, convention: str) -> tuple[StatedProfile, dict]:
    """``device``'s stated profile running the paper's program, with ``compute_scale`` fitted on the single-GPU
    anchor read in ``convention``. The anchor is the V100 calibration row of the published table, so ``--paper``
    and ``--validate-published`` use one fit of one figure."""
    from zerobench.sim.published_validate import calibration

    a = ANCHORS[0]
    fit = calibration("v100", convention)
    unit = StatedProfile(dataclasses.replace(DEVICES[a.device], compute_scale=1.0), ANCHOR_STACK)
    got = _value(_sim({**_MEGATRON_BASE, **a.run}, unit), a.kind, convention)
    return StatedProfile(dataclasses.replace(DEVICES[device], compute_scale=fit["value"]), PAPER_STACK), {
        "factor": "compute_scale",
        "value": fit["value"],
        "fitted_on": a.what,
        "anchor": a.value,
        "source": a.source,
        "unfitted_prediction": got,
        "table_row": fit["row"],
    }


def _unit(kind: str, convention: str) -> str:
    what = "TFLOP/s per GPU" if kind == "tflops" else "PFLOP/s in all"
    return f"{what} ({convention} FLOPs)"


def _claim(
    what: str,
    paper: float,
    bound: str,
    ours: float,
    unit: str,
    source: str,
    sim: dict | None = None,
    fitted: bool = False,
) -> dict:
    """One figure next to the paper's. ``bound``: how the paper states it ("" exact, ">"/"over" a floor,
    "<"/"less than" a ceiling, "about", "up to")."""
    holds = {">": ours > paper, "over": ours > paper, "<": ours < paper, "less than": ours < paper}.get(bound)
    return {
        "what": what,
        "paper": paper,
        "bound": bound,
        "simulated": ours,
        "unit": unit,
        "error": ours / paper - 1,
        "bound_holds": holds,
        "source": source,
        "fitted": fitted,
        "breakdown_s": (sim or {}).get("breakdown_s"),
        "step_time_s": (sim or {}).get("step_time_s"),
    }


def simulate_figures(prof: StatedProfile, mem_bytes: float, say) -> dict:
    """The paper's runs replayed on ``prof``: Fig 2 and Fig 4 by label; Fig 3 (60B, 64-400 GPUs) and Fig 8
    (60B, C1-C5) at the paper's micro-batch and at the largest the memory planner fits."""
    figs: dict = {"fig2": {}, "fig3": [], "fig4": {}, "fig8": []}
    for fig in ("fig2", "fig4"):
        for run in _rows(f"paper/{fig}"):
            say(f"{fig} {run['label']}")
            figs[fig][run["label"]] = _sim(run, prof)
    for run in _rows("paper/fig3"):
        say(f"fig3 60B on {run['gpus']} GPUs")
        best = largest_batch(run, mem_bytes)
        figs["fig3"].append(
            {
                "gpus": run["gpus"],
                "micro_batch": run["micro_batch"],
                "at_paper_batch": _sim(run, prof),
                "planner_micro_batch": best,
                "at_planner_batch": _sim({**run, "micro_batch": best}, prof) if best else None,
            }
        )
    for c, b in zip(("C1", "C2", "C3", "C4", "C5"), FIG8_BATCHES):
        run = {**_c_config(c), **FIG8_RUN, "micro_batch": b}
        say(f"fig8 60B {c}")
        best = largest_batch(run, mem_bytes)
        figs["fig8"].append(
            {
                "config": c,
                "micro_batch": b,
                "at_paper_batch": _sim(run, prof),
                "planner_micro_batch": best,
                "at_planner_batch": _sim({**run, "micro_batch": best}, prof) if best else None,
            }
        )
    return figs


FIG8_RUN = dict(layers=75, hidden=8192, heads=64, gpus=128, tp=16)
FIG8_BATCHES = (2, 4, 32, 32, 8)
"""Fig 8's 60B on 128 GPUs (the configurations in the paper's artifact appendix for Figs 7-8): C1..C5's micro-batches, in that order."""


def _c_config(name: str) -> dict:
    """C1-C5's ZeRO and ZeRO-R settings (stage, P_a, P_a+cpu, C_B, M_D) from ``suites/paper/c1_c5.yaml``."""
    keep = (
        "seq",
        "vocab",
        "precision",
        "checkpoint_activations",
        "md",
        "bucket_size",
        "system",
        "stage",
        "pa",
        "pa_cpu",
    )
    row = next(r for r in _rows("paper/c1_c5") if r.get("config") == name)
    return {k: v for k, v in row.items() if k in keep}


SIZES_8_100 = ("8B", "20B", "40B", "60B", "80B", "100B")
FIG2_SIZES = ("1.5B", *SIZES_8_100, "120B", "140B", "170B")


def claims(figs: dict, convention: str) -> list[dict]:
    """The paper's throughput statements against the simulated runs, read in ``convention``."""
    f2, f4, t = figs["fig2"], figs["fig4"], "tflops"
    v = lambda sim, kind=t: _value(sim, kind, convention)  # noqa: E731
    out = [
        _claim(
            "ZeRO 100B on 400 V100",
            38.0,
            ">",
            v(f2["100B ZeRO"]),
            _unit(t, convention),
            "paper §1 'Speed'",
            f2["100B ZeRO"],
        ),
        _claim(
            "ZeRO 8B-100B on 400 V100, average aggregate",
            15.0,
            "",
            statistics.mean(v(f2[f"{s} ZeRO"], "pflops") for s in SIZES_8_100),
            _unit("pflops", convention),
            "paper §10.2",
        ),
    ]
    speedup = {s: v(f2[f"{s} ZeRO"]) / v(f2[f"{s} Baseline"]) for s in FIG2_SIZES}
    best = max(speedup, key=speedup.get)
    out.append(
        _claim(
            f"speedup over Megatron-LM, the largest (at {best})", 10.0, "up to", speedup[best], "x", "paper §1, §10.2"
        )
    )
    out.append(
        _claim(
            "Megatron-LM 40B across nodes (MP 32)",
            5.0,
            "about",
            v(f2["40B Baseline"]),
            _unit(t, convention),
            "paper §1",
            f2["40B Baseline"],
        )
    )
    zero4 = [sim for label, sim in f4.items() if "ZeRO" in label]
    out.append(
        _claim(
            "Fig 4: ZeRO-DP 1.5B-13B on 128 GPUs, average",
            40.0,
            "over",
            statistics.mean(v(s) for s in zero4),
            _unit(t, convention),
            "paper §10.4",
        )
    )
    out.append(
        _claim(
            "Fig 4: the largest DDP baseline (1.38B) on 128 GPUs",
            20.0,
            "less than",
            v(f4["1.38B Baseline(DDP)"]),
            _unit(t, convention),
            "paper §10.4",
            f4["1.38B Baseline(DDP)"],
        )
    )
    return out


def max_size_claims(mem_bytes: float) -> list[dict]:
    out = []
    for what, run, paper in FIG4_MAX_SIZE:
        got = max_size(run, mem_bytes)
        out.append(
            _claim(
                what,
                paper,
                "",
                got["max_params"] / 1e9,
                "B parameters (memory planner)",
                "paper Fig 4 and its appendix table",
            )
        )
    return out


def predict_paper(device: str = "v100-dgx2", progress=None) -> dict:
    """Both conventions' fits, anchors, simulated figures and claims, and which convention the predicted
    Megatron-LM anchor supports (``chosen``)."""
    say = progress or (lambda msg: None)
    mem = DEVICES[device].mem_bytes
    dev = DEVICES[device]
    out: dict = {
        "device": dev.name,
        "relative_speed": dev.relative_speed,
        "relative_speed_source": dev.sources.get("relative_speed"),
        "conventions": {},
        "max_size": max_size_claims(mem),
    }
    for conv in CONVENTIONS:
        prof, fit = fitted_profile(device, conv)
        say(f"{conv} FLOPs: compute_scale {fit['value']:.3f} fitted on {fit['fitted_on']}")
        anchors = []
        for a in ANCHORS:
            on = StatedProfile(dataclasses.replace(DEVICES[a.device], compute_scale=fit["value"]), ANCHOR_STACK)
            sim = _sim({**_MEGATRON_BASE, **a.run}, on)
            anchors.append(
                _claim(
                    a.what, a.value, "", _value(sim, a.kind, conv), _unit(a.kind, conv), a.source, sim, fitted=a.fitted
                )
            )
        figs = simulate_figures(prof, mem, say)
        out["conventions"][conv] = {
            "fit": fit,
            "anchors": anchors,
            "claims": claims(figs, conv),
            "figures": figs,
            "open": open_statements(prof, mem, figs["fig2"], conv, say),
        }
    err = {c: abs(r["anchors"][1]["error"]) for c, r in out["conventions"].items()}
    out["chosen"] = min(err, key=err.get)
    out["chosen_because"] = (
        f"the predicted anchor ({ANCHORS[1].what}) is off by {err[out['chosen']]:.0%} read as "
        f"{out['chosen']} FLOPs, {max(err.values()):.0%} the other way"
    )
    return out


FIG4_MAX_SIZE = (
    (
        "Fig 4: largest ZeRO (P_os+g) model, 128 GPUs, h 4096, micro-batch 2",
        dict(gpus=128, tp=1, hidden=4096, heads=32, micro_batch=2, stage=2, bucket_size=500_000_000, md=True),
        13.0,
    ),
    (
        "Fig 4: largest DDP model, 128 GPUs, h 1536, micro-batch 1",
        dict(gpus=128, tp=1, hidden=1536, heads=16, micro_batch=1, stage=0, bucket_size=None),
        1.38,
    ),
)
"""The DP-only max-size points: the paper's largest trained model of each kind at its shape and batch."""


def max_size(run: dict, mem_bytes: float) -> dict:
    """The memory planner's largest model (by layers) for ``run`` on ``mem_bytes`` GPUs (seq 1024, GPT-2
    vocabulary, fp16, checkpointing, as the paper's runs)."""
    from zerobench.plan.suites import plan_config
    from zerobench.plan.tables import max_size as solve

    full = {"seq": 1024, "vocab": 50257, "precision": "fp16", "checkpoint_activations": True, "layers": 1, **run}
    return solve(plan_config(_spec(full), 16, mem_bytes))
