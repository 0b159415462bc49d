"""gloo's reduce-scatter/all-gather built from all-reduce/broadcast equal gloo's native collectives, on
sub-groups too, sync and async, with the output a view of the input (ZeRO's stage-1 pattern) or not."""

import os

import pytest
import torch
import torch.distributed as dist

from tests.helpers.dist import run_distributed
from zerobench.distributed.collectives import Group, all_gather, reduce_scatter

pytestmark = pytest.mark.dist


def _both(rank: int, world: int) -> dict:
    sub = dist.new_group([1, 2, 3], backend="gloo") if world == 4 else None
    groups = {"world": Group.of(None, "dp")}
    if rank in (1, 2, 3):
        groups["sub"] = Group.of(sub, "dp")
    out = {}
    for name, g in groups.items():
        n = 6 * g.size + 0
        x = torch.arange(n, dtype=torch.float32) * (rank + 1) + rank / 7
        for native in ("0", "1"):
            os.environ["ZEROBENCH_GLOO_NATIVE"] = native
            rs = torch.empty(n // g.size)
            reduce_scatter(rs, x.clone(), g)
            inplace = x.clone()  # output as a view of the input, reduced in place, async
            mine = inplace[g.rank * (n // g.size) : (g.rank + 1) * (n // g.size)]
            reduce_scatter(mine, inplace, g, async_op=True, inp_is_scratch=True).wait()
            ag = torch.empty(n)
            w = all_gather(ag, x[: n // g.size].clone() + rank, g, async_op=True)
            w.wait()
            out[(name, native)] = (rs, mine.clone(), ag)
    os.environ.pop("ZEROBENCH_GLOO_NATIVE")
    return {k: [t.tolist() for t in v] for k, v in out.items()}


def test_composed_collectives_equal_native_ones():
    for res in run_distributed(_both, 4):
        for name in {k[0] for k in res}:
            composed, native = res[(name, "0")], res[(name, "1")]
            assert composed[0] == native[0]  # reduce-scatter into a separate tensor
            assert composed[1] == native[0]  # reduce-scatter in place into a view of the input
            assert composed[2] == native[2]  # all-gather
