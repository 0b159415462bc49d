"""``apply_compile``: each transformer block's forward through ``torch.compile`` (``--kernels compiled``).

The block's own computation (LayerNorms, attention, the MLP, the residual adds) becomes one Inductor graph,
whose fused elementwise kernels replace the eager ones; the engine's hooks around each block (stage 3's
gather, free and prefetch; the gradient buckets' hooks) stay eager, as FSDP2's do around its compiled blocks.
torchtitan's ``apply_compile`` takes the same unit.

Compiled where nothing inside a block communicates or recomputes: TP's collectives and activation
checkpointing (with P_a's partitioned copies) run inside the block, and a ``fullgraph`` compile does not
trace them. Those combinations are refused in one line rather than compiled in pieces.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.parallel.config import COMPILED

BACKEND = "inductor"
"""The ``torch.compile`` backend, read at each ``apply_compile``: Inductor, whose generated kernels are the point;
tests set ``aot_eager`` (AOTAutograd's graphs without code generation) where compiling time matters more."""


def apply_compile(model: nn.Module) -> str:
    """Put each block of ``model.blocks`` through ``torch.compile(fullgraph=True)`` (lazily: the first forward
    compiles, on the device the parameters are on by then); returns the kernel path, ``"compiled"``.

    The block class's ``forward`` is compiled once and bound to each block, rather than the module wrapped, so
    module hooks, parameter names and ``state_dict`` keys stay as they were (checkpoints are the same with or
    without it), and a ``copy.deepcopy`` of the model binds the copy's own blocks. Every block runs one graph:
    Dynamo takes a module's parameters as the graph's inputs (``inline_inbuilt_nn_modules``, the default from
    torch 2.5), where earlier it guarded each graph on its own block and, past its cache limit of 8, ran the rest of
    a deep model eagerly without an error; torch before 2.5 is refused for that."""
    if torch.torch_version.TorchVersion(torch.__version__) < (2, 5):
        raise ConfigError(
            f"--kernels compiled needs torch's inline_inbuilt_nn_modules (the default from torch 2.5; this is "
            f"torch {torch.__version__}): without it the blocks past Dynamo's cache limit would run uncompiled"
        )
    compiled: dict[type, object] = {}
    for block in model.blocks:
        cls = type(block)
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, fullgraph=True, backend=BACKEND)
        block.forward = types.MethodType(compiled[cls], block)
    return COMPILED
