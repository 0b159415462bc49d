"""``torch.compile(model)`` after ``apply_zero``, as DeepSpeed's and FSDP's users compile: the same training as the
model run eagerly, at stages 0-3 and in bf16, with no recompilation after the first step.

The engine's hooks are bookkeeping (which unit is gathered, which backward pass is open, a ledger of collectives);
traced by Dynamo they would be guarded on that state, so every step recompiled until Dynamo's limit and then ran
eagerly with a warning per frame. They run eagerly instead (``torch.compiler.disable``, as DeepSpeed's stage-3 hooks
do), and the model's own modules compile. ``aot_eager``: AOTAutograd's forward and backward graphs, without
Inductor's C++ code generation (no compiler needed on the CI machine).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist
STEPS = 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Sequential(nn.Linear(32, 32), nn.GELU()), nn.Linear(32, 4))


def _train(rank: int, world: int, stage: int, precision: str, compiled: str | None) -> dict:
    import warnings

    import torch._dynamo

    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import Precision, ZeroConfig

    torch._dynamo.reset()
    model = _model()
    units = [model[0], model[2], model[3]] if stage == 3 else None
    engine = apply_zero(
        model, None, ZeroConfig(stage=stage, precision=Precision(precision), bucket_numel=500), units=units
    )
    forward = torch.compile(model, backend="aot_eager") if compiled == "torch.compile" else model
    if compiled == "engine.compile":  # DeepSpeed's engine.compile, as Accelerate calls it: the module in place
        from zerobench.zero import as_deepspeed

        forward = as_deepspeed(engine)
        forward.compile(backend="aot_eager", compile_kwargs={})
        forward.compile(backend="aot_eager", compile_kwargs={})  # a second call does nothing, as DeepSpeed's
        assert forward.is_compiled
    g = torch.Generator().manual_seed(rank)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            if step == 1:  # the first step compiled every frame: no later step may compile again
                torch._dynamo.config.error_on_recompile = True
            loss = forward(torch.randn(8, 16, generator=g)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
            engine.zero_grad()
            losses.append(loss.item())
    torch._dynamo.config.error_on_recompile = False
    with engine.gathered_params():
        params = [p.detach().float().flatten().tolist() for p in model.parameters()]
    return {"losses": losses, "params": params, "warnings": [str(w.message)[:300] for w in caught]}


@pytest.mark.parametrize("how", ["torch.compile", pytest.param("engine.compile", marks=pytest.mark.slow)])
@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_a_compiled_model_trains_as_the_eager_one_without_recompiling(stage, precision, how):
    eager = run_distributed(_train, 2, stage, precision, None, timeout=300)
    compiled = run_distributed(_train, 2, stage, precision, how, timeout=300)
    for e, c in zip(eager, compiled):
        assert c["warnings"] == [], c["warnings"]
        assert c["losses"] == pytest.approx(e["losses"], rel=1e-5 if precision == "fp32" else 1e-2)
        worst = max(abs(x - y) for a, b in zip(e["params"], c["params"]) for x, y in zip(a, b))
        assert worst <= (1e-6 if precision == "fp32" else 1e-2), worst
