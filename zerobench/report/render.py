"""``zerobench report``: rows -> figures -> one self-contained HTML page and a Markdown summary.

Figures are PNG files in ``figures-<id>/`` next to ``index.html`` (a report replaces the pages and figures of an
earlier one in its directory as one transaction: ``render``); the Markdown summary (for a pull-request comment) holds
the provenance, the DP-vs-ZeRO comparison and the paper's tables. The cluster-scale figures for the paper's
Figs 2, 3, 4 and 8 come from the simulator on the stated V100 DGX-2 (``report.sim_figures``); they are
labelled as simulated, and the paper's stated numbers are drawn as labelled reference markers.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import shutil
from pathlib import Path

import jinja2
import pandas as pd

from zerobench.config import ConfigError
from zerobench.files import fsync_dir, replace_file
from zerobench.report import aggregate, figures, paper_figures, sim_figures
from zerobench.report.comparison import comparison_table, missed_baselines
from zerobench.report.maxsize import maxsize_table
from zerobench.report.offload import offload_table
from zerobench.report.peers import peers_table
from zerobench.results.status import row_keys, with_run_key, without_verdicts

TEMPLATES = Path(__file__).resolve().parents[2] / "report_templates"
FIGURES = "figures-"
"""A report's figures live in ``figures-<id>/`` beside its pages; each report draws a new one (``render``)."""
FIGURES_NAME = re.compile(r"figures-[0-9a-f]{8}")


def _provenance(df: pd.DataFrame) -> dict:
    """The report's provenance line. The hardware and torch are those of the rows that hold figures
    (``aggregate.measurement_rows``): a run's status row carries the provenance of whoever recorded its end."""

    def uniq(col, rows=df):
        return sorted({str(v) for v in rows[col].dropna()}) if col in rows else []

    measured = aggregate.measurement_rows(df)

    return {
        "commits": [c[:12] for c in uniq("provenance.commit")],
        "dirty": any(df["provenance.dirty"].fillna(False)) if "provenance.dirty" in df else None,
        "hardware": uniq("provenance.hardware.device", measured),
        "hardware_classes": uniq("provenance.hardware.class", measured),
        "torch": uniq("provenance.torch_version", measured),
        "zerobench": uniq("provenance.zerobench_version"),
        "dates": (min(uniq("provenance.timestamp")), max(uniq("provenance.timestamp")))
        if "provenance.timestamp" in df
        else None,
        "suites": uniq("suite"),
        "runs": len(without_verdicts(with_run_key(df))[0].groupby(["rows_file", "run_id"])),  # a gate's verdicts: none
        "rows": len(df),
        # training runs that are not data points: incomplete (no run_status row), failed, oom, ... (not counted)
        "not_counted": aggregate.run_statuses(df),
    }


def render(results: list[str], out_dir: str) -> Path:
    """Render the report of the rows under ``results`` into ``out_dir``, as one transaction: the figures are drawn
    into a hidden directory, which is renamed to ``figures-<id>/`` once they all are; then ``summary.md`` and
    ``index.html`` are replaced, each atomically, and only then the figures of the report they replaced are removed.
    A report stopped at any point (an error, a kill) leaves the earlier pages whole and every figure they show in
    place, never old pages next to some new figures."""
    from zerobench.results import load

    frames, seen, not_run = [], set(), []
    for r in results:
        try:
            frame = load(r)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        not_run += _not_run(r, row_keys(frame))
        # a rows file reached twice (a path given in two spellings, a directory and one inside it) is read once:
        # twice, its runs would count as two repeats of one measurement, with a spread of 0
        frames.append(frame[~frame["rows_file"].isin(seen)])
        seen |= set(frame["rows_file"])
    df = pd.concat(frames, ignore_index=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = _figure_dirs(out)
    token = secrets.token_hex(4)
    staging = out / f".{FIGURES}{token}.partial"
    staging.mkdir()
    try:
        ctx = _context(df, staging)
        ctx["prov"]["not_run"] = not_run
        figures_dir = out / f"{FIGURES}{token}"
        os.rename(staging, figures_dir)  # whole: every figure drawn, or none of them in place
        fsync_dir(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a report stopped partway leaves no half-drawn figures
    for f in ctx["figures"]:
        f["path"] = f"{figures_dir.name}/{f['path']}"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["html", "html.j2"])
    )
    # replaced, never written through a link planted at the name (its target would be overwritten)
    replace_file(out / "summary.md", env.get_template("summary.md.j2").render(**ctx))
    replace_file(out / "index.html", env.get_template("report.html.j2").render(**ctx))
    for old in before - {figures_dir}:  # the figures of the report these pages replaced: no page refers to them now
        shutil.rmtree(old, ignore_errors=True)
    return out / "index.html"


def _not_run(result: str, rows: list[dict]) -> list[dict]:
    """Each sweep under ``result`` with planned runs that left no row (stopped before them, or not yet reached),
    described with the runs named from the report's argument: without it the report would show the rest as the whole
    suite. ``rows``: ``result``'s rows as read (``row_keys``), not read again."""
    import dataclasses

    from zerobench.results.outdir import unfinished

    base = Path(result).as_posix().rstrip("/")
    return [
        {
            "line": dataclasses.replace(u, labels=[f"{base}/{label}" for label in u.labels]).describe(),
            "stopped": u.writer is None,
        }
        for u in unfinished(result, rows)
    ]


def _figure_dirs(out: Path) -> set[Path]:
    """The figure directories of earlier reports in ``out``: named as ``render`` names them and holding only PNGs, so
    that a directory of the user's that happens to share the prefix is never taken for one."""
    return {
        d
        for d in out.glob(f"{FIGURES}*")
        if FIGURES_NAME.fullmatch(d.name)
        and d.is_dir()
        and not d.is_symlink()
        and all(f.suffix == ".png" and f.is_file() and not f.is_symlink() for f in d.iterdir())
    }


def _context(df: pd.DataFrame, out: Path) -> dict:
    """The templates' context, every figure drawn into ``out`` (a figure's ``path`` is its name there)."""
    from zerobench.plan.tables import table1, table2

    runs = aggregate.runs_table(df)
    losses = aggregate.losses_table(df)
    figs = []
    for fn, title, args in (
        (figures.memory_ledger, "Memory per rank, measured vs analytic", (runs,)),
        (figures.comm_volume, "Communication per step vs 2Ψ / 3Ψ", (runs,)),
        (figures.throughput, "Throughput by ZeRO stage", (runs,)),
        (figures.loss_curves, "Loss curves", (losses,)),
    ):
        res = fn(*args, out)
        if res:
            figs.append({"path": res[0].name, "title": title, "caption": res[1]})
    maxsize = maxsize_table(df)
    for fn, title, args in (
        (paper_figures.fig2_measured, "Fig 2 (measured): throughput vs model size", (runs,)),
        (paper_figures.fig3_measured, "Fig 3 (measured): scaling with devices", (runs,)),
        (paper_figures.fig4_measured, "Fig 4 (measured): max model size", (maxsize,)),
        (paper_figures.fig678_measured, "Figs 6-8 (measured): C1-C5", (runs, maxsize)),
    ):
        res = fn(*args, out)
        if res:
            figs.append({"path": res[0].name, "title": title, "caption": res[1]})
    peers = peers_table(df)
    res = figures.peers(peers, out)
    if res:
        figs.append({"path": res[0].name, "title": "zerobench vs peers", "caption": res[1]})
    sim = aggregate.sim_validation_table(df)
    res = figures.sim_validation(sim, out)
    if res:
        figs.append({"path": res[0].name, "title": "Simulator: predicted vs measured step time", "caption": res[1]})
    predicted = sim_figures.prediction_rows(df)
    figs += sim_figures.simulated_figures(predicted, out)
    paper_claims = sim_figures.claims_table(predicted)
    published = sim_figures.published_table(df)
    comparison = comparison_table(runs, maxsize, missed_baselines(df))
    one_card = offload_table(df)
    t1 = pd.DataFrame(table1()).set_index("dp")
    t2 = pd.DataFrame(table2())
    for c in ("baseline", "P_os", "P_os+g", "P_os+g+p"):
        t2[c] = [f"{v / 1e12:.2f}T" if v >= 1e12 else f"{v / 1e9:.1f}B" for v in t2[c]]
    ctx = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prov": _provenance(df),
        "figures": figs,
        "comparison_html": comparison.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t")
        if len(comparison)
        else "",
        "comparison_md": comparison.to_markdown(index=False, floatfmt=".3g") if len(comparison) else "",
        "peers_html": peers.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t", na_rep="-")
        if len(peers)
        else "",
        "peers_md": peers.to_markdown(index=False, floatfmt=".3g") if len(peers) else "",
        "offload_html": one_card.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t", na_rep="-")
        if len(one_card)
        else "",
        "offload_md": one_card.astype(object)
        .where(one_card.notna(), None)
        .to_markdown(index=False, floatfmt=".3g", missingval="-")
        if len(one_card)
        else "",
        "sim_html": sim.to_html(index=False, float_format=lambda x: f"{x:.3g}", classes="t") if len(sim) else "",
        "sim_md": sim.to_markdown(index=False, floatfmt=".3g") if len(sim) else "",
        "table1_html": t1.to_html(float_format=lambda x: f"{x:.2f}", classes="t"),
        "table2_html": t2.to_html(index=False, classes="t"),
        "table1_md": t1.to_markdown(floatfmt=".2f"),
        "table2_md": t2.to_markdown(index=False),
        "paper_sim_html": paper_claims.to_html(index=False, classes="t") if len(paper_claims) else "",
        "paper_sim_md": paper_claims.to_markdown(index=False) if len(paper_claims) else "",
        "published_sim_html": published.to_html(index=False, classes="t") if len(published) else "",
        "published_sim_md": published.to_markdown(index=False) if len(published) else "",
    }
    return ctx
