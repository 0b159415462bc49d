"""ZeRO-Offload, parameter offload, the NVMe tier and 8-bit Adam: parity with non-offloaded training and
with the single-process reference, and the device/host memory ledger as numbers.

On a CPU-only machine device and host are the same memory, but the offloaded engine keeps separate host
buffers and copies through them (gradients down per bucket, parameters back up per chunk, stage-3 shards
up for every gather), so everything below exercises those paths. The CPU step runs the same C++ AdamW
kernel as the non-offloaded step, so fp32 (and bf16) offloaded training is expected to be *bit-equal* to
non-offloaded training; the issue's bar is 1e-6.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from tests.distributed.test_parity import BF16_UPDATE_RTOL
from tests.helpers.dist import run_distributed
from tests.helpers.scenarios import Scenario, run_scenarios
from tests.helpers.workers_engine import adam_bits_losses, checkpoint_resume, offload_ledgers
from zerobench.zero import LossScaleConfig

pytestmark = pytest.mark.dist

OFFLOADS = [("cpu", "none"), ("nvme", "none")]
FP16 = dict(steps=4, loss_scale=LossScaleConfig(init_scale=2.0**28, backoff_factor=2.0**-14))


def _variants(dp, stage, precision="fp32", **kw):
    """The plain scenario and its offloaded variants (parameter offload at stage 3)."""
    out = [Scenario(dp, stage, precision, **kw)]
    out += [Scenario(dp, stage, precision, offload=o, offload_param=p, **kw) for o, p in OFFLOADS]
    if stage == 3:
        out += [
            Scenario(dp, 3, precision, offload="cpu", offload_param="cpu", **kw),
            Scenario(dp, 3, precision, offload="nvme", offload_param="cpu", **kw),
        ]
    return out


def _grid():
    scs = []
    for stage in (1, 2, 3):
        scs += _variants(2, stage) + _variants(1, stage) + _variants(2, stage, "bf16")
        scs += _variants(2, stage, accum=2) + _variants(2, stage, clip=0.05) + _variants(2, stage, "fp16", **FP16)
    scs += [
        Scenario(2, 2, optim_bits=8),
        Scenario(2, 2, offload="cpu", optim_bits=8),
        Scenario(2, 3, offload="nvme", offload_param="cpu", optim_bits=8),
        Scenario(2, 3, optim_bits=8),
    ]
    return scs


@pytest.fixture(scope="module")
def grid():
    return run_distributed(run_scenarios, 2, _grid(), True, timeout=400)


def _max_param_diff(a: dict, b: dict) -> float:
    return max(float(np.abs(a[n] - b[n]).max()) for n in a)


def _cases():
    for sc in _grid():
        if sc.offload != "none":
            yield pytest.param(sc, id=sc.key)


@pytest.mark.parametrize("sc", list(_cases()))
def test_offloaded_training_equals_non_offloaded(grid, sc):
    import dataclasses

    plain = dataclasses.replace(sc, offload="none", offload_param="none")
    for rank_res in grid:
        r, p = rank_res[sc.key], rank_res[plain.key]
        assert r["max_update"] > 1e-4, "parameters did not move: the comparison would be vacuous"
        assert _max_param_diff(r["params"], p["params"]) <= 1e-6, (sc.key, _max_param_diff(r["params"], p["params"]))
        assert r["stepped"] == p["stepped"]
        assert abs(r["loss_scale"] - p["loss_scale"]) == 0
        # ... and with the single-process reference, as the plain engine is (tests/distributed/test_parity.py)
        if sc.optim_bits == 8:
            continue
        if sc.precision == "fp32":
            assert r["max_diff"] <= 1e-5 and r["loss_diff"] <= 1e-5, r
        else:
            assert r["update_rel_err"] <= BF16_UPDATE_RTOL and r["loss_diff"] <= 1e-3, r


def test_fp16_overflow_skips_the_offloaded_step_too(grid):
    for stage in (1, 2, 3):
        sc = Scenario(2, stage, "fp16", offload="cpu", **FP16)
        for rank_res in grid:
            assert rank_res[sc.key]["stepped"] == [False, True, True, True]


def test_offload_moves_model_states_off_the_device(grid):
    """Device ledger: optimizer offload leaves the parameters (and, stage 1, the full gradient buffer);
    parameter offload leaves nothing persistent on the device. The rest is on the host or in NVMe files."""
    for rank_res in grid:
        led = {
            (s, o, p): rank_res[Scenario(2, s, "bf16", offload=o, offload_param=p).key]["ledger"]
            for s, o, p in [
                (1, "cpu", "none"),
                (2, "cpu", "none"),
                (3, "cpu", "none"),
                (3, "cpu", "cpu"),
                (2, "nvme", "none"),
            ]
        }
        plain2 = rank_res[Scenario(2, 2, "bf16").key]["ledger"]
        for key, L in led.items():
            assert L["master"] == 0 and L["optimizer_states"] == 0, (key, L)
            assert L["host_master"] == plain2["master"] // 1, (key, L)  # the same 4Ψ/N, now on the host
        assert led[(2, "cpu", "none")]["grads"] == 0 and led[(2, "cpu", "none")]["params"] == plain2["params"]
        assert led[(1, "cpu", "none")]["grads"] == plain2["params"]  # stage 1 keeps its full gradient buffer
        assert led[(3, "cpu", "cpu")]["params"] == 0 and led[(3, "cpu", "cpu")]["grads"] == 0
        assert led[(3, "cpu", "cpu")]["host_params"] == led[(3, "cpu", "none")]["params"]
        assert led[(2, "nvme", "none")]["host_optimizer_states"] == 0
        assert led[(2, "nvme", "none")]["nvme_optimizer_states"] == plain2["optimizer_states"]


@pytest.fixture(scope="module")
def ledgers():
    # "mini": Psi = 1.86M parameters, alignment padding well under 1%.
    return run_distributed(offload_ledgers, 2, "mini")


def test_offload_ledger_matches_the_analytic_split(ledgers):
    """Measured device and host bytes vs the formulas: stage 2 + optimizer offload keeps 2Ψ on the device
    (bf16 parameters; the gradient partition lives on the host too) and 16Ψ/N on the host (4 master + 8
    moments + 2 gradients + 2 parameter copy-out); 8-bit moments take 2 + 8/2048 bytes instead of 8."""
    for r in ledgers:
        psi = r["psi"]
        for key, m in r["configs"].items():
            for cat, expected in {**m["analytic"], **m["host_analytic"]}.items():
                assert expected <= m["ledger"][cat] <= expected * 1.01 + 64, (key, cat, m["ledger"], expected)
        s2 = r["configs"]["s2-cpu"]
        assert 2 * psi <= s2["device"] <= 2 * psi * 1.01
        assert 16 * psi / 2 <= s2["host"] <= 16 * psi / 2 * 1.01
        k8 = r["configs"]["s2-adam8"]["ledger"]["optimizer_states"] / (psi / 2)
        assert 2.0 <= k8 <= 2.02, k8  # K = 4 + 2.004 = 6.004 instead of 12
        p3 = r["configs"]["s3-cpu-param"]
        assert p3["device"] == 0
        # Device bytes of parameters under parameter offload: the gathered units, never the model.
        bound = p3["root_bytes"] + 2 * p3["largest_block_bytes"] + p3["largest_block_bytes"] // 2
        assert 0 < p3["peak_gathered"] <= bound, (p3["peak_gathered"], bound)


@pytest.mark.slow
def test_eight_bit_adam_tracks_fp32_adam_for_200_steps():
    """Stated tolerance: over 200 steps on the tiny GPT (loss 6.2 -> 3.3) the 8-bit run's loss stays within
    1% of the fp32 run's at every step and within 0.5% on average over the last 50 (measured: 0.09% max,
    0.05% average)."""
    r = run_distributed(adam_bits_losses, 2, 200, [32, 8], "none", "tiny", timeout=400)[0]
    a, b = r[32]["losses"], r[8]["losses"]
    assert a[-1] < 0.7 * a[0], "fp32 run did not learn: the comparison would be vacuous"
    assert max(abs(x - y) / x for x, y in zip(a, b)) <= 0.01
    assert abs(statistics.mean(b[-50:]) / statistics.mean(a[-50:]) - 1) <= 0.005


@pytest.mark.parametrize(
    "stage,offload,param,bits", [pytest.param(2, "cpu", "none", 32, marks=pytest.mark.slow), (3, "nvme", "cpu", 8)]
)
def test_checkpoint_with_offload_resumes(tmp_path, stage, offload, param, bits):
    """Offloaded states save and load like device ones. 8-bit moments are saved decoded (fp32) so that a
    checkpoint stays independent of the layout; they reload exactly onto the same layout (re-quantizing a
    decoded block gives the same codes), so the 8-bit case resumes at the same DP degree and buckets —
    resharding them re-blocks and so re-quantizes, which is not exact."""
    zc = dict(
        offload_optimizer=offload,
        offload_param=param,
        optim_bits=bits,
        nvme_path=str(tmp_path / "nvme"),
        same_layout=bits == 8,
    )
    for r in run_distributed(checkpoint_resume, 4, stage, str(tmp_path / "ckpt"), zc):
        assert r["moved"] > 1e-4
        assert r["diff"] <= 1e-6, r
        assert r["step_after_load"] == 2
        assert r["single_vs_saved"] == 0.0, r
