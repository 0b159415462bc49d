"""A shard's signature (``zerobench/zero/storage/signature.py``), which decides under optimizer offload whether a
parameter shard changed in place since the step: every change a plain sum of the bits misses (a permutation, a
balanced sign flip) shows, equal contents sign alike, and the integer arithmetic is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zerobench.zero.storage.signature import GROUP, SPAN, changed, position_weights, signature


def _ints(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.int16)


def _plain_sum(t: torch.Tensor) -> int:
    """The checksum the signature replaced: the bits summed."""
    return int(t.reshape(-1).view(torch.int16).sum(dtype=torch.int64))


def _reference(t: torch.Tensor) -> list[int]:
    """The signature in Python integers (no bound on their size)."""
    bits = _ints(t).numpy().astype(object)
    w = position_weights(torch.device("cpu")).numpy().astype(object)
    out = []
    for start in range(0, len(bits), SPAN):
        part = bits[start : start + SPAN]
        out += [int(np.dot(part, w[0, : len(part)])), int(np.dot(part, w[1, : len(part)]))]
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_permutation_in_place_changes_the_signature(dtype):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(3000, generator=g).to(dtype)
    before = signature(t)
    flipped = t.flip(0)
    swapped = t.clone()
    swapped[[10, 11]] = swapped[[11, 10]]
    for edited in (flipped, swapped):
        assert _plain_sum(edited) == _plain_sum(t), "the edit keeps the plain sum: the case a plain sum misses"
        assert not torch.equal(signature(edited), before)


def test_an_fp32_swap_whose_halves_cancel_under_16_bit_weights_is_seen():
    """fp32 elements are weighted whole: a swap of 1.0 and the value whose high half is one more and low half one
    less (1.0156249) is a swap of two unequal elements, seen at every pair of positions tried."""
    a = torch.tensor([1.0], dtype=torch.float32)
    hi_lo = a.view(torch.int16).clone()
    hi_lo[0] -= 1  # low half (little-endian)
    hi_lo[1] += 1  # high half
    b = hi_lo.view(torch.float32)
    for i, j in [(0, 1), (5904, 31584), (100, SPAN - 1), (7, 40000)]:
        t = torch.zeros(SPAN, dtype=torch.float32)
        t[i], t[j] = a, b
        edited = t.clone()
        edited[i], edited[j] = b, a
        assert not torch.equal(signature(edited), signature(t)), (i, j)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_negating_as_many_positive_as_negative_values_changes_the_signature(dtype):
    t = torch.tensor([0.5, -0.25, 1.5, -2.0, 3.0, 0.75], dtype=dtype)
    edited = t.clone()
    edited[[0, 1]] = -edited[[0, 1]]  # one positive, one negative
    assert _plain_sum(edited) == _plain_sum(t)
    assert not torch.equal(signature(edited), signature(t))


def test_equal_contents_sign_alike_and_one_element_changed_does_not():
    g = torch.Generator().manual_seed(1)
    t = torch.randn(SPAN + 123, generator=g).bfloat16()
    assert torch.equal(signature(t), signature(t.clone()))
    for i in (0, SPAN - 1, SPAN, SPAN + 122):
        edited = t.clone()
        edited[i] = edited[i] * 2 + 1
        assert not torch.equal(signature(edited), signature(t)), i


def test_a_value_moved_to_another_span_changes_both_spans():
    t = torch.arange(2 * SPAN, dtype=torch.float32).bfloat16()
    edited = t.clone()
    edited[[5, SPAN + 5]] = edited[[SPAN + 5, 5]]  # the same position in two spans: equal weights
    sig, before = signature(edited).view(-1, 2), signature(t).view(-1, 2)
    assert (sig != before).any(dim=1).tolist() == [True] * (sig.shape[0])


@pytest.mark.parametrize("dtype, fill", [(torch.int16, -32768), (torch.int16, 32767), (torch.int32, -(2**31))])
def test_the_arithmetic_is_exact_at_the_extremes_and_across_groups(dtype, fill):
    """Every element at its extreme (16-bit for bf16, 32-bit for fp32), over more than one group of spans and a
    tail: the signature equals the sums in unbounded integers (nothing wrapped)."""
    n = SPAN * GROUP + SPAN + 7
    t = torch.full((n,), fill, dtype=dtype).view(torch.bfloat16 if dtype == torch.int16 else torch.float32)
    assert signature(t).tolist() == _reference(t)


def test_the_signature_matches_unbounded_integers_on_random_bits():
    g = torch.Generator().manual_seed(2)
    t = torch.randn(2 * SPAN + 99, generator=g)  # fp32: two 16-bit halves per element
    assert signature(t).tolist() == _reference(t)


def test_position_weights_are_in_range_and_spread():
    w = position_weights(torch.device("cpu"))
    assert w.shape == (2, SPAN) and w.dtype == torch.int64
    assert int(w.min()) >= 1 and int(w.max()) <= 32768
    assert len(set(w[0].tolist())) > SPAN // 3 and not torch.equal(w[0], w[1])  # random: about 0.43 x SPAN


def test_no_two_positions_of_a_span_share_both_weights():
    """What makes every swap of two unequal elements, and every pair of sign flips, inside a span change the
    signature: such a change moves the two sums by (a - b) x (w_i - w_j), zero for both sets only where both weights
    match."""
    w = position_weights(torch.device("cpu"))
    assert len(set(zip(w[0].tolist(), w[1].tolist()))) == SPAN


def test_changed_reads_each_tensor_and_none_means_all():
    a, b = torch.zeros(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)
    assert changed(None, [signature(a), signature(b)]) == [True, True]
    assert changed([signature(a), signature(b)], [signature(a), signature(a)]) == [False, True]
    empty = torch.zeros(0, dtype=torch.bfloat16)
    assert changed([signature(empty)], [signature(empty)]) == [False]
