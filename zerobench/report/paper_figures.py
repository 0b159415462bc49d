"""The paper's figures drawn from *measured* rows (whatever exists; each figure is skipped when its rows do
not): Fig 2 (TFLOPs per GPU vs model size, ZeRO vs baseline, with the speedup), Fig 3 (aggregate and per-GPU
throughput vs GPUs, with linear scaling), Fig 4 (max model size per stage from ``zerobench maxsize`` rows),
Figs 6-8 (C1-C5: max model size, peak memory per GPU, throughput per GPU). One panel or series per
hardware class: rows from different machines are never merged into one line. The projections of
``zerobench plan`` are separate figures (``figures.projection``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from zerobench.report.figures import _hw, _save, _unique, record_label

BASELINES = ("zerobench", "torch-ddp", "megatron")
"""Systems whose stage-0 runs are the paper's baseline: data parallelism (zerobench's stage 0, torch's DDP) and
Megatron-LM (the baseline the paper's Fig 2 is drawn against). Other systems (DeepSpeed, FSDP) are peers: not
drawn in Fig 2."""


def _family(d: pd.DataFrame) -> pd.Series:
    """Each record's bar in Fig 2: ``baseline`` (a baseline system at stage 0), ``ZeRO`` or ``ZeRO-Offload``
    (zerobench above stage 0), else None (a peer, left out)."""
    system = d["system"].fillna("zerobench")
    off = d.get("offload", pd.Series("none", index=d.index)).fillna("none")
    out = []
    for s, stage, o in zip(system, d["stage"], off):
        if s in BASELINES and stage == 0:
            out.append("baseline")
        elif s == "zerobench":
            out.append("ZeRO-Offload" if o != "none" else "ZeRO")
        else:
            out.append(None)
    return pd.Series(out, index=d.index, dtype=object)


def fig2_measured(runs: pd.DataFrame, out: Path):
    """Best TFLOPs/GPU per model size and family (baseline vs ZeRO), one panel per hardware class, processor and
    number of GPUs: the paper compares at one cluster size, and a ratio across two clusters (or two processors of one
    class) would compare the machines."""
    need = {"tflops_per_gpu", "num_params", "world"}
    if not need <= set(runs) or runs["tflops_per_gpu"].notna().sum() == 0:
        return None
    d = runs[runs["tflops_per_gpu"].notna() & runs["world"].notna()].copy()
    d["family"] = _family(d)
    d = d[d["family"].notna()]
    if d.empty:
        return None
    d["size"] = (d["num_params"] / 1e6).round(2)
    d["device"] = [str(v) if isinstance(v, str) else "unknown device" for v in d.get("device", [None] * len(d))]
    best = d.groupby(["hardware", "device", "world", "size", "family"], as_index=False)["tflops_per_gpu"].max()
    panels = sorted(best.groupby(["hardware", "device", "world"]).groups)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
    for ax, (hw, device, world) in zip(axes[0], panels):
        b = best[(best["hardware"] == hw) & (best["device"] == device) & (best["world"] == world)]
        sns.barplot(data=b, x="size", y="tflops_per_gpu", hue="family", ax=ax)
        for i, size in enumerate(sorted(b["size"].unique())):
            s = b[b["size"] == size].set_index("family")["tflops_per_gpu"]
            if "baseline" in s and "ZeRO" in s and s["baseline"] > 0:
                ax.text(i, s.max(), f"{s['ZeRO'] / s['baseline']:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xlabel("model size (M parameters)")
        ax.set_ylabel("TFLOP/s per GPU (model FLOPs)")
        ax.set_title(f"Fig 2 (measured): {hw}, {device}, {int(world)} GPUs", fontsize=10)
    cap = (
        "Best measured TFLOPs per GPU at each model size, at one number of GPUs per panel; baseline: data "
        "parallelism (stage 0: zerobench, torch DDP) or Megatron-LM; labels: ZeRO / baseline where both exist. "
        f"Hardware: {_hw(d)}."
    )
    return _save(fig, out, "fig2_measured"), cap


def scaling_lines(runs: pd.DataFrame) -> pd.DataFrame:
    """Fig 3's points: records of one workload at two or more DP degrees (everything else equal: TP,
    checkpointing, micro-batch, system, processor, torch, commit), each with its line's ``series`` label, which no
    other line shares."""
    if "tflops_per_gpu" not in runs or "world" not in runs:
        return runs.iloc[0:0]
    d = runs[runs["tflops_per_gpu"].notna() & runs["world"].notna()].copy()
    keys = [k for k in ("hardware", "device", "torch", "system", "stage", "scaling", "commit") if k in d]
    d = d.groupby(keys, dropna=False).filter(lambda g: g["world"].nunique() >= 2)
    if d.empty:
        return d
    d["series"] = [
        f"stage {int(r.stage)} {r.precision} {r.preset} tp{int(r.tp)}"
        + ("" if r.system in (None, "zerobench") else f" {r.system}")
        + (f" ({r.variant})" if getattr(r, "variant", "") else "")
        + f" [{r.hardware}]"
        for r in d.itertuples()
    ]
    line = d.groupby(keys, dropna=False).ngroup()
    if (line.groupby(d["series"]).nunique() > 1).any():
        # two lines under one label (what sets them apart is in neither's variant): numbered, never joined or averaged
        d["series"] = d["series"] + " #" + line.astype(str)
    return d


def fig3_measured(runs: pd.DataFrame, out: Path):
    """Aggregate and per-GPU throughput vs world size, one line per workload (``scaling_lines``)."""
    d = scaling_lines(runs)
    if d.empty:
        return None
    d["aggregate TFLOP/s"] = d["tflops_per_gpu"] * d["world"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    sns.lineplot(data=d, x="world", y="aggregate TFLOP/s", hue="series", marker="o", ax=axes[0])
    for _name, series in d.groupby("series"):
        g = series.sort_values("world")
        ref = g.iloc[0]
        axes[0].plot(g["world"], ref["aggregate TFLOP/s"] * g["world"] / ref["world"], "k:", lw=0.8)
    axes[0].set_title("aggregate (dotted: linear scaling from the smallest run)", fontsize=9)
    sns.lineplot(data=d, x="world", y="tflops_per_gpu", hue="series", marker="o", ax=axes[1], legend=False)
    axes[1].set_title("per GPU", fontsize=9)
    axes[1].set_ylabel("TFLOP/s per GPU")
    for ax in axes:
        ax.set_xlabel("GPUs (processes)")
        ax.set_xticks(sorted(d["world"].unique()))
    if axes[0].get_legend():
        axes[0].legend(fontsize=6)
    fig.suptitle("Fig 3 (measured): throughput vs number of devices", fontsize=10)
    return _save(
        fig, out, "fig3_measured"
    ), f"Same model and micro-batch per device at each size (weak scaling). Hardware: {_hw(d)}."


def fig4_measured(maxsize: pd.DataFrame, out: Path):
    """Max model size per stage (and offload) from ``zerobench maxsize`` rows: one group of bars per search setting
    (``maxsize.maxsize_table``'s ``label``: budget, model, DP, TP, hardware, and what sets it apart from another
    setting of that label)."""
    if maxsize is None or maxsize.empty:
        return None
    d = maxsize.copy()
    d["config"] = [
        f"stage {s}" + ("" if o == "none" else f" + offload {o}") + (" (at least: the search limit fit)" if a else "")
        for s, o, a in zip(d["stage"], d["offload"], d["at_least"])
    ]
    d["max M params"] = d["max_params"] / 1e6
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(d) + 1.8))
    sns.barplot(data=d, y="label", x="max M params", hue="config", ax=ax)
    ax.set_ylabel("")
    ax.set_title("Fig 4 (measured): largest model that trains within the budget", fontsize=10)
    cap = (
        "Binary search on layers (fresh processes per probe, budget enforced: live-tensor tracker on CPU, CUDA "
        f"OOM on GPU). Hardware: {_hw(d)}."
    )
    return _save(fig, out, "fig4_measured"), cap


def fig678_series(d: pd.DataFrame) -> list[str]:
    """The legend entry of each record of Figs 6-8: a search's ``label``; a run's layout, model, precision and
    hardware, and what sets it apart from other runs of that label (``figures.record_label``), numbered where two
    records of one C1-C5 configuration still share one. One entry is one bar: seaborn would average the records under
    one entry."""
    if "label" in d:
        return list(d["label"])
    labels = [f"{record_label(r)} [{r.hardware}]" for r in d.itertuples()]
    return _unique(labels, list(d["paper_config"]))


def fig678_measured(runs: pd.DataFrame, maxsize: pd.DataFrame, out: Path):
    """C1-C5 (the paper's Table 3): max model size, peak memory per GPU, throughput per GPU."""
    d = (
        runs[runs.get("paper_config", pd.Series(dtype=object)).notna()].copy()
        if "paper_config" in runs
        else runs.iloc[0:0]
    )
    m = maxsize[maxsize["paper_config"].notna()] if maxsize is not None and len(maxsize) else pd.DataFrame()
    if d.empty and m.empty:
        return None
    panels = [
        ("Fig 6: max model size (M params)", m, "max_params", 1e6),
        ("Fig 7: peak memory per GPU (MiB)", d, "peak_memory_bytes", 2**20),
        ("Fig 8: throughput per GPU (TFLOP/s)", d, "tflops_per_gpu", 1.0),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for ax, (title, src, col, div) in zip(axes, panels):
        ax.set_title(title, fontsize=9)
        if src.empty or col not in src or src[col].notna().sum() == 0:
            ax.text(0.5, 0.5, "no rows", ha="center", transform=ax.transAxes)
            continue
        s = src[src[col].notna()]
        s = s.assign(v=s[col] / div, series=fig678_series(s))
        if "at_least" in s:  # a capped search: its bar is a lower bound
            s["paper_config"] = [c + (" (at least)" if a else "") for c, a in zip(s["paper_config"], s["at_least"])]
        sns.barplot(data=s.sort_values("paper_config"), x="paper_config", y="v", hue="series", ax=ax)
        ax.set_xlabel("")
        ax.set_ylabel("")
        if ax.get_legend():
            ax.legend(fontsize=6)
    fig.suptitle("Figs 6-8 (measured): C1-C5 (Table 3)", fontsize=10)
    return _save(
        fig, out, "fig678_measured"
    ), f"C1-C5 derived from each run's switches. Hardware: {_hw(pd.concat([d, m]))}."
