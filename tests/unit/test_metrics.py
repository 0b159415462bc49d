"""Live-tensor tracker, storage accounting, analytic formulas and the communication ledger."""

from __future__ import annotations

import pytest
import torch

from zerobench.config import ConfigError
from zerobench.metrics.analytic import model_state_bytes_analytic, paper_model_state_bytes
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import LiveTensorTracker, TrackedOutOfMemory, resize_storage, storage_bytes
from zerobench.zero.config import LossScaleConfig, ZeroConfig
from zerobench.zero.optim.loss_scale import DynamicLossScaler


def test_tracker_follows_allocations_and_frees():
    with LiveTensorTracker() as tr:
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.empty(500, dtype=torch.float64)
        assert tr.current == 4000 + 4000
        del b
        assert tr.current == 4000
        c = a.view(10, 100)  # a view allocates nothing
        assert tr.current == 4000
        resize_storage(c, 0)
        assert tr.current == 0
        resize_storage(a, 4000)
        assert tr.current == 4000
    assert tr.peak == 8000


def test_tracker_sees_storage_resizes_made_by_anyone():
    """FSDP1 frees its unsharded flat parameter with ``storage.resize_(0)`` and re-grows it later: no
    operator reports either, yet the peak must not count a freed storage (nor miss a re-grown one)."""
    real = torch.UntypedStorage.resize_
    with LiveTensorTracker() as tr:
        a = torch.empty(1000)
        a.untyped_storage().resize_(0)  # as torch.distributed.utils._free_storage does
        assert tr.current == 0
        b = torch.empty(500)
        assert tr.peak == 4000 and tr.current == 2000
        a.untyped_storage().resize_(4000)  # _alloc_storage
        assert tr.current == 6000 and tr.peak == 6000
        with LiveTensorTracker() as inner:  # nested trackers both see it
            a.untyped_storage().resize_(0)
            assert inner.current == 0 and tr.current == 2000
        assert b.numel() == 500
    assert torch.UntypedStorage.resize_ is real  # restored when the last tracker exits


def test_tracker_budget_raises():
    with LiveTensorTracker(budget_bytes=10_000) as tr:
        keep = torch.empty(2000)  # 8000 bytes
        with pytest.raises(TrackedOutOfMemory, match="exceed the budget"):
            torch.empty(1000)
        assert tr.current == 8000 and keep.numel() == 2000


def test_storage_bytes_counts_views_once():
    t = torch.empty(100)
    assert storage_bytes([t, t[10:20], t.view(10, 10)]) == 400


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("nd", [1, 4, 64])
def test_general_formula_reduces_to_paper(stage, nd):
    psi = 7.5e9
    cats = model_state_bytes_analytic(psi, nd, stage, 2, 2, 4, 8)
    assert sum(cats.values()) == pytest.approx(paper_model_state_bytes(psi, nd, stage))


def test_paper_table1_spot_values():
    # Table 1 (7.5B, N_d = 64): 120 GB baseline, 31.4 GB P_os, 16.6 GB P_os+g, 1.88 GB P_os+g+p.
    psi = 7.5e9
    got = [paper_model_state_bytes(psi, 64, s) / 1e9 for s in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.05)


def test_comm_ledger_paper_accounting():
    led = CommLedger()
    led.record("all_reduce", "dp", 4, 1000, 4000, "grad")
    led.record("reduce_scatter", "dp", 4, 1000, 2000, "grad")
    led.record("all_gather", "tp", 2, 100, 400, "param")
    assert led.volume_elements("dp") == 2 * 750 + 750
    assert led.volume_elements("tp") == 50
    summary = {(s["group"], s["op"]): s for s in led.summary()}
    assert summary[("dp", "all_reduce")]["volume_bytes"] == 6000


def test_loss_scaler_policy():
    s = DynamicLossScaler(LossScaleConfig(init_scale=1024, growth_interval=2), enabled=True)
    s.update(overflow=True)
    assert s.scale == 512 and s.skipped_steps == 1
    s.update(False)
    s.update(False)
    assert s.scale == 1024
    off = DynamicLossScaler(LossScaleConfig(), enabled=False)
    off.update(True)
    assert off.scale == 1.0


def test_loss_scaler_hysteresis_as_deepspeed():
    """DeepSpeed's ``hysteresis`` 2: the first overflow since the scale last grew only skips, later ones back off;
    growing the scale restores it. Every overflowing step is skipped."""
    s = DynamicLossScaler(LossScaleConfig(init_scale=1024, growth_interval=2, hysteresis=2), enabled=True)
    s.update(True)
    assert (s.scale, s.skipped_steps) == (1024, 1)
    s.update(True)
    s.update(True)
    assert (s.scale, s.skipped_steps) == (256, 3)
    s.update(False)
    s.update(False)
    assert s.scale == 512 and s.hysteresis_left == 2
    back = DynamicLossScaler(LossScaleConfig(hysteresis=2), enabled=True)
    s.update(True)
    back.load_state_dict(s.state_dict())
    assert (back.scale, back.hysteresis_left) == (512, 1)
    with pytest.raises(ConfigError, match="hysteresis must be >= 1"):
        ZeroConfig(loss_scale=LossScaleConfig(hysteresis=0)).validate()
