"""Stage-3 unit assignment (``zero/units.py``), pure bookkeeping tested without processes: a parameter belongs to
the one unit holding it, to the root when shared between units, not held by any or given as external; a unit left
with no parameter is dropped; ``external_params`` must name trained parameters of the model."""

from __future__ import annotations

import pytest
from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.units import assign_units, resolve_external


def _net() -> nn.Module:
    m = nn.Module()
    m.a, m.b, m.head = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
    m.c = nn.Linear(2, 2)
    m.c.weight = m.a.weight  # shared between units a and c
    return m


def test_owners_shared_and_external():
    m = _net()
    got = assign_units(m, [m.a, m.b, m.c], resolve_external(m, ["b.weight", m.b.bias]))
    owner = {n: got.unit_of.get(id(p), 0) for n, p in got.named}
    assert got.units == [m.a, m.c]  # b holds only external parameters: dropped
    assert owner == {
        "a.weight": 0,
        "a.bias": 1,
        "b.weight": 0,
        "b.bias": 0,
        "head.weight": 0,
        "head.bias": 0,
        "c.bias": 2,
    }
    plain = assign_units(m, [m.a, m.b, m.c])
    assert plain.units == [m.a, m.b, m.c] and plain.unit_of[id(m.b.weight)] == 2


@pytest.mark.parametrize(
    "given, words",
    [
        ("b.wieght", "'b.wieght' is not a parameter of the model"),
        (nn.Parameter(nn.Linear(2, 2).weight.detach()), "a Parameter of shape (2, 2) is not a parameter of the model"),
        (3, "3 of type int is not a parameter of the model"),
        ("b.bias", "'b.bias' is frozen (requires_grad=False)"),
    ],
)
def test_bad_external_params_are_one_line(given, words):
    m = _net()
    m.b.bias.requires_grad_(False)
    with pytest.raises(ConfigError) as e:
        resolve_external(m, [given])
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_external_params_as_one_name_or_none():
    m = _net()
    assert resolve_external(m, None) == frozenset()
    assert resolve_external(m, "c.weight") == frozenset({id(m.a.weight)})  # a tied parameter, by its other name


def _encoder_decoder() -> nn.Module:
    """Two stacks of layers, each layer with a list of sublayers and a list of experts inside, a parameter-free
    list of activations, and a one-entry list."""

    def layer() -> nn.Module:
        m = nn.Module()
        m.sub = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        m.experts = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
        return m

    m = nn.Module()
    m.embed = nn.Embedding(4, 2)
    m.encoder, m.decoder = nn.Module(), nn.Module()
    m.encoder.block = nn.ModuleList([layer() for _ in range(2)])
    m.decoder.block = nn.ModuleList([layer() for _ in range(3)])
    m.acts = nn.ModuleList([nn.ReLU(), nn.GELU()])
    m.single = nn.ModuleList([nn.Linear(2, 2)])
    return m


def test_layer_units_are_every_outermost_list_of_layers():
    from zerobench.zero.api import layer_lists, layer_units

    m = _encoder_decoder()
    assert list(layer_lists(m)) == ["encoder.block", "decoder.block"]  # nested, parameter-free, single: not lists
    assert layer_units(m) == [*m.encoder.block, *m.decoder.block]
    m.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])  # model.blocks, where a model has one, first
    assert layer_units(m) == list(m.blocks)
    assert layer_units(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []  # no list: the root is the one unit
    shared = nn.Linear(2, 2)
    reused = nn.Module()
    reused.layers = nn.ModuleList([shared, nn.Linear(2, 2), shared])  # one layer run twice (ALBERT's sharing)
    assert layer_units(reused) == [shared, reused.layers[1]]


def test_a_weight_a_unit_shares_with_a_module_outside_every_unit_is_the_roots():
    """A head tied to the last layer's weight: the root uses it after that layer's forward, so the root owns it
    (owned by the layer, it was freed before the head read it)."""
    m = nn.Module()
    m.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    m.head = nn.Linear(2, 2, bias=False)
    m.head.weight = m.layers[1].weight
    got = assign_units(m, list(m.layers))
    owner = {n: got.unit_of.get(id(p), 0) for n, p in got.named}
    assert owner == {"layers.0.weight": 1, "layers.0.bias": 1, "layers.1.weight": 0, "layers.1.bias": 2}
    assert got.units == list(m.layers)


def test_parallel_lists_are_not_layer_lists():
    """Lists that share a parent and run interleaved (XLM's attentions and ffns, one entry of each per layer) give no
    units: listed one list after the other, they would not be in the order the forward runs them."""
    from zerobench.zero.api import layer_lists, layer_units

    m = nn.Module()
    m.attentions = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    m.ffns = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    m.decoder = nn.Module()
    m.decoder.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
    assert list(layer_lists(m)) == ["decoder.layers"]
    assert layer_units(m) == list(m.decoder.layers)
    del m.decoder
    assert layer_units(m) == []
