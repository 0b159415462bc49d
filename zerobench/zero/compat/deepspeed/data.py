"""DeepSpeed's data loaders: ``initialize(training_data=...)``'s and ``engine.deepspeed_io(dataset)``'s.

Each DP rank reads its share of a map-style dataset (a torch ``Dataset``, or as DeepSpeed takes it, anything with
``__getitem__`` and ``__len__``: a Hugging Face ``datasets.Dataset``, a list) through a ``DistributedSampler`` over the data-parallel
group (not the world: TP ranks of one DP rank read the same samples), in micro-batches, as DeepSpeed's
``DeepSpeedDataLoader`` does: shuffled for training, in order for evaluation and prediction (DeepSpeed's
``route``). The sampler is the loader's ``data_sampler`` as well as its ``sampler``, since scripts reshuffle per
epoch with ``loader.data_sampler.set_epoch(e)``.

An iterable-style dataset has no per-rank sampler: each rank would read the whole stream, so every sample
would train DP times in one step, silently. It is refused in one line. The loader reads in the calling process
unless ``num_workers`` says otherwise (DeepSpeed starts two workers per device); the samples are the same.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group

ROUTES = ("train", "eval", "predict")
"""DeepSpeed's ``route`` values (``ROUTE_TRAIN``, ``ROUTE_EVAL``, ``ROUTE_PREDICT``)."""


def loader(
    dataset,
    *,
    batch_size: int,
    group: Group,
    drop_last: bool,
    collate_fn=None,
    data_sampler=None,
    route: str = "train",
    pin_memory: bool = False,
    num_workers: int = 0,
) -> DataLoader:
    """A ``DataLoader`` of this DP rank's micro-batches of ``dataset`` (see the module docstring)."""
    if route not in ROUTES:
        raise ConfigError(f"deepspeed_io: route must be one of {', '.join(ROUTES)}, got {route!r}")
    if not isinstance(dataset, Dataset) and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ConfigError(
            f"deepspeed_io: the data must be a map-style dataset (a torch Dataset, a Hugging Face datasets.Dataset, "
            f"a list: anything with __getitem__ and __len__), got a {type(dataset).__name__}"
        )
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"deepspeed_io: batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(dataset, IterableDataset):
        raise ConfigError(
            f"deepspeed_io: an IterableDataset ({type(dataset).__name__}) has no per-rank sampler, so every DP rank "
            "would read all of it: shard it by rank yourself and iterate your own DataLoader"
        )
    if data_sampler is None:
        data_sampler = DistributedSampler(dataset, num_replicas=group.size, rank=group.rank, shuffle=route == "train")
    out = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=data_sampler,
        collate_fn=collate_fn,
        drop_last=drop_last,
        pin_memory=pin_memory and torch.cuda.is_available(),
        num_workers=num_workers,
    )
    out.data_sampler = data_sampler
    return out
