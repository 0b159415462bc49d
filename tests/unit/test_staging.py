"""``StagingBuckets`` (stages 2-3): while another bucket's collective is in flight, a large bucket's gradients
are held as autograd made them, not copied into a second staging buffer; they are copied, scaled, when flushed
or when their bucket is taken; a small bucket is staged at once; a sole parameter is reduced as it is; and a
backward that raised midway leaves nothing held for the next micro-batch; a staging buffer is freed once its
collective was waited for; a deferred bucket's gradients stay held until it starts. No processes."""

from __future__ import annotations

import pytest
import torch

from zerobench.zero.grads.staging import SMALL_STAGING, StagingBuckets
from zerobench.zero.layout import ParamSpec, build_layout


@pytest.fixture
def stage():
    specs = [
        ParamSpec("a", (3000,), 0),
        ParamSpec("b", (3000,), 0),
        ParamSpec("c", (40,), 1),
        ParamSpec("d", (6000,), 2),
    ]
    layout = build_layout(specs, 2, 6000, 8)
    assert [b.params for b in layout.buckets] == [(0, 1), (2,), (3,)]
    return StagingBuckets(layout, torch.float32, torch.device("cpu"))


def _slot(stage, name):
    return next(s for s in stage.layout.params if s.name == name)


def test_a_large_buckets_gradients_are_held_until_flushed_then_copied_scaled(stage):
    a, b = torch.randn(3000), torch.randn(3000)
    stage.hold(_slot(stage, "a"), a, 0.5)
    stage.hold(_slot(stage, "b"), b, 0.5)
    assert stage.buffers == {}, "no staging buffer while held"
    assert [t is g for t, g in zip(stage.held_tensors(), (a, b))] == [True, True], "autograd's tensors, not copies"
    assert stage.landed[:2] == [True, True] and stage.must_wait(0)
    stage.flush()
    assert stage.held == {} and not stage.must_wait(0)
    assert torch.equal(stage.buffers[0][:6000], torch.cat([a, b]) * 0.5)


def test_taking_a_bucket_copies_what_was_held(stage):
    a, b = torch.randn(3000), torch.randn(3000)
    stage.hold(_slot(stage, "a"), a)
    stage.hold(_slot(stage, "b"), b)
    got = stage.pop(0)
    assert torch.equal(got[:6000], torch.cat([a, b])) and stage.held == {}


@pytest.mark.parametrize("deferred", [False, True])
def test_a_deferred_buckets_gradients_stay_held_until_it_starts(stage, deferred):
    """Once the collective in flight has finished, held gradients are staged at the next landing, unless their
    bucket is deferred (stage 3: a unit's last bucket, whose start frees the unit's parameters): then they, and
    the gradients landing after them, are staged when the bucket is taken, as one copy."""
    stage.deferred = frozenset({0} if deferred else ())
    a, b, c = torch.randn(3000), torch.randn(3000), torch.randn(40)
    stage.land(_slot(stage, "a"), a, None, busy=True)
    stage.land(_slot(stage, "c"), c, None, busy=False)  # another bucket's gradient, with nothing in flight
    assert 1 in stage.buffers
    assert (0 in stage.buffers) is not deferred and (0 in stage.held) is deferred
    stage.land(_slot(stage, "b"), b, None, busy=False)
    if deferred:
        assert stage.buffers.keys() == {1} and [t is g for t, g in zip(stage.held_tensors(), (a, b))] == [True] * 2
    assert torch.equal(stage.pop(0)[:6000], torch.cat([a, b])) and stage.held == {}


def test_a_small_bucket_or_one_already_staged_is_written_at_once(stage):
    assert not stage.large[1] and stage.layout.buckets[1].numel * SMALL_STAGING <= 6000
    c = torch.randn(40)
    stage.hold(_slot(stage, "c"), c)
    assert 1 in stage.buffers and stage.held == {} and torch.equal(stage.buffers[1][:40], c)
    a, b = torch.randn(3000), torch.randn(3000)
    stage.write(_slot(stage, "a"), a)
    stage.hold(_slot(stage, "b"), b)
    assert stage.held == {}, "its bucket has a buffer already: no second one is allocated by writing into it"
    assert torch.equal(stage.buffers[0][3000:6000], b)


def test_a_held_sole_parameter_is_reduced_as_it_is_without_waiting(stage):
    d = torch.randn(6000)
    stage.hold(_slot(stage, "d"), d)
    assert not stage.must_wait(2), "no new buffer: nothing to wait for"
    assert stage.pop(2).data_ptr() == d.data_ptr()


def test_a_new_micro_batch_drops_what_an_aborted_backward_held(stage):
    stage.hold(_slot(stage, "a"), torch.ones(3000))
    stage.begin_micro()
    assert stage.held == {} and stage.landed == [False] * 4
    stage.fill_missing(0)
    assert torch.count_nonzero(stage.pop(0)) == 0, "zeros, not the aborted pass's gradient"


def test_a_vocabulary_sized_sole_parameter_does_not_make_the_other_buckets_small():
    """The tied embedding is reduced as it is, never staged: the blocks' buckets are large next to the largest
    bucket that is staged, whatever the vocabulary, so their gradients are still held back."""
    specs = [ParamSpec("a", (3000,), 0), ParamSpec("b", (3000,), 0), ParamSpec("wte", (1000, 128), 1)]
    stage = StagingBuckets(build_layout(specs, 2, 6000, 8), torch.float32, torch.device("cpu"))
    assert stage.sole == [False, True] and stage.large[0]
    stage.hold(_slot(stage, "a"), torch.randn(3000))
    assert stage.buffers == {} and stage.must_wait(0)


def test_a_released_staging_buffer_is_freed_though_another_reference_holds_it(stage):
    """Once its collective was waited for, a staging buffer allocated here is freed at once, though the communication
    library may still hold the tensor (gloo's worker thread, NCCL's watchdog); a sole parameter's gradient reduced as
    it is was handed over, not allocated here, and is left to whoever holds it."""
    stage.write(_slot(stage, "a"), torch.randn(3000))
    staged = stage.pop(0)
    held_elsewhere = staged  # as a collective's work object holds its input
    stage.release(0, staged)
    assert held_elsewhere.untyped_storage().nbytes() == 0
    grad = torch.randn(6000)
    stage.write(_slot(stage, "d"), grad)
    sole = stage.pop(2)
    assert sole.data_ptr() == grad.data_ptr()
    stage.release(2, sole)
    assert grad.untyped_storage().nbytes() == 6000 * 4 and torch.isfinite(grad).all()
