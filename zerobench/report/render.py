"""``zerobench report``: rows -> figures -> one self-contained HTML page and a Markdown summary.

Figures are PNG files next to ``index.html``; the Markdown summary (for a pull-request comment) holds
the provenance, the DP-vs-ZeRO comparison and the paper's tables. The projection figures for the paper's
Figs 2-4 come from ``zerobench.plan`` with its stated assumptions; they are labelled as projections, and
the paper's stated numbers are drawn as labelled reference markers.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import jinja2
import pandas as pd

from zerobench.config import ConfigError
from zerobench.report import aggregate, figures, paper_figures
from zerobench.report.offload import offload_table

TEMPLATES = Path(__file__).resolve().parents[2] / "report_templates"


def _provenance(df: pd.DataFrame) -> dict:
    def uniq(col):
        return sorted({str(v) for v in df[col].dropna()}) if col in df else []

    return {
        "commits": [c[:12] for c in uniq("provenance.commit")],
        "dirty": any(df["provenance.dirty"].fillna(False)) if "provenance.dirty" in df else None,
        "hardware": uniq("provenance.hardware.device"),
        "hardware_classes": uniq("provenance.hardware.class"),
        "torch": uniq("provenance.torch_version"),
        "zerobench": uniq("provenance.zerobench_version"),
        "dates": (min(uniq("provenance.timestamp")), max(uniq("provenance.timestamp"))) if "provenance.timestamp" in df else None,
        "suites": uniq("suite"),
        "runs": df["run_id"].nunique(),
        "rows": len(df),
    }


def _projections(out: Path) -> tuple[list[dict], list[dict]]:
    from zerobench.plan.memory_model import memory_per_gpu
    from zerobench.plan.perf_model import HARDWARE, project
    from zerobench.plan.suites import load_suite, plan_configs

    hw = HARDWARE["v100-dgx2"]
    figs, table = [], []
    specs = [("paper/fig2", "proj_fig2", "Fig 2: throughput vs model size, 400 V100", "size",
              {">38 TFLOPs/GPU at 100B": (38.0, 5.6)}),
             ("paper/fig3", "proj_fig3", "Fig 3: 60B on 64-400 GPUs", "gpus", {}),
             ("paper/fig4", "proj_fig4", "Fig 4: DP only, 128 GPUs", "size",
              {">40 TFLOPs/GPU average (ZeRO)": (40.0, -0.4), "<20 TFLOPs/GPU, DDP 1.4B": (20.0, 8.6)})]
    for suite, name, title, x, claims in specs:
        rows = []
        for r, suite_plan in plan_configs(load_suite(suite)):
            p = dataclasses.replace(suite_plan, gpus_per_node=hw.gpus_per_node, gpu_mem_bytes=hw.mem_bytes)
            proj = project(p, hw)
            rows.append({"label": r["label"], "gpus": p.gpus, "mp": p.mp, "fits": memory_per_gpu(p)["fits"], **proj})
        res = figures.projection(rows, claims, out, name, title, x)
        if res:
            figs.append({"path": res[0].name, "title": title + " (projection)",
                         "caption": "Projected by zerobench plan on the V100 DGX-2 profile: efficiency 0.5 of peak, "
                                    "half of backward hides DP traffic, MP traffic exposed; red markers are the "
                                    "paper's statements. Not fitted to the paper."})
        table += [{"figure": suite.split("/")[1], **{k: row[k] for k in ("label", "gpus", "mp", "fits")},
                   "TFLOPs/GPU": round(row["hw_tflops_per_gpu"], 1), "PFLOPs": round(row["aggregate_pflops"], 2)}
                  for row in rows]
    return figs, table


def render(results: list[str], out_dir: str) -> Path:
    from zerobench.plan.tables import table1, table2
    from zerobench.results import load

    frames = []
    for r in results:
        try:
            frames.append(load(r))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    df = pd.concat(frames, ignore_index=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = aggregate.runs_table(df)
    losses = aggregate.losses_table(df)
    figs = []
    for fn, title, args in ((figures.memory_ledger, "Memory per rank, measured vs analytic", (runs,)),
                            (figures.comm_volume, "Communication per step vs 2Ψ / 3Ψ", (runs,)),
                            (figures.throughput, "Throughput by ZeRO stage", (runs,)),
                            (figures.loss_curves, "Loss curves", (losses,))):
        res = fn(*args, out)
        if res:
            figs.append({"path": res[0].name, "title": title, "caption": res[1]})
    maxsize = aggregate.maxsize_table(df)
    for fn, title, args in ((paper_figures.fig2_measured, "Fig 2 (measured): throughput vs model size", (runs,)),
                            (paper_figures.fig3_measured, "Fig 3 (measured): scaling with devices", (runs,)),
                            (paper_figures.fig4_measured, "Fig 4 (measured): max model size", (maxsize,)),
                            (paper_figures.fig678_measured, "Figs 6-8 (measured): C1-C5", (runs, maxsize))):
        res = fn(*args, out)
        if res:
            figs.append({"path": res[0].name, "title": title, "caption": res[1]})
    peers = aggregate.peers_table(df)
    res = figures.peers(peers, out)
    if res:
        figs.append({"path": res[0].name, "title": "zerobench vs peers", "caption": res[1]})
    sim = aggregate.sim_validation_table(df)
    res = figures.sim_validation(sim, out)
    if res:
        figs.append({"path": res[0].name, "title": "Simulator: predicted vs measured step time", "caption": res[1]})
    proj_figs, proj_table = _projections(out)
    figs += proj_figs
    comparison = aggregate.comparison_table(runs, maxsize)
    one_card = offload_table(df)
    t1 = pd.DataFrame(table1()).set_index("dp")
    t2 = pd.DataFrame(table2())
    for c in ("baseline", "P_os", "P_os+g", "P_os+g+p"):
        t2[c] = [f"{v / 1e12:.2f}T" if v >= 1e12 else f"{v / 1e9:.1f}B" for v in t2[c]]
    ctx = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prov": _provenance(df),
        "figures": figs,
        "comparison_html": comparison.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t") if len(comparison) else "",
        "comparison_md": comparison.to_markdown(index=False, floatfmt=".3g") if len(comparison) else "",
        "peers_html": peers.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t", na_rep="-") if len(peers) else "",
        "peers_md": peers.to_markdown(index=False, floatfmt=".3g") if len(peers) else "",
        "offload_html": one_card.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t", na_rep="-") if len(one_card) else "",
        "offload_md": one_card.astype(object).where(one_card.notna(), None).to_markdown(index=False, floatfmt=".3g", missingval="-") if len(one_card) else "",
        "sim_html": sim.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t") if len(sim) else "",
        "sim_md": sim.to_markdown(index=False, floatfmt=".3g") if len(sim) else "",
        "table1_html": t1.to_html(float_format=lambda x: f"{x:.2f}", classes="t"),
        "table2_html": t2.to_html(index=False, classes="t"),
        "table1_md": t1.to_markdown(floatfmt=".2f"),
        "table2_md": t2.to_markdown(index=False),
        "projection_html": pd.DataFrame(proj_table).to_html(index=False, classes="t"),
        "projection_md": pd.DataFrame(proj_table).to_markdown(index=False),
    }
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["html"]))
    (out / "index.html").write_text(env.get_template("report.html.j2").render(**ctx))
    (out / "summary.md").write_text(env.get_template("summary.md.j2").render(**ctx))
    return out / "index.html"
