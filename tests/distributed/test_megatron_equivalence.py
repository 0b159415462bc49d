"""zerobench's tensor-parallel layers equal megatron-core's, unpatched, on CPU/gloo."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.workers_tp import megatron_layer_equivalence

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None,
        reason="megatron-core is not installed (pip install -e '.[megatron]')",
    ),
]


@pytest.mark.parametrize("tp", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_tp_layers_and_cross_entropy_equal_megatron_core(tp):
    for diffs in run_distributed(megatron_layer_equivalence, tp):
        for layer, d in diffs.items():
            assert d <= 1e-6, (layer, diffs)
