"""Multi-tensor flatten/unflatten copy (C++ and Triton interpreter) against ``torch.cat`` and slicing."""

import pytest
import torch

import kernels
from tests.kernels.impls import IMPLS, flat_copy, make


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flatten_then_unflatten_round_trips_with_aligned_offsets(impl, dtype):
    tensors = [make(s, dtype, i) for i, s in enumerate([(37,), (5, 9), (0,), (2000,), (3, 3, 3)])]
    offsets, pos = [], 0
    for t in tensors:
        offsets.append(pos)
        pos += -(-t.numel() // 16) * 16  # 16-element alignment, as the ZeRO buffers use
    flat = torch.full((pos,), -7.0, dtype=dtype)
    flat_copy(impl, flat, tensors, offsets, unpack=False)
    for t, off in zip(tensors, offsets):
        assert torch.equal(flat[off : off + t.numel()], t.reshape(-1))
    gaps = torch.ones(pos, dtype=torch.bool)
    for t, off in zip(tensors, offsets):
        gaps[off : off + t.numel()] = False
    assert (flat[gaps] == -7.0).all()  # padding untouched
    back = [torch.zeros_like(t) for t in tensors]
    flat_copy(impl, flat, back, offsets, unpack=True)
    for a, b in zip(back, tensors):
        assert torch.equal(a, b)


def test_large_flatten_uses_many_pieces():
    tensors = [make(300_000, seed=i) for i in range(3)]
    flat = torch.empty(900_000)
    kernels.flatten_into_(flat, tensors, [0, 300_000, 600_000])
    assert torch.equal(flat, torch.cat(tensors))


def test_copy_errors_are_one_line():
    flat = torch.zeros(10)
    with pytest.raises(ValueError, match="overruns the flat buffer of 10"):
        kernels.flatten_into_(flat, [torch.zeros(8)], [4])
    with pytest.raises(ValueError, match=r"contiguous torch\.float32"):
        kernels.flatten_into_(flat, [torch.zeros(4, dtype=torch.float64)], [0])
    with pytest.raises(ValueError, match="2 tensors but 1 offsets"):
        kernels.unflatten_from_(flat, [torch.zeros(2), torch.zeros(2)], [0])


def test_a_strided_flat_buffer_is_refused():
    """The kernel copies from the flat buffer's first address as if it were contiguous: a strided view was written
    over the storage between its elements."""
    buf = torch.zeros(20)
    with pytest.raises(ValueError, match="flat buffer must be 1-D and contiguous"):
        kernels.flatten_into_(buf[::2], [torch.ones(3)], [0])
    assert not buf.any()
