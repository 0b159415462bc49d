"""``zero/stage3/escaped.py``: which freed stage-3 parameters a failing forward read, from its traceback alone: an attribute
chain on a failing line, resolved through modules and parameters only (never a property), or a local variable."""

from __future__ import annotations

import sys

import pytest
from torch import nn

from zerobench.zero.stage3.escaped import escaped_reads, note_escaped_reads


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
        self.touched = False

    @property
    def boom(self):  # reading it would run code: the resolver must not
        self.touched = True
        return self.a

    def chain(self):
        raise RuntimeError(self.a.weight.shape, self.b.bias.shape)

    def local(self):
        w = self.a.bias
        raise RuntimeError(w.shape)

    def prop(self):
        raise RuntimeError(self.boom.weight)


def _tb(fn):
    try:
        fn()
    except RuntimeError:
        return sys.exc_info()[2]
    raise AssertionError("did not raise")


def test_chains_and_locals_name_only_the_freed_parameters():
    m = Net()
    freed = {id(m.a.weight): "a.weight", id(m.a.bias): "a.bias"}
    assert escaped_reads(_tb(m.chain), freed) == ["a.weight"]  # b.bias is on the line but gathered
    assert escaped_reads(_tb(m.local), freed) == ["a.bias"]
    assert escaped_reads(_tb(m.chain), {}) == []


def test_a_property_on_the_line_is_not_run():
    m = Net()
    tb = _tb(m.prop)
    m.touched = False  # the forward itself ran it
    assert escaped_reads(tb, {id(m.a.weight): "a.weight"}) == [] and not m.touched


@pytest.mark.parametrize("output, noted", [(None, True), ("an output", False)])
def test_the_hook_notes_only_an_exception_in_flight(output, noted):
    m = Net()
    hook = note_escaped_reads(lambda: {id(m.a.weight): "a.weight"})
    try:
        m.chain()
    except RuntimeError as e:
        hook(m, (), output)
        notes = getattr(e, "__notes__", [])
    assert bool(notes) == noted and all("external_params=['a.weight']" in n for n in notes), notes
    hook(m, (), None)  # no exception in flight: nothing to do
