"""The paper's Figs 2, 3, 4 and 8 as the simulator predicts them on the stated V100 DGX-2, next to the paper's
printed claims, and the table of every claim with its error.

They are drawn from rows of ``zerobench simulate --paper --out DIR`` (metrics ``sim_paper_figure`` and
``sim_paper_tflops_per_gpu``, in the convention the anchors chose). Rows handed to the report win; without
them the recorded prediction in ``results/reference/sim-paper-v100-dgx2`` is used (a test recomputes it
from the code, so it is what the code predicts).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from zerobench.report.figures import _save

RECORDED = Path(__file__).resolve().parents[2] / "results" / "reference" / "sim-paper-v100-dgx2"
RECORDED_PUBLISHED = Path(__file__).resolve().parents[2] / "results" / "reference" / "sim-published" / "predicted"
PAPER_RED = "crimson"


def prediction_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The chosen convention's ``sim_paper_*`` rows: from ``df`` if it has them, else the recorded ones."""

    def chosen(d: pd.DataFrame) -> pd.DataFrame:
        if "metric" not in d or "chosen" not in d:
            return d.iloc[0:0]
        d = d[d["metric"].isin(["sim_paper_figure", "sim_paper_tflops_per_gpu", "sim_paper_open"])]
        return d[d["chosen"].fillna(False).astype(bool)]

    d = chosen(df)
    if d.empty and (RECORDED / "rows.jsonl").exists():
        from zerobench.results import load

        d = chosen(load(str(RECORDED)))
    return d.reset_index(drop=True)


def published_table(df: pd.DataFrame) -> pd.DataFrame:
    """``zerobench simulate --validate-published`` as a table: per row of the published table, its figure and
    predicted ÷ published in the reading its bars count (from ``df`` if it has the rows, else the recorded ones)."""

    def counted(d: pd.DataFrame) -> pd.DataFrame:
        if "metric" not in d or "counted" not in d:
            return d.iloc[0:0]
        d = d[d["metric"] == "sim_published_ratio"]
        return d[d["counted"].fillna(False).astype(bool)]

    d = counted(df)
    if d.empty and (RECORDED_PUBLISHED / "rows.jsonl").exists():
        from zerobench.results import load

        d = counted(load(str(RECORDED_PUBLISHED)))
    if d.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "row": d["row_id"].values,
            "split": d["split"].values,
            "device": d["device_class"].values,
            "framework": d["framework"].values,
            "GPUs": d["gpus"].values,
            "TP": d["tp"].values,
            "ZeRO": d["zero"].values,
            "published": [f"{v:g} {m}" for v, m in zip(d["published"], d["published_metric"])],
            "predicted / published": d["value"].round(3).values,
            "reading": d["reading"].values,
        }
    )


def claims_table(d: pd.DataFrame) -> pd.DataFrame:
    """Every claim with its error; below them, each candidate run of a statement whose run the paper does not
    configure (``sim_paper_open``), its column ``open run`` naming the candidate."""
    c = d[d["metric"].isin(["sim_paper_figure", "sim_paper_open"])]
    if c.empty:
        return pd.DataFrame()
    c = c.sort_values("metric", kind="stable")  # sim_paper_figure first
    cand = c["candidate"] if "candidate" in c else pd.Series("", index=c.index)
    return pd.DataFrame(
        {
            "figure": c["what"].values,
            "open run": cand.fillna("").values,
            "paper": [f"{b} {p:g}".strip() for b, p in zip(c["bound"].fillna(""), c["paper"])],
            "simulated": c["value"].round(2).values,
            "error": [f"{e:+.1%}" for e in c["error"]],
            "unit": c["unit"].values,
            "fitted": c["fitted"].eq(True).values,
        }
    )


def _figure(d: pd.DataFrame, fig: str) -> pd.DataFrame:
    t = d[(d["metric"] == "sim_paper_tflops_per_gpu") & (d.get("figure") == fig)]
    return t.copy()


def _claim(ax, value: float, text: str, x: float = -0.4) -> None:
    ax.axhline(value, color=PAPER_RED, ls=":", lw=1)
    ax.text(x, value, f" paper: {text}", color=PAPER_RED, fontsize=7, va="bottom")


def _bars(t: pd.DataFrame, base: str, title: str, ylabel: str, out: Path, name: str, claims: list[tuple]):
    t = t.assign(
        size=[lbl.split()[0] for lbl in t["label"]], system=["ZeRO" if "ZeRO" in lbl else base for lbl in t["label"]]
    )
    fig, ax = plt.subplots(figsize=(8.5, 4))
    sns.barplot(data=t, x="size", y="value", hue="system", ax=ax)
    order = list(dict.fromkeys(t["size"]))
    for value, text, *at in claims:
        if at and at[0] in order:  # a statement about one model: a marker on its bar
            ax.plot([order.index(at[0]) - 0.2], [value], marker="_", ms=22, mew=2, color=PAPER_RED)
            ax.text(
                order.index(at[0]) - 0.2, value, f"paper: {text}", color=PAPER_RED, fontsize=7, ha="center", va="bottom"
            )
        else:
            _claim(ax, value, text)
    ax.set_xlabel("model size")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return _save(fig, out, name)


def simulated_figures(d: pd.DataFrame, out: Path) -> list[dict]:
    if d.empty:
        return []
    device = str(d["device"].dropna().iloc[0])
    unit = str(_figure(d, "fig2")["unit"].iloc[0])
    scale = float(d["compute_scale"].dropna().iloc[0])
    basis = (
        f"Simulated on {device}: the engine's schedule replayed on stated hardware figures (sources in "
        f"zerobench/sim/stated.py), one factor (compute_scale {scale:.3f}) fitted on Megatron-LM's single-V100 "
        f"figure; red: the paper's printed statements. {unit}."
    )
    figs = []
    f2 = _figure(d, "fig2")
    path = _bars(
        f2,
        "Megatron-LM",
        "Fig 2 (simulated): throughput vs model size, 400 V100",
        "TFLOP/s per GPU",
        out,
        "sim_fig2",
        [(38.0, ">38", "100B"), (37.5, "15 PFLOP/s average over 8B-100B = 37.5 per GPU")],
    )
    figs.append({"path": path.name, "title": "Fig 2 (simulated): throughput vs model size", "caption": basis})
    f3 = _figure(d, "fig3").sort_values("gpus")
    if not f3.empty:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for at, style in (("paper", "o-"), ("planner", "s--")):
            s = f3[f3["batch_from"] == at]
            axes[0].plot(s["gpus"], s["pflops_aggregate"], style, label=f"micro-batch: the {at}'s")
        p = f3[f3["batch_from"] == "paper"]
        first = p.iloc[0]
        axes[0].plot(
            p["gpus"], first["pflops_aggregate"] * p["gpus"] / first["gpus"], "k:", label="linear from 64 GPUs"
        )
        axes[0].set_xlabel("GPUs")
        axes[0].set_ylabel("PFLOP/s in all")
        axes[0].legend(fontsize=7)
        axes[0].set_title("Fig 3 (simulated): 60B, MP 16", fontsize=10)
        parts = p[[c for c in p if c.startswith("breakdown_s.")]].fillna(0.0)
        parts.columns = [c.split(".", 1)[1] for c in parts]
        shares = parts.div(parts.sum(axis=1), axis=0).set_axis(p["gpus"].astype(int).astype(str))
        shares = shares.loc[:, shares.max() >= 0.005]
        shares.plot.bar(stacked=True, ax=axes[1], width=0.7)
        axes[1].set_xlabel("GPUs (micro-batch: the paper's)")
        axes[1].set_ylabel("share of the step's critical path")
        axes[1].legend(fontsize=7)
        axes[1].set_title("where the step goes", fontsize=10)
        figs.append(
            {
                "path": _save(fig, out, "sim_fig3").name,
                "title": "Fig 3 (simulated): 60B from 64 to 400 GPUs",
                "caption": basis + " Superlinear where the micro-batch grows with the GPUs (P_os+g frees memory): "
                "the same DP traffic per step is spread over more compute.",
            }
        )
    f4 = _figure(d, "fig4")
    if not f4.empty:
        sizes = d[(d["metric"] == "sim_paper_figure") & d["what"].fillna("").str.startswith("Fig 4: largest")]
        maxsize = "; ".join(
            f"{w.split(': ', 1)[1]}: {v:.2f}B simulated vs {p:g}B in the paper"
            for w, v, p in zip(sizes["what"], sizes["value"], sizes["paper"])
        )
        path = _bars(
            f4,
            "DDP",
            "Fig 4 (simulated): data parallelism only, 128 V100",
            "TFLOP/s per GPU",
            out,
            "sim_fig4",
            [(40.0, ">40 average (ZeRO)"), (20.0, "<20 for DDP's largest (1.38B)")],
        )
        figs.append(
            {
                "path": path.name,
                "title": "Fig 4 (simulated): DP only, 128 GPUs",
                "caption": basis + f" Largest models the memory planner fits: {maxsize}.",
            }
        )
    f8 = _figure(d, "fig8")
    if not f8.empty:
        fig, ax = plt.subplots(figsize=(7, 4))
        f8 = f8.assign(batch=[f"micro-batch: the {b}'s" for b in f8["batch_from"]])
        sns.barplot(data=f8, x="zero_r", y="value", hue="batch", ax=ax)
        ax.set_xlabel("ZeRO-R configuration (paper Table 3)")
        ax.set_ylabel("TFLOP/s per GPU")
        ax.set_title("Fig 8 (simulated): 60B on 128 GPUs, C1-C5", fontsize=10)
        ax.legend(fontsize=7)
        figs.append(
            {
                "path": _save(fig, out, "sim_fig8").name,
                "title": "Fig 8 (simulated): C1-C5",
                "caption": basis + " At the largest micro-batch the memory planner fits, the configurations "
                "that save the most memory (P_a, P_a+cpu) run the largest batches.",
            }
        )
    return figs
