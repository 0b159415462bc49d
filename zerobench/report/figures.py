"""The report's figures, drawn with seaborn from aggregated rows. Each returns a PNG path (or None when
the rows it needs do not exist) and a caption that names the hardware the rows came from."""

from __future__ import annotations

import io
import warnings
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from zerobench.files import replace_file

CATS = [
    ("memory_params_bytes", "params"),
    ("memory_grads_bytes", "grads"),
    ("memory_master_bytes", "fp32 master"),
    ("memory_optimizer_states_bytes", "optimizer states"),
    ("memory_activation_checkpoints_bytes", "activation checkpoints"),
]


def _hw(df: pd.DataFrame) -> str:
    devs = sorted({str(d) for d in df.get("device", pd.Series(dtype=str)).dropna()})
    return "; ".join(devs) if devs else "unknown hardware"


def record_label(r) -> str:
    """A record's legend entry (a row of ``aggregate.runs_table``, as ``itertuples`` gives it): its layout, model,
    precision, offload, system where not zerobench, and what sets it apart from records of that label (``variant``)."""
    return (
        f"dp{int(r.dp)} tp{int(r.tp)} {r.preset} L{int(r.layers)} h{int(r.hidden)} {r.precision}"
        + (" offload" if getattr(r, "offload", "none") != "none" else "")
        + ("" if getattr(r, "system", "zerobench") in (None, "zerobench") else f" {r.system}")
        + (f" ({r.variant})" if getattr(r, "variant", "") else "")
    )


def _series(d: pd.DataFrame) -> list[str]:
    """One legend entry per record drawn at one stage (``record_label``, numbered where two still share one): a
    seaborn bar is the mean of the records under its entry. With rows from several hardware classes the class is part
    of the label, so bars from different machines are never merged."""
    multi = d["hardware"].nunique(dropna=True) > 1 if "hardware" in d else False
    labels = [record_label(r) + (f" [{r.hardware}]" if multi else "") for r in d.itertuples()]
    return _unique(labels, [int(s) for s in d["stage"]])


def _by_hardware(d: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One panel per hardware class: a GPU and a CPU never share an axis (their scales differ by 10^4)."""
    hw = d["hardware"].fillna("unknown") if "hardware" in d else pd.Series("unknown", index=d.index)
    return [(str(k), g) for k, g in d.groupby(hw, sort=True)]


def _unique(labels: list[str], within: list | None = None) -> list[str]:
    """``labels`` with a ``#k`` added where two records (at one ``within`` value: a bar position) would share one,
    so that a figure never draws two measurements as one bar, or their mean as a value nobody measured."""
    keys = list(zip(within, labels)) if within is not None else [(None, x) for x in labels]
    seen: dict[tuple, int] = {}
    counts = Counter(keys)
    out = []
    for k, label in zip(keys, labels):
        if counts[k] > 1:
            seen[k] = seen.get(k, 0) + 1
        out.append(f"{label} #{seen[k]}" if counts[k] > 1 else label)
    return out


def _save(fig, out: Path, name: str) -> Path:
    """The figure as ``out/name.png``. Matplotlib warns when placing a legend at ``loc="best"`` took over a second:
    a statement about this machine's load, not about the figure, so it is not passed on to the user (it failed the
    report on a busy machine)."""
    path = out / f"{name}.png"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message='Creating legend with loc="best" can be slow')
        fig.tight_layout()
        fig.savefig(buf := io.BytesIO(), format="png", dpi=110)
        replace_file(path, buf.getvalue())  # never through a link planted at the name
    plt.close(fig)
    return path


def memory_ledger(runs: pd.DataFrame, out: Path):
    d = runs[runs.get("model_state_bytes").notna()] if "model_state_bytes" in runs else runs.iloc[0:0]
    if d.empty or not any(col in d and d[col].notna().any() for col, _ in CATS):  # rows without the ledger (a
        return None  # baseline file keeps only the gated metrics): no bars to draw
    d = d.sort_values(["hardware", "dp", "tp", "stage"])
    groups = _by_hardware(d)
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(max(6, 0.55 * max(len(g) for _, g in groups)), 4 * len(groups)), squeeze=False
    )
    variants: dict[str, str] = {}  # a bar's long description goes in the caption, under a short key on the axis
    for ax, (hw, g) in zip(axes[:, 0], groups):
        labels = []
        for r in g.itertuples():
            v = getattr(r, "variant", "") or ""
            key = variants.setdefault(v, f"v{len(variants) + 1}") if v else ""
            labels.append(
                f"s{int(r.stage)} dp{int(r.dp)} tp{int(r.tp)}"
                + (" off" if getattr(r, "offload", "none") != "none" else "")
                + f" {r.preset}"
                + (f" {r.paper_config}" if isinstance(getattr(r, "paper_config", None), str) else "")
                + (f" {key}" if key else "")
            )
        labels = _unique(labels)
        bottom = pd.Series(0.0, index=g.index)
        for col, name in CATS:
            if col in g:
                vals = g[col].fillna(0) / 2**20
                ax.bar(labels, vals, bottom=bottom, label=name)
                bottom += vals
        if "model_state_bytes_analytic" in g:
            ax.scatter(
                labels,
                g["model_state_bytes_analytic"] / 2**20,
                marker="_",
                s=400,
                c="k",
                zorder=3,
                label="paper formula (model states)",
            )
        ax.set_ylabel("MiB per rank")
        ax.set_title(f"Memory ledger per rank, measured from the engine's tensors [{hw}]", fontsize=10)
        ax.tick_params(axis="x", rotation=60)
        ax.legend(fontsize=7)
    keys = "".join(f" {k}: {v}." for v, k in variants.items())
    return _save(
        fig, out, "memory_ledger"
    ), f"Measured bytes per rank by category vs the paper's §5 formula.{keys} Hardware: {_hw(d)}."


ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _psi_rank(d: pd.DataFrame) -> pd.Series:
    """Ψ of a rank's DP group: the parameters its TP rank holds, the ones every TP rank holds whole (LayerNorms,
    row-parallel biases) included. From the ledger's parameter bytes (a stage-3 rank holds 1/N of them) where a run
    has it, else the model's parameters over TP (which leaves the replicated ones out)."""
    fallback = d["num_params"] / d["tp"]
    if "memory_params_bytes" not in d:
        return fallback
    elem = d["precision"].map(ELEMENT_BYTES)
    held = d["memory_params_bytes"] / elem * d["dp"].where(d["stage"] == 3, 1)
    return held.where(held.notna() & (held > 0), fallback)


def comm_volume(runs: pd.DataFrame, out: Path):
    if "comm_volume_elements_per_step" not in runs or "num_params" not in runs:
        return None
    d = runs[runs["comm_volume_elements_per_step"].notna() & runs["num_params"].notna() & (runs["dp"] > 1)].copy()
    if "grad_accum" in d:  # the lines are one micro-batch's: A of them move (A+1)Ψ at stage 2 and 3AΨ at stage 3
        d = d[d["grad_accum"].fillna(1) == 1]
    if d.empty:
        return None
    d["measured / Ψ·(N-1)/N"] = d["comm_volume_elements_per_step"] / (_psi_rank(d) * (d["dp"] - 1) / d["dp"])
    d["config"] = _series(d)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sns.barplot(data=d, x="stage", y="measured / Ψ·(N-1)/N", hue="config", ax=ax)
    ax.axhline(2, ls="--", c="gray")
    ax.axhline(3, ls=":", c="gray")
    ax.text(-0.4, 2.05, "2Ψ (stages 0-2)", fontsize=8)
    ax.text(-0.4, 3.05, "3Ψ (stage 3)", fontsize=8)
    ax.set_title("Communication per step vs the paper's 2Ψ / 3Ψ (§7)")
    if ax.get_legend():
        ax.legend(fontsize=6)
    return _save(fig, out, "comm_volume"), (
        f"DP traffic per rank and step in units of Ψ(N−1)/N, runs of one micro-batch a step (stages 2-3 reduce every "
        f"micro-batch: A of them move (A+1)Ψ and 3AΨ). Hardware: {_hw(d)}."
    )


def throughput(runs: pd.DataFrame, out: Path):
    if "tflops_per_gpu" not in runs:
        return None
    d = runs[runs["tflops_per_gpu"].notna()].copy()
    if d.empty:
        return None
    groups = _by_hardware(d)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 3.6), squeeze=False)
    for ax, (hw, hw_rows) in zip(axes[0], groups):
        g = hw_rows.assign(
            config=_unique([record_label(r) for r in hw_rows.itertuples()], [int(s) for s in hw_rows["stage"]])
        )
        sns.barplot(data=g, x="stage", y="tflops_per_gpu", hue="config", ax=ax)
        ax.set_ylabel("TFLOP/s per GPU (model FLOPs)")
        ax.set_title(f"Throughput per device by ZeRO stage [{hw}]", fontsize=10)
        if ax.get_legend():
            ax.legend(fontsize=6)
    return (
        _save(fig, out, "throughput"),
        f"Median step time after warm-up, Megatron FLOP count. Hardware: {_hw(d)} — absolute values are only meaningful for that hardware.",
    )


def loss_curves(losses: pd.DataFrame, out: Path):
    if losses.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    # a run measured in several rounds: the band is the rounds' range (a bootstrap CI would cost seconds per run)
    sns.lineplot(
        data=losses,
        x="step",
        y="value",
        hue="run",
        errorbar=("pi", 100),
        ax=ax,
        legend=len(losses["run"].unique()) <= 12,
    )
    ax.set_ylabel("loss")
    ax.set_title("Loss curves")
    if ax.get_legend():
        ax.legend(fontsize=6)
    return _save(fig, out, "loss_curves"), "Training loss per step for every run (same seed and data across stages)."


def peers(table: pd.DataFrame, out: Path):
    """zerobench's stages next to the peers: step time relative to torch-ddp and peak live memory."""
    d = table[table["time_vs_torch_ddp"].notna()] if len(table) else table
    if d.empty:
        return None
    several = "comparison" in d and d["comparison"].nunique() > 1
    d = d.sort_values((["comparison"] if several else []) + ["shards_like_stage", "candidate"])
    d = d.assign(family=["zerobench" if c.startswith("zerobench") else "peer" for c in d["candidate"]])
    if several:  # one bar per candidate of each comparison
        d = d.assign(candidate=[f"{c} ({m})" for c, m in zip(d["candidate"], d["comparison"])])
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.35 * len(d) + 1.6), sharey=True)
    sns.barplot(data=d, y="candidate", x="time_vs_torch_ddp", hue="family", dodge=False, ax=axes[0])
    axes[0].axvline(1.0, color="#555", lw=0.8)
    axes[0].set_xlabel("step time / torch-ddp (median of per-round ratios)")
    axes[0].set_ylabel("")
    if d["peak_live_MiB"].notna().any():
        sns.barplot(data=d, y="candidate", x="peak_live_MiB", hue="family", dodge=False, ax=axes[1], legend=False)
    axes[1].set_xlabel("peak live MiB per rank")
    fig.suptitle("zerobench vs peers, same model, batch and processes")
    cap = (
        f"Candidates interleaved round by round within each comparison; grouped by the ZeRO stage whose "
        f"sharding they match. Hardware: {'; '.join(sorted({str(x) for x in d['device'].dropna()})) or 'unknown'}."
    )
    return _save(fig, out, "peers"), cap


def sim_validation(table: pd.DataFrame, out: Path):
    """The simulator's predicted step time against the measured one, per run (log-log, y = x and ±10%)."""
    if table.empty:
        return None
    import statistics

    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    d = table.assign(
        **{"model hidden size": [str(h) for h in table["hidden"]], "ZeRO stage": [str(s) for s in table["stage"]]}
    )
    several = d["device"].nunique() > 1  # then the marker says the device (and the caption gives each its errors)
    style = "device" if several else "ZeRO stage"
    sns.scatterplot(data=d, x="measured_ms", y="predicted_ms", hue="model hidden size", style=style, s=60, ax=ax)
    lo, hi = (
        0.8 * min(d["measured_ms"].min(), d["predicted_ms"].min()),
        1.25 * max(d["measured_ms"].max(), d["predicted_ms"].max()),
    )
    ax.plot([lo, hi], [lo, hi], color="#333", lw=0.8)
    ax.fill_between([lo, hi], [0.9 * lo, 0.9 * hi], [1.1 * lo, 1.1 * hi], color="#999", alpha=0.2, label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.legend(fontsize=7)
    per_device = []  # one figure of merit per profiled device: two machines' errors are never pooled
    for dev, g in d.groupby(d["device"].astype(str), sort=True):
        errs = [abs(r - 1) for r in g["ratio"]]
        per_device.append(
            f"{dev}: {len(g)} runs, median |predicted / measured - 1| = {statistics.median(errs):.1%}, worst "
            f"{max(errs):.1%}"
        )
    cap = "Predicted from a profile of the host without looking at the runs. " + "; ".join(per_device) + "."
    return _save(fig, out, "sim_validation"), cap
