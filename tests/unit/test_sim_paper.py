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
        return (r["metric"], r["convention"], r.get("what") or f"{r['figure']} {r['label']}")

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
