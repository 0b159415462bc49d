"""The memory planner from measurement: a configuration's peak device bytes on a profiled GPU, and the most
layers that fit a budget.

The peak (``torch.cuda.max_memory_allocated``, reached in backward's first pieces, when every block's
activations are still held and the head's gradient is being made) is the sum of

- the model states the engine holds by then, counted from the configuration and the real layout
  (``model_state_bytes_analytic`` on the engine's padded element count): parameters, gradient buffer,
  fp32 master and Adam moments, less what offload puts on the host. At stages 2-3 a bucket's gradient
  shard is allocated when the bucket is first reduced (``zero/storage/buffer.py``), after the peak: with one
  micro-batch per step the gradient partition is not yet there; with accumulation it is;
- the step's activations and transients beyond the parameters, *measured* on the device at the
  configuration's shape at one and at two blocks (``measure_memory.step_memory``): a fixed part
  (embedding, head, loss, and with checkpointing one block's recompute) plus a part per block (bytes
  depend on the shape, not on how many processes share the host: one entry serves every world size);
- stage 3's gathered units at the peak: the root (embeddings, final norm; the head's tied weight) and one
  block (the prefetched next one), each a full unit beside its shard.

What is left out is stated, not allowed for: the caching allocator's reserve above what is allocated
(``peak_reserved_bytes - peak_memory_bytes`` in a run's rows) and the CUDA context, neither of which
``max_memory_allocated`` counts.
"""

from __future__ import annotations

import dataclasses

from zerobench.metrics.analytic import model_state_bytes_analytic
from zerobench.sim.layout import engine_buckets
from zerobench.sim.measure import shape_key, shape_of
from zerobench.sim.profile import Profile
from zerobench.train.config import TrainConfig
from zerobench.zero.optim.states import make_codec


def _without_processes(key: str) -> str:
    """``op_key`` less its processes and threads fields: bytes, unlike seconds, do not depend on them."""
    return "|".join(f for f in key.split("|") if not (f[:1] in "rt" and f[1:].isdigit()))


def _measured(prof: Profile, name: str, cfg: TrainConfig) -> float:
    key = _without_processes(shape_key(name, shape_of(cfg), 1, 1))
    for k, v in prof.memory.items():
        if _without_processes(k) == key:
            return v
    raise KeyError(
        f"the profile of {prof.device} has no memory entry {key}: run `zerobench profile` on a GPU for this shape"
    )


def predict_memory(cfg: TrainConfig, prof: Profile) -> dict[str, float]:
    """Peak device bytes of one rank of ``cfg`` by term, and their ``total``."""
    z = cfg.zero
    buckets = engine_buckets(cfg)
    elem = z.precision.param_dtype.itemsize
    states = _state_bytes(cfg, sum(b.numel for b in buckets))
    if z.stage >= 2 and z.grad_accum_steps == 1:
        states["grads"] = 0.0  # not allocated until its buckets are first reduced, after the peak
    L = cfg.model.layers
    out = {f"states_{k}": v for k, v in states.items()}
    out["activations"] = _measured(prof, "step_peak_fixed", cfg) + L * _measured(prof, "step_peak_block", cfg)
    gathered = 0.0
    if z.stage == 3:
        unit_bytes: dict[int, float] = {}
        for b in buckets:
            unit_bytes[b.unit] = unit_bytes.get(b.unit, 0.0) + b.numel * elem
        blocks = [v for u, v in unit_bytes.items() if u != 0]
        gathered = unit_bytes.get(0, 0.0) + (max(blocks) if blocks else 0.0)
    out["stage3_gathered"] = gathered
    out["total"] = sum(out.values())
    return out


def _state_bytes(cfg: TrainConfig, numel: int) -> dict[str, float]:
    """The engine's device bytes of model states for ``numel`` parameters of ``cfg``, by category."""
    z = cfg.zero
    elem = z.precision.param_dtype.itemsize
    return model_state_bytes_analytic(
        numel,
        cfg.dp,
        z.stage,
        elem,
        elem,
        4 if z.precision.has_master else 0,
        make_codec(z.optim_bits).bytes_per_element(),
        offload_optimizer=z.offload_optimizer != "none",
        offload_param=z.offload_param != "none",
    )


def max_layers(cfg: TrainConfig, prof: Profile, budget_bytes: float, limit: int = 4096) -> int:
    """The most layers of ``cfg``'s shape whose predicted peak fits ``budget_bytes`` (0 if none)."""
    from zerobench.bench.search import largest_fitting

    def fits(layers: int) -> bool:
        deeper = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, layers=layers))
        return predict_memory(deeper, prof)["total"] <= budget_bytes

    return largest_fitting(fits, limit)


MEGATRON_2019_STATE_BYTES = 20
"""Bytes per parameter Megatron-LM 2019's own fp16 optimizer keeps (a run without ZeRO): the fp16 parameter and its
gradient (2 + 2), the fp32 master (4), the master's gradient, which ``fp16util.model_grads_to_master_grads``
allocates once and keeps (4; DeepSpeedExamples 07d1ce0d Megatron-LM/fp16/fp16util.py, as Megatron-LM 93ab4bea59),
and Adam's two fp32 moments (8)."""


def state_floor(cfg: TrainConfig, stack) -> dict[str, float]:
    """The bytes of model states one GPU of ``cfg`` holds at least when ``stack`` (a ``software.Stack``) runs it:
    the parameters of one TP rank (``params_per_mp_rank``, with the program's vocabulary padding) times the bytes
    its optimizer keeps per parameter. That is Megatron-LM 2019's own fp16 optimizer
    (``MEGATRON_2019_STATE_BYTES``) where the program steps without ZeRO, else the engine's states as ZeRO
    partitions them over the data-parallel ranks (``model_state_bytes_analytic``: the optimizer states from
    stage 1, the gradients from 2, the parameters at 3; the ZeRO paper's 2 + 2 + 12 bytes in mixed precision).
    Nothing else is counted (activations, buffers, fragmentation), so a run whose floor exceeds its card cannot
    run, whatever else the planners get wrong. ``{"bytes", "per_param", "params"}``."""
    from zerobench.models.sizes import padded_vocab
    from zerobench.plan.memory_model import params_per_mp_rank

    model = cfg.model
    if stack.vocab_multiple:
        model = dataclasses.replace(model, vocab=padded_vocab(model.vocab, cfg.tp, stack.vocab_multiple))
    params = params_per_mp_rank(model, cfg.tp)
    z = cfg.zero
    if z.stage == 0 and stack.step_loop is not None:
        per = float(MEGATRON_2019_STATE_BYTES)
    else:
        per = sum(_state_bytes(cfg, 1).values())
    return {"bytes": params * per, "per_param": per, "params": params}
