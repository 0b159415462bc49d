"""The paper's cluster figures predicted on the stated V100 DGX-2 (issue 22): the one fitted factor, the
predicted (unfitted) anchor, and the recorded predictions in ``results/reference/sim-paper-v100-dgx2``
recomputed exactly, so docs/simulator.md's table cannot drift from the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb
from zerobench.results.rows import read_rows
from zerobench.sim import paper as P
from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.published import load, stack
from zerobench.sim.stated import DEVICES

REF = Path(__file__).resolve().parents[2] / "results" / "reference" / "sim-paper-v100-dgx2"


@pytest.fixture(scope="module")
def predicted():
    return P.predict_paper("v100-dgx2")


@pytest.mark.parametrize("convention", list(P.CONVENTIONS))
def test_the_fit_reproduces_its_anchor_and_nothing_else_is_fitted(convention):
    prof, fit = P.fitted_profile("v100-dgx2", convention)
    a = P.ANCHORS[0]
    assert a.fitted and not any(x.fitted for x in P.ANCHORS[1:])
    assert a.run["gpus"] == 1 and "ZeRO" not in a.what  # one GPU, no ZeRO: one factor from a non-ZeRO point
    # Megatron-LM's own figures replay as its own program, the published table's for its rows (its PyTorch 1.1 copies
    # the RNG state through the device, the paper's PyTorch 1.2 does not)
    row = next(r for r in load() if r.id == fit["table_row"])
    assert stack(row).name == P.ANCHOR_STACK != P.PAPER_STACK
    again = P._sim(
        {**P._MEGATRON_BASE, **a.run},
        StatedProfile(dataclasses.replace(DEVICES[a.device], compute_scale=fit["value"]), P.ANCHOR_STACK),
    )
    assert P._value(again, a.kind, convention) == pytest.approx(a.value, rel=1e-9)
    assert prof.dev.compute_scale == fit["value"] and 0.5 < fit["value"] < 2


@pytest.mark.slow  # the fixture simulates every paper point (~17 s on 2 cores)
def test_recorded_predictions_are_what_the_code_computes(predicted):
    from zerobench.sim.paper_text import paper_rows

    def key(r):
        return (r["metric"], r["convention"], r.get("what") or f"{r['figure']} {r['label']}", r.get("candidate"))

    now = {key(r): r["value"] for r in paper_rows(predicted)}
    recorded = {key(r): r["value"] for r in read_rows(REF)}
    assert now.keys() == recorded.keys()
    for k, v in recorded.items():
        assert now[k] == pytest.approx(v, rel=1e-9), k


@pytest.mark.slow  # the fixture simulates every paper point (~17 s on 2 cores)
def test_what_the_predictions_say(predicted):
    assert predicted["chosen"] == "hardware"
    hw = predicted["conventions"]["hardware"]
    anchor = hw["anchors"][1]
    # Megatron-LM at 512 GPUs, predicted: -6.6%, with its PyTorch 1.1's RNG state copies charged (-5.4% before them)
    assert not anchor["fitted"] and abs(anchor["error"]) < 0.07
    by = {c["what"]: c for c in hw["claims"]}
    z100 = by["ZeRO 100B on 400 V100"]
    assert z100["bound_holds"] and abs(z100["error"]) < 0.15  # the bound holds; the point within issue 59's 15%
    assert z100["step_time_s"] == pytest.approx(sum(z100["breakdown_s"].values()))
    fig3 = hw["figures"]["fig3"]
    assert [f["gpus"] for f in fig3] == [64, 128, 256, 400]
    pf = [f["at_paper_batch"]["hw_pflops_aggregate"] for f in fig3]
    assert pf[1] / pf[0] > 2.0  # 64 -> 128 GPUs: superlinear, and the breakdown says why:
    share = [f["at_paper_batch"]["breakdown_s"]["dp_comm"] / f["at_paper_batch"]["step_time_s"] for f in fig3]
    assert share[1] < share[0] / 2 and fig3[1]["micro_batch"] > fig3[0]["micro_batch"]


@pytest.mark.slow  # the fixture simulates every paper point (~17 s on 2 cores)
def test_max_size_points_come_from_the_planner(predicted):
    got = {c["what"]: c for c in predicted["max_size"]}
    assert len(got) == 2 and all(c["simulated"] > 0 for c in got.values())
    for c in got.values():
        assert c["error"] == pytest.approx(c["simulated"] / c["paper"] - 1)


@pytest.mark.slow  # the fixture simulates every paper point (~25 s on 2 cores)
def test_statements_without_a_configured_run_are_simulated_over_what_is_open(predicted):
    from zerobench.plan.suites import load_suite
    from zerobench.sim import paper_open as O
    from zerobench.sim.paper_text import format_paper, paper_rows

    mem = DEVICES["v100-dgx2"].mem_bytes
    for conv, r in predicted["conventions"].items():
        tnlg, meg = r["open"]
        assert not {c["what"] for c in r["claims"]} & {tnlg["what"], meg["what"]}  # beside the claims, not among them
        # Turing-NLG: every micro-batch from 1 to the planner's largest, on the paper's program at this convention's fit
        run = {**{k: P._rows("paper/fig2")[0][k] for k in ("seq", "vocab", "precision", "md")}, **O.TURING_NLG_RUN}
        top = P.largest_batch({**run, "checkpoint_activations": True, "bucket_size": 500_000_000}, mem)
        assert top >= 2 and [c["micro_batch"] for c in tnlg["candidates"]] == list(range(1, top + 1))
        tf = [c["simulated"] for c in tnlg["candidates"]]
        assert tf == sorted(tf)  # a larger micro-batch spends the same DP traffic over more compute
        # Megatron-LM within a node: exactly the Fig 2 baselines whose MP fits in a node, as Fig 2 simulated them
        per_node = load_suite("paper/fig2")["cluster"]["gpus_per_node"]
        want = [x["label"] for x in P._rows("paper/fig2") if x["system"] == "megatron" and x["tp"] <= per_node]
        assert [c["label"].split(",")[0] for c in meg["candidates"]] == want and len(want) == 3
        for c, label in zip(meg["candidates"], want):
            assert c["simulated"] == P._value(r["figures"]["fig2"][label], "tflops", conv)
        for s in (tnlg, meg):
            for c in s["candidates"]:
                assert c["error"] == pytest.approx(c["simulated"] / s["paper"] - 1)
                assert c["step_time_s"] == pytest.approx(sum(c["breakdown_s"].values()))
            assert s["within"] == [c["label"] for c in s["candidates"] if abs(c["error"]) <= 0.15]
    rows = [x for x in paper_rows(predicted) if x["metric"] == "sim_paper_open"]
    per_conv = sum(len(s["candidates"]) for s in predicted["conventions"]["hardware"]["open"])
    assert len(rows) == 2 * per_conv and all(x["candidate"] and x["left_open"] for x in rows)
    text = format_paper(predicted)
    assert "statements whose run the paper does not configure" in text and "within 15%:" in text


@pytest.mark.slow  # the fixture simulates every paper point (~25 s on 2 cores)
def test_the_report_tables_open_runs_below_the_claims(predicted):
    import pandas as pd

    from zerobench.report.sim_figures import claims_table, prediction_rows
    from zerobench.sim.paper_text import paper_rows

    t = claims_table(prediction_rows(pd.DataFrame(paper_rows(predicted))))
    hw = predicted["conventions"]["hardware"]
    n_claims = len(hw["anchors"]) + len(hw["claims"]) + len(predicted["max_size"])
    n_open = sum(len(s["candidates"]) for s in hw["open"])
    assert len(t) == n_claims + n_open
    assert (t["open run"].iloc[:n_claims] == "").all() and (t["open run"].iloc[n_claims:] != "").all()
    assert not t["fitted"].iloc[n_claims:].any() and t["fitted"].sum() == 1  # one fitted figure: the anchor


def test_bad_input_is_one_line():
    r = zb("simulate", "--paper", "--profile", "h100-dgx")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "v100-dgx2" in r.stderr
    r = zb("simulate", "--suite", "paper/fig3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--profile" in r.stderr


def test_a_stated_profile_predicts_a_paper_suite():
    import json

    r = zb("simulate", "--profile", "v100-dgx2", "--suite", "paper/fig3", timeout=300)
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["dp"] for o in out] == [4, 8, 16, 25] and all(o["hw_tflops_per_gpu"] > 10 for o in out)


@pytest.mark.slow  # the fixture simulates every paper point (~50 s on 2 cores)
@pytest.mark.xfail(
    strict=True,
    reason=(
        "issue 59's bar on the paper's claims is not met, and no cost the model names explains the misses: the 8B-100B "
        "average +17.8% (a point claim beyond 15%) and Megatron-LM at MP 32 across two DGX-2 +185% ('about 5')"
    ),
)
def test_every_bound_holds_and_every_point_claim_is_within_15_percent(predicted):
    hw = predicted["conventions"]["hardware"]
    for c in hw["claims"]:
        if c["bound_holds"] is None:
            assert abs(c["error"]) <= 0.15, c["what"]
        else:
            assert c["bound_holds"], c["what"]
