"""gloo's reduce-scatter/all-gather built from all-reduce/broadcast equal gloo's native collectives, on
sub-groups too, sync and async, with the output a view of the input (ZeRO's stage-1 pattern) or not."""

import pytest
import torch
import torch.distributed as dist

from tests.helpers.dist import run_distributed
from zerobench.distributed.collectives import Group, all_gather, reduce_scatter

pytestmark = pytest.mark.dist


def _both(rank: int, world: int) -> dict:
    sub = dist.new_group([1, 2, 3], backend="gloo") if world == 4 else None
    pgs = {"world": None}
    if rank in (1, 2, 3):
        pgs["sub"] = sub
    out = {}
    for name, pg in pgs.items():
        for native in ("0", "1"):
            g = Group.of(pg, "dp", native=native == "1")  # native: gloo's own collectives
            n = 6 * g.size + 0
            x = torch.arange(n, dtype=torch.float32) * (rank + 1) + rank / 7
            rs = torch.empty(n // g.size)
            reduce_scatter(rs, x.clone(), g)
            inplace = x.clone()  # output as a view of the input, reduced in place, async
            mine = inplace[g.rank * (n // g.size) : (g.rank + 1) * (n // g.size)]
            reduce_scatter(mine, inplace, g, async_op=True, inp_is_scratch=True).wait()
            ag = torch.empty(n)
            w = all_gather(ag, x[: n // g.size].clone() + rank, g, async_op=True)
            w.wait()
            out[(name, native)] = (rs, mine.clone(), ag)
    return {k: [t.tolist() for t in v] for k, v in out.items()}


def test_composed_collectives_equal_native_ones():
    for res in run_distributed(_both, 4):
        for name in {k[0] for k in res}:
            composed, native = res[(name, "0")], res[(name, "1")]
            assert composed[0] == native[0]  # reduce-scatter into a separate tensor
            assert composed[1] == native[0]  # reduce-scatter in place into a view of the input
            assert composed[2] == native[2]  # all-gather
