"""``zerobench profile`` on a GPU: the bytes a step of a shape holds beyond its parameters, per block and fixed.

The memory planner (``zerobench.sim.memory``) adds these measured activation terms to the engine's own
bytes, which it counts from the configuration and the real bucket layout; nothing here is a stated
allowance.
"""

from __future__ import annotations

import dataclasses

import torch

from zerobench.sim.measure_compute import Shape, shape_model


def step_memory(shape: Shape, device: torch.device) -> dict[str, float]:
    """Bytes a forward + backward of ``shape`` holds beyond its parameters, on a GPU (the caching allocator's
    counters), as a fixed part and a part per block: measured at one and at two blocks (``layers`` is not
    part of a shape: the profile serves every depth). ``step_peak_fixed`` / ``step_peak_block``: the most
    allocated at once during the step; ``activations_fixed`` / ``activations_block``: allocated after forward
    (what backward keeps: the logits and the loss with it). Each parameter's gradient is dropped as it
    lands, as the engine takes it into its own buffers (whose bytes the planner counts from the layout)."""
    got = []
    for layers in (1, 2):
        one = dataclasses.replace(shape, model=dataclasses.replace(shape.model, layers=layers))
        model, x, y = shape_model(one, device)
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        model(x, y).backward()  # warm-up: kernels' workspaces, autotuning
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss = model(x, y)
        after_forward = torch.cuda.memory_allocated(device)
        loss.backward()
        torch.cuda.synchronize(device)
        got.append((after_forward - base, torch.cuda.max_memory_allocated(device) - base))
        del model, x, y, loss
        torch.cuda.empty_cache()
    (a1, p1), (a2, p2) = got
    return {
        "activations_fixed": float(2 * a1 - a2),
        "activations_block": float(a2 - a1),
        "step_peak_fixed": float(2 * p1 - p2),
        "step_peak_block": float(p2 - p1),
    }
