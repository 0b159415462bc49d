"""The walk over a forward's inputs and outputs (``zero/interop/containers.py``) on a dataclass that is also a
dict, as Hugging Face's ``ModelOutput`` is: its attributes and its items are two views of one set of values, so a
rebuilt one (bf16's input cast) must change both alike, and a tensor set only as an item is still seen."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import pytest
import torch

from zerobench.zero.interop.containers import map_tensors, tensors_in
from zerobench.zero.interop.forward_inputs import cast_floats


@dataclasses.dataclass
class DictOutput(OrderedDict):
    """A stand-in for ``transformers.utils.ModelOutput``: the fields set (not None) are also its items; setting an
    item sets the attribute; ``out[0]`` is the first item."""

    hidden: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    aux: torch.Tensor | None = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if (v := getattr(self, f.name)) is not None:
                super().__setitem__(f.name, v)

    def __getitem__(self, k):
        return list(self.values())[k] if isinstance(k, int) else super().__getitem__(k)

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        super().__setattr__(k, v)


def test_a_dict_dataclass_is_cast_in_both_views():
    out = DictOutput(hidden=torch.randn(2, 3), ids=torch.arange(3))
    cast = cast_floats(out, torch.bfloat16)
    assert type(cast) is DictOutput and list(cast.keys()) == ["hidden", "ids"]
    assert cast.hidden.dtype == torch.bfloat16
    assert cast["hidden"] is cast.hidden and cast[0] is cast.hidden  # one tensor, not a stale fp32 item
    assert cast["ids"] is cast.ids and cast.ids.dtype == torch.int64
    assert out.hidden.dtype == torch.float32 and out["hidden"].dtype == torch.float32  # the input is untouched


def test_each_tensor_is_mapped_once():
    calls = []
    out = DictOutput(hidden=torch.randn(2), ids=torch.arange(2))
    map_tensors(lambda t: calls.append(t) or t * 1, out)
    assert len(calls) == 2


def test_an_item_that_is_not_a_field_is_walked_and_mapped():
    out = DictOutput(hidden=torch.randn(2))
    out["extra"] = torch.randn(4)
    assert [t.shape for t in tensors_in(out)] == [torch.Size([2]), torch.Size([4])]  # once each
    cast = cast_floats(out, torch.bfloat16)
    assert cast["extra"].dtype == torch.bfloat16 and cast.extra is cast["extra"]


def test_hugging_faces_model_output_is_cast_in_both_views():
    """``encoder_outputs=BaseModelOutput(...)`` given to an encoder-decoder under bf16: the decoder reads
    ``encoder_outputs[0]``, which must be the cast tensor."""
    outputs = pytest.importorskip("transformers.modeling_outputs", reason="Hugging Face transformers is not installed")
    enc = outputs.BaseModelOutput(last_hidden_state=torch.randn(2, 3, 4))
    cast = cast_floats({"encoder_outputs": enc}, torch.bfloat16)["encoder_outputs"]
    assert type(cast) is outputs.BaseModelOutput and list(cast.keys()) == ["last_hidden_state"]
    assert cast[0].dtype == torch.bfloat16 and cast[0] is cast.last_hidden_state is cast.to_tuple()[0]
