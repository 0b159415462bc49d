"""TP layers refuse, in their constructor and in one line, what they cannot shard: no process group is needed, a
``Group`` of size 2 is enough to build a rank's layer.

Before, ``VocabParallelEmbedding(nn.Embedding(11, 4))`` at TP 2 took 5 rows per rank for its index arithmetic but
cut the weight with ``chunk`` (6 and 5 rows): tokens 5 to 10 got the wrong row or zeros, silently; ``max_norm``,
``scale_grad_by_freq`` and ``sparse`` were dropped; ``ColumnParallelLinear(nn.Linear(4, 7))`` built shards of 4 and 3
rows, and the first collective over them aborted a rank (a gloo enforce, SIGABRT)."""

from __future__ import annotations

import pytest
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding


def _tp2(rank: int = 0) -> Group:
    return Group(None, "tp", 2, rank)


def _refused(build) -> str:
    with pytest.raises(ConfigError) as e:
        build()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_vocabulary_tp_does_not_divide_is_refused(rank):
    msg = _refused(lambda: VocabParallelEmbedding(nn.Embedding(11, 4), _tp2(rank)))
    assert msg == (
        "VocabParallelEmbedding: vocabulary 11 is not divisible by TP degree 2: pad the vocabulary to a multiple of 2 "
        "(zerobench.models.sizes.padded_vocab), as Megatron-LM does"
    )


@pytest.mark.parametrize(
    "kwargs, what",
    [
        ({"max_norm": 1.0}, "max_norm=1.0 is not supported under TP"),
        ({"scale_grad_by_freq": True}, "scale_grad_by_freq=True is not supported under TP"),
        ({"sparse": True}, "sparse=True is not supported under TP"),
    ],
)
def test_embedding_options_a_shard_cannot_honour_are_refused(kwargs, what):
    msg = _refused(lambda: VocabParallelEmbedding(nn.Embedding(10, 4, **kwargs), _tp2()))
    assert msg.startswith(f"VocabParallelEmbedding: {what}"), msg


def test_padding_idx_is_kept_on_the_rank_that_holds_its_row():
    assert VocabParallelEmbedding(nn.Embedding(10, 4, padding_idx=7), _tp2(0)).padding_idx is None
    assert VocabParallelEmbedding(nn.Embedding(10, 4, padding_idx=7), _tp2(1)).padding_idx == 2
    assert VocabParallelEmbedding(nn.Embedding(10, 4, padding_idx=-1), _tp2(1)).padding_idx == 4


def test_linear_splits_tp_does_not_divide_are_refused():
    msg = _refused(lambda: ColumnParallelLinear(nn.Linear(4, 7), _tp2()))
    assert msg == (
        "ColumnParallelLinear: 7 output features do not split evenly over TP degree 2: make them a multiple of 2 "
        "or choose a TP degree dividing them"
    )
    msg = _refused(lambda: ColumnParallelLinear(nn.Linear(4, 9), _tp2(), strided=3))
    assert msg.startswith("ColumnParallelLinear: 9 output features in 3 stacked blocks do not split evenly"), msg
    msg = _refused(lambda: RowParallelLinear(nn.Linear(7, 4), _tp2()))
    assert msg == (
        "RowParallelLinear: 7 input features are not divisible by TP degree 2: make them a multiple of 2 "
        "or choose a TP degree dividing them"
    )
    assert ColumnParallelLinear(nn.Linear(4, 12), _tp2(1), strided=3).weight.shape == (6, 4)
    assert RowParallelLinear(nn.Linear(8, 4), _tp2(1)).weight.shape == (4, 4)


def test_apply_tp_without_a_process_group_is_refused_in_one_line():
    from zerobench.models.config import GPTConfig
    from zerobench.models.gpt import GPT
    from zerobench.parallel.tensor_parallel import apply_tp

    model = GPT(GPTConfig(layers=1, hidden=32, heads=4, vocab=64, seq=16))
    msg = _refused(lambda: apply_tp(model, None))
    assert msg.startswith("apply_tp's group: torch.distributed is not initialised"), msg


def test_tensor_parallel_shards_without_a_tp_group_are_refused():
    """Parameters marked ``tensor_model_parallel`` (as ``apply_tp`` and Megatron's layers mark their shards) given to
    ``apply_zero`` without ``tp_group=``: each TP rank would clip by its own shard's norm."""
    from zerobench.zero import ZeroConfig, apply_zero

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[0].weight.tensor_model_parallel = True
    msg = _refused(lambda: apply_zero(model, Group(None, "dp", 1, 0), ZeroConfig(stage=1)))
    assert msg.startswith("apply_zero: 1 parameters ('0.weight', ...) are tensor-parallel shards")
    engine = apply_zero(model, Group(None, "dp", 1, 0), ZeroConfig(stage=1), tp_group=Group(None, "tp", 1, 0))
    engine.destroy()
