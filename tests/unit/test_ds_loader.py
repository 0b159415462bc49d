"""``engine.deepspeed_io`` (and ``initialize(training_data=)``, which calls it) against DeepSpeed 0.19.8's own
``deepspeed_io``: the same micro-batches on every DP rank, by route, batch size and ``dataloader_drop_last``."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler, IterableDataset, TensorDataset

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig, apply_zero, as_deepspeed
from zerobench.zero.compat.deepspeed.data import loader


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n), torch.arange(n) * 10)


def _deepspeeds(dataset, batch, world, rank, drop_last, route):
    """What DeepSpeed's ``engine.deepspeed_io(dataset)`` yields on DP rank ``rank``: its sampler choice by route
    (``DeepSpeedEngine.deepspeed_io``) and its ``DeepSpeedDataLoader``."""
    dataloader = pytest.importorskip("deepspeed.runtime.dataloader")
    sampler = None
    if route in ("eval", "predict"):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    ds = dataloader.DeepSpeedDataLoader(
        dataset=dataset,
        batch_size=batch,
        pin_memory=False,
        local_rank=0,
        tput_timer=None,
        num_local_io_workers=0,
        data_sampler=sampler,
        data_parallel_world_size=world,
        data_parallel_rank=rank,
        dataloader_drop_last=drop_last,
    )
    return len(ds), [x.tolist() for x, _ in ds]


@pytest.mark.parametrize("route", ["train", "eval", "predict"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_reads_what_deepspeeds_loader_gives_it(route, drop_last):
    for n, batch, world in itertools.product((7, 16, 21), (1, 3, 4), (1, 2, 3)):
        for rank in range(world):
            ours = loader(
                _dataset(n), batch_size=batch, group=Group(None, "dp", world, rank), drop_last=drop_last, route=route
            )
            assert (len(ours), [x.tolist() for x, _ in ours]) == _deepspeeds(
                _dataset(n), batch, world, rank, drop_last, route
            ), (n, batch, world, rank)


def _engine(micro_batch=2):
    torch.manual_seed(0)
    return as_deepspeed(apply_zero(nn.Linear(2, 1), Group(None, "dp", 1, 0), ZeroConfig(stage=1)), micro_batch)


def test_the_engines_deepspeed_io_takes_its_micro_batch_collate_and_drop_last():
    engine = _engine(micro_batch=3)
    data = _dataset(8)
    assert [x.tolist() for x, _ in engine.deepspeed_io(data, route="eval")] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert sorted(i for x, _ in engine.deepspeed_io(data) for i in x.tolist()) == list(range(8))  # shuffled, whole
    assert [len(x) for x, _ in engine.deepspeed_io(data, batch_size=5, route="predict")] == [5, 3]
    engine.drop_last, engine.collate_fn = True, lambda items: [i for i, _ in items]
    assert engine.dataloader_drop_last() is True
    assert [b.tolist() for b in map(torch.stack, engine.deepspeed_io(data, route="eval"))] == [[0, 1, 2], [3, 4, 5]]
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=False)
    taken = engine.deepspeed_io(data, data_sampler=sampler, collate_fn=None)
    assert taken.data_sampler is sampler is taken.sampler


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda e: e.deepspeed_io(_Stream()), "an IterableDataset (_Stream) has no per-rank sampler"),
        (lambda e: e.deepspeed_io(iter([1, 2])), "must be a map-style dataset (a torch Dataset, a Hugging Face"),
        (lambda e: e.deepspeed_io(_dataset(4), route="test"), "route must be one of train, eval, predict, got 'test'"),
        (lambda e: e.deepspeed_io(_dataset(4), batch_size=0), "batch_size must be a positive integer, got 0"),
    ],
)
def test_bad_input_is_one_line(call, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        call(_engine())
    assert "\n" not in str(err.value)


def test_a_map_style_object_that_is_no_torch_dataset_is_read_as_deepspeed_reads_it():
    """DeepSpeed takes anything with ``__getitem__`` and ``__len__`` (a Hugging Face ``datasets.Dataset``, a list)."""

    class Rows:
        def __len__(self):
            return 7

        def __getitem__(self, i):
            return {"x": torch.tensor([i])}

    for data in (Rows(), [{"x": torch.tensor([i])} for i in range(7)]):
        for rank in range(2):
            ours = loader(data, batch_size=2, group=Group(None, "dp", 2, rank), drop_last=False, route="eval")
            dataloader = pytest.importorskip("deepspeed.runtime.dataloader")
            theirs = dataloader.DeepSpeedDataLoader(
                dataset=data,
                batch_size=2,
                pin_memory=False,
                local_rank=0,
                tput_timer=None,
                num_local_io_workers=0,
                data_sampler=DistributedSampler(data, num_replicas=2, rank=rank, shuffle=False),
                data_parallel_world_size=2,
                data_parallel_rank=rank,
            )
            assert [b["x"].tolist() for b in ours] == [b["x"].tolist() for b in theirs] != []
