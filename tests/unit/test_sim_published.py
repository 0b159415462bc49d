"""The simulator against published training throughput it was never fitted to (issue 59): the committed table
(``results/reference/sim-published``), its split, its readings, the fits, the bars, and the recorded predictions
recomputed exactly."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb
from zerobench.results.rows import read_rows
from zerobench.sim import published as P
from zerobench.sim import published_validate as V

REF = Path(__file__).resolve().parents[2] / "results" / "reference" / "sim-published"


@pytest.fixture(scope="module")
def rows():
    return P.load()


def test_the_table_is_split_as_the_issue_asks(rows):
    cal = [r for r in rows if r.split == "calibration"]
    held = [r for r in rows if r.split == "held_out"]
    per_class = collections.Counter(r.device_class for r in cal)
    assert all(n == 1 for n in per_class.values()) and not any(r.zero for r in cal)
    assert len(held) >= 20 and len({r.device_class for r in held}) >= 3
    assert sum(r.zero == 3 and r.gpus >= 64 for r in held) >= 5
    own = [r for r in rows if r.framework.startswith("zerobench")]
    assert all(r.source.startswith("https://") and r.where for r in rows if r not in own)
    assert all((REF.parents[2] / r.source).is_file() and r.where and r.split == "calibration" for r in own)
    assert len(rows) - len(own) >= 25


def test_the_own_run_calibration_is_its_committed_rows(rows):
    """The H100's calibration figure is zerobench's own run on a lent H100 (stage 0, a world of 1): the tokens of a
    step over the mean of the step medians its two rounds recorded, as the row's ``where`` says."""
    import statistics

    (r,) = [r for r in rows if r.framework.startswith("zerobench")]
    data = REF.parents[2] / Path(r.source).parent / "sim-validation"
    steps = [
        x["value"]
        for rnd in ("round-1", "round-2")
        for x in read_rows(data / rnd)
        if x["metric"] == "step_time_s" and x["run_id"].endswith("-1.3b-s0")
    ]
    assert len(steps) == 2
    assert r.published == pytest.approx(r.micro_batch * r.seq / statistics.mean(steps), abs=0.5)
    assert (r.zero, r.gpus, r.device_class, P.stack(r).name) == (0, 1, "h100", "zerobench")


def test_each_row_runs_the_attention_it_states(rows):
    """llm-foundry's rows run FlashAttention in Triton (``flash-triton``) or FlashAttention-2 (``flash``, with
    its own source); the Megatron rows their materialized paths."""
    from zerobench.sim.software import SDPA_FLASH2, TRITON_FLASH

    want = {"flash": SDPA_FLASH2, "flash-triton": TRITON_FLASH}
    foundry = [r for r in rows if r.framework.startswith("llm-foundry")]
    assert {r.attention for r in foundry} == {"flash", "flash-triton"}
    for r in foundry:
        st = P.stack(r)
        assert st.attention is want[r.attention], r.id
        assert ("flash-attn 2.4.2" in st.sources["attention"]) == (r.attention == "flash"), r.id
        assert (st.attention_io[:2] == (9, 11)) == (r.attention == "flash"), r.id  # unpad/pad around FA2 only
    assert all(P.stack(r).attention.kind == "materialized" for r in rows if r.framework.startswith("megatron"))


def test_formula_3_is_zerobench_hardware_count(rows):
    """Narayanan et al.'s eq. 3, 96·l·h²·(1 + s/6h + V/16lh) per token, is what zerobench counts with the
    recompute: a ``formula-3`` figure converts to tokens exactly."""
    r = next(r for r in rows if r.flop_convention == "formula-3")
    n, h, s, v = r.layers, r.hidden, r.seq, r.vocab
    assert P.flops_per_token(r, "hardware") == pytest.approx(96 * n * h * h * (1 + s / (6 * h) + v / (16 * n * h)))
    assert P.readings(r, {}) == {"exact": pytest.approx(r.published * 1e12 / P.flops_per_token(r, "hardware"))}


def test_relative_figures_are_read_against_their_reference(rows):
    by = {r.id: r for r in rows}
    base = P.readings(by["meg19-1.2b-1gpu"], by)
    assert set(base) == set(P.CONVENTIONS)  # Megatron-LM 2019 states no FLOP formula: both readings
    tp8 = P.readings(by["meg19-1.2b-tp8"], by)  # the same model: speedup x the baseline's tokens, over 8 GPUs
    assert tp8["hardware"] == pytest.approx(2.98 * base["hardware"] / 8)
    weak = P.readings(by["meg19-8.3b-tp8-a32"], by)  # 77% of the baseline's FLOP/s per GPU
    ref = by["meg19-1.2b-1gpu"]
    assert weak["model"] * P.flops_per_token(by["meg19-8.3b-tp8-a32"], "model") == pytest.approx(
        0.77 * base["model"] * P.flops_per_token(ref, "model")
    )


def test_a_run_whose_model_states_exceed_its_card_is_named(rows):
    """A row's setup is checked against its card by the model states alone (a lower bound). Megatron-LM alone at 8B
    and MP 4 on a 32 GB V100, as the DeepSpeed tutorial's table states it, holds 2.08B parameters a GPU at the 20
    bytes its fp16 optimizer keeps for each: 41.6 GB, which no 32 GB card holds. Every other row fits by this count.
    The row stays in the table and in the bars; the check names it."""
    from zerobench.sim.published_text import format_published

    floors = {r.id: P.model_state_floor(r) for r in rows}
    over = sorted(i for i, f in floors.items() if f["bytes"] > f["card_bytes"])
    assert over == ["ds20-meg-8b-tp4"], over
    f = floors["ds20-meg-8b-tp4"]
    h, layers, v = 3072, 72, 50688  # the GPT-2 vocabulary padded to 128 x MP 4
    assert f["params"] == v * h // 4 + 1024 * h + layers * (12 * h * h // 4 + 7 * h // 4 + 6 * h) + 2 * h
    assert f["per_param"] == 20 and f["bytes"] == pytest.approx(41.6e9, rel=2e-3) and f["card_bytes"] == 32 * 2**30
    z3 = floors["nar21-z3-530b-640"]
    assert z3["per_param"] == pytest.approx(16 / 640)  # ZeRO-3: every state partitioned over the 640 DP ranks
    by_id = {r.id: r for r in rows}
    recs = [
        {
            "row": by_id[i],
            "readings": {"exact": {"ratio": 1.0, "breakdown_s": {"compute": 1.0}}},
            "bar": "exact",
            "state_floor": floors[i],
        }
        for i in ("ds20-meg-4b-tp4", "ds20-meg-8b-tp4")
    ]
    text = format_published({"fits": {}, "records": recs, "summary": {}})
    named = text.split("exceed the card")[1]
    assert "ds20-meg-8b-tp4: 2.082B parameters a GPU x 20 bytes = 41.6 GB, on a 34.4 GB card" in named
    assert "ds20-meg-4b-tp4" not in named


def test_each_fit_names_its_one_figure(rows):
    fits = V.calibrations(rows)
    assert {f["row"] for f in fits["v100"].values()} == {"meg19-1.2b-1gpu"}
    assert fits["a100"]["exact"]["row"] == "nar21-1.7b-tp1-dp32"
    assert fits["h100"]["exact"]["row"] == "zb-h100-1.3b-1gpu"


def test_paper_and_table_share_the_v100_fit():
    from zerobench.sim.paper import fitted_profile

    for conv in ("hardware", "model"):
        assert fitted_profile("v100-dgx2", conv)[1]["value"] == V.calibration("v100", conv)["value"]


def test_a_bad_table_is_one_line(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("id,split\nx,held_out\n")
    r = zb("simulate", "--validate-published", str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "columns" in r.stderr
    r = zb("simulate", "--validate-published", "--profile", "a100-dgx")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--profile" in r.stderr


def test_rows_name_the_table_by_its_place_in_the_repository_and_its_bytes(tmp_path):
    """The rows' config is the table's path relative to the repository (the same config hash on every checkout,
    never this machine's directories) and the SHA-256 of what was read; a table elsewhere keeps the path given."""
    import hashlib

    from zerobench.sim.command import _table_identity

    data = P.TABLE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    committed = {"table": "results/reference/sim-published/published.csv", "table_sha256": digest}
    assert _table_identity(P.TABLE, data) == committed
    other = tmp_path / "t.csv"
    other.write_bytes(data)
    assert _table_identity(other, data) == {"table": str(other), "table_sha256": digest}
    assert P.load(other, data) == P.load(P.TABLE)
    recorded = read_rows(REF / "predicted")
    assert recorded and all(r["config"] == committed for r in recorded)


@pytest.mark.slow  # a subprocess that fits and predicts (~15 s on 2 cores)
def test_a_small_table_runs_end_to_end(tmp_path):
    """The command on a two-row table: the V100 calibration row and one held-out row, each with its reading."""
    lines = P.TABLE.read_text().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith(("meg19-1.2b-1gpu,", "meg19-1.2b-tp2,"))]
    table = tmp_path / "t.csv"
    table.write_text("\n".join(keep) + "\n")
    r = zb("simulate", "--validate-published", str(table), "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "meg19-1.2b-tp2" in r.stdout and "median" in r.stdout
    got = [x for x in read_rows(tmp_path / "out") if x["metric"] == "sim_published_ratio"]
    assert {x["row_id"] for x in got} == {"meg19-1.2b-1gpu", "meg19-1.2b-tp2"}
    cal = [x for x in got if x["row_id"] == "meg19-1.2b-1gpu"]
    assert all(x["value"] == pytest.approx(1.0, rel=1e-6) for x in cal)  # the fitted row reproduces its figure


@pytest.fixture(scope="module")
def predicted(rows):
    return V.predict(rows)


@pytest.mark.slow  # every row of the table simulated (~75 s on 2 cores)
def test_recorded_predictions_are_what_the_code_computes(predicted):
    from zerobench.sim.published_text import published_rows

    def key(r):
        return (r["metric"], r.get("row_id") or r.get("group"), r.get("reading"))

    now = {key(r): r["value"] for r in published_rows(predicted)}
    recorded = {key(r): r["value"] for r in read_rows(REF / "predicted")}
    assert now.keys() == recorded.keys()
    for k, v in recorded.items():
        assert now[k] == pytest.approx(v, rel=1e-9), k


@pytest.mark.slow  # every row of the table simulated (~75 s on 2 cores)
def test_zero3_at_scale_comes_out_bound_by_its_collectives(predicted):
    """DeepSpeed's 2021 ZeRO-3 (GPT-3 175B, no model parallelism): the published throughput falls 3.3x from 384 to
    1536 GPUs at a fixed batch. The replay names the cause: per-parameter gathers whose ring latency and list copies
    (a kernel per rank) grow with the ranks, run back to back with compute, so the DP collectives and their copies
    become most of the step."""
    by = {x["row"].id: x for x in predicted["records"]}
    tok = [by[f"nar21-z3-175b-{n}"]["readings"]["exact"] for n in (384, 768, 1536)]
    assert tok[0]["predicted"] / tok[2]["predicted"] > 2.5  # published: 144 / 44 = 3.3
    path = tok[2]["breakdown_s"]
    total = sum(path.values())
    assert path["dp_comm"] + path["copy"] > 0.75 * total and path["compute"] < 0.25 * total
    assert path["dp_comm"] > path["compute"] and path["copy"] > path["compute"]


@pytest.mark.slow  # every row of the table simulated (~75 s on 2 cores)
def test_held_out_bars(predicted):
    """Issue 59's bars on the held-out rows, as the current code predicts them: median |error| at most 10%, and at
    most 15% of the rows beyond 25%."""
    s = predicted["summary"]["all"]
    assert s["median_abs_error"] <= 0.10
    assert s["beyond_25"] <= 0.15 * s["rows"]


def test_held_out_bars_on_the_recorded_prediction(rows):
    """The same bars on the committed rows (the recorded prediction, which the slow tests recompute): every held-out
    row of the table counted once, in the reading its bar counts, over a set of the shape issue 59 asks for (at
    least 20 rows, 3 device classes, and 5 ZeRO-3 or FSDP FULL_SHARD rows at 64 GPUs or more). The second bar holds
    with no row to spare (8 of 56 beyond 25%)."""
    import json
    import statistics

    recs = [json.loads(line) for line in (REF / "predicted" / "rows.jsonl").read_text().splitlines()]
    held = [r for r in recs if r["metric"] == "sim_published_ratio" and r["split"] == "held_out" and r["counted"]]
    assert sorted(r["row_id"] for r in held) == sorted(r.id for r in rows if r.split == "held_out")
    assert len(held) >= 20 and len({r["device_class"] for r in held}) >= 3
    assert sum(r["zero"] == 3 and r["gpus"] >= 64 for r in held) >= 5
    errs = [abs(r["value"] - 1) for r in held]
    assert statistics.median(errs) <= 0.10
    assert sum(e > 0.25 for e in errs) <= 0.15 * len(errs)


def test_the_report_draws_the_table(rows):
    """The report's table comes from rows handed to it, else from the recorded prediction: one line per row of the
    published table, in the reading its bars count."""
    import pandas as pd

    from zerobench.report.sim_figures import published_table

    recorded = published_table(pd.DataFrame())
    assert list(recorded["row"]) == [r.id for r in rows]
    given = pd.DataFrame(
        [
            {
                "metric": "sim_published_ratio",
                "counted": True,
                "row_id": "x",
                "split": "held_out",
                "device_class": "a100",
                "framework": "f",
                "gpus": 8,
                "tp": 1,
                "zero": 3,
                "published": 2.0,
                "published_metric": "speedup",
                "value": 1.25,
                "reading": "exact",
            }
        ]
    )
    t = published_table(given)
    assert list(t["row"]) == ["x"] and t["predicted / published"].iloc[0] == 1.25


def test_the_docs_table_is_the_recorded_prediction(rows):
    """docs/simulator.md's "Every row" table is the recorded prediction: every row of the table, each ratio as the
    report draws it (a stale copy would tell readers figures the code no longer computes)."""
    import pandas as pd

    from zerobench.report.sim_figures import published_table

    recorded = published_table(pd.DataFrame())
    doc = (REF.parents[2] / "docs" / "simulator.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(doc) if ln.startswith("| row ") and "predicted / published" in ln)
    head = [c.strip() for c in doc[start].strip("|").split("|")]
    col = head.index("predicted / published")
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in doc[start + 2 :] if ln.startswith("|")]
    cells = cells[: next((i for i, c in enumerate(cells) if c[0] not in {r.id for r in rows}), len(cells))]
    assert [c[0] for c in cells] == list(recorded["row"])
    for c, ratio in zip(cells, recorded["predicted / published"]):
        assert float(c[col]) == pytest.approx(ratio, abs=5e-4), c[0]
