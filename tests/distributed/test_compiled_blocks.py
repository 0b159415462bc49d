"""``--kernels compiled`` (``parallel/compiled.py``): each GPT block through ``torch.compile`` under zerobench's
engine trains as one uncompiled process on the same global batch does, at stages 0-3 over two gloo ranks, in fp32
and in bf16 with gradient accumulation, and compiles once: ten blocks run one graph and nothing recompiles (stage 3
swaps each parameter's storage around every block, and a graph guarded on a block's own parameters would compile
once per block, then per step, and past Dynamo's cache limit of 8 run the rest eagerly without an error).

The fast tier compiles with ``aot_eager`` (AOTAutograd's forward and backward graphs, no code generation); the full
grid with Inductor, the backend a GPU run gets, whose C++ kernels take about a minute to build on two cores."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered
from zerobench.models.config import GPTConfig

pytestmark = pytest.mark.dist
STEPS = 4
GLOBAL_BATCH = 8
SHAPE = GPTConfig(layers=10, hidden=32, heads=4, vocab=512, seq=32)


def _train(rank: int, world: int, stage: int, kernels: str, backend: str, precision: str, accum: int) -> dict:
    import torch._dynamo
    from torch._dynamo.utils import counters

    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.gpt import GPT
    from zerobench.parallel import compiled
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.zero.config import Precision, ZeroConfig

    torch._dynamo.reset()
    compiled.BACKEND = backend
    torch.manual_seed(0)
    model = GPT(SHAPE)
    zero = ZeroConfig(stage=stage, precision=Precision(precision), grad_accum_steps=accum)
    built = parallelize(model, build_mesh(1, world), ParallelSpec(zero=zero, kernels=kernels))
    engine = built.engine
    g = torch.Generator().manual_seed(1)
    per_rank = GLOBAL_BATCH // world
    losses = []
    torch._dynamo.config.error_on_recompile = True  # the first block compiles; no other block, no later step
    for _ in range(STEPS * accum):
        tokens = torch.randint(0, SHAPE.vocab, (GLOBAL_BATCH, SHAPE.seq), generator=g)[rank * per_rank :][:per_rank]
        loss = model(tokens, tokens)
        engine.backward(loss)
        engine.step()  # DeepSpeed's: applies and zeroes at the window's end, a no-op inside it
        losses.append(loss.item())
    torch._dynamo.config.error_on_recompile = False
    with engine.gathered_params():
        params = [p.detach().float().flatten().tolist() for p in model.parameters()]
    return {"kernels": built.kernels, "graphs": counters["stats"]["unique_graphs"], "losses": losses, "params": params}


@pytest.mark.parametrize("precision, accum", [("fp32", 1), pytest.param("bf16", 2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_compiled_blocks_train_as_one_uncompiled_process(stage, backend, precision, accum):
    (ref,) = run_distributed(_train, 1, 0, "reference", backend, precision, accum, timeout=300)
    ranks = run_distributed(_train, 2, stage, "compiled", backend, precision, accum, timeout=600)
    assert {r["kernels"] for r in ranks} == {"compiled"} and ref["kernels"] == "reference"
    assert [r["graphs"] for r in ranks] == [1, 1] and ref["graphs"] == 0  # ten blocks, one graph; none uncompiled
    n = STEPS * accum
    mean = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(n)]  # each rank's half of the batch
    tol = 1e-5 if precision == "fp32" else 1e-2
    assert mean == pytest.approx(ref["losses"], rel=tol)
    assert ranks[0]["params"] == ranks[1]["params"]
    worst = max(abs(x - y) for a, b in zip(ref["params"], ranks[0]["params"]) for x, y in zip(a, b))
    assert worst <= tol, worst
