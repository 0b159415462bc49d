"""The paper's baseline, Megatron-LM: megatron-core's own ``GPTModel`` (local layer spec), TP and DDP.

Same sizes, initial weights, data and batch as zerobench's GPT: the weights of an identically seeded
zerobench GPT are copied in (QKV rows reordered to megatron's per-head [q, k, v] grouping, then split
over TP like megatron splits them). Gradients live in megatron's grad buffers (``main_grad``), are
reduced by its DDP and fed to ``torch.optim.AdamW`` with the same hyperparameters and the same no-decay
rule for biases and norms. Needs ``pip install 'zerobench[megatron]'`` (megatron-core 0.16.1); on a CPU-only
machine it runs inside ``megatron_compat.cpu_compat``.

In fp16 and bf16 it trains with Megatron-LM's mixed precision (its ``Float16OptimizerWithFloat16Params``): the
model's parameters in 16 bits, fp32 main parameters that AdamW steps (its moments in fp32), copied back into the
model after each step. fp16 gradients are reduced in fp16 under a dynamic loss scale, and a step whose gradients
overflowed on any rank is skipped on every rank (zerobench's ``DynamicLossScaler`` with the run's loss-scale
settings); bf16 gradients are accumulated and reduced in fp32, as Megatron-LM turns on for bf16
(``accumulate_allreduce_grads_in_fp32``). Model states are then 16 bytes a parameter in fp16 (2 + 2 + 4 + 8: the
paper's §3.1 baseline) and 18 in bf16. Megatron-core's own optimizer is not used here: it allocates its scale and
overflow flag on CUDA (the ``megatron-core`` peer runs it on a GPU).
"""

from __future__ import annotations

import importlib.util

import torch

from zerobench.config import ConfigError
from zerobench.distributed.mesh import Mesh
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import storage_bytes
from zerobench.models.gpt import GPT, GPTConfig
from zerobench.train.config import TrainConfig

MEGATRON_VERSION = "0.16.1"


def require_megatron() -> None:
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ConfigError(
            f"the megatron baseline needs megatron-core: pip install 'zerobench[megatron]' (megatron-core=={MEGATRON_VERSION})"
        )


def megatron_state_from_gpt(gpt: GPT, tp_rank: int, tp: int) -> dict[str, torch.Tensor]:
    """This TP rank's megatron-core GPTModel parameters, from a full zerobench GPT."""
    cfg = gpt.config
    H, h = cfg.heads, cfg.hidden
    hd = h // H

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, dim=0)[tp_rank].clone()

    def cols(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, dim=-1)[tp_rank].clone()

    sd = {k: v.detach() for k, v in gpt.state_dict().items()}
    out = {
        "embedding.word_embeddings.weight": rows(sd["wte.weight"]),
        "embedding.position_embeddings.weight": sd["wpe.weight"].clone(),
        "decoder.final_layernorm.weight": sd["ln_f.weight"].clone(),
        "decoder.final_layernorm.bias": sd["ln_f.bias"].clone(),
    }
    for i in range(cfg.layers):
        src, dst = f"blocks.{i}.", f"decoder.layers.{i}."
        qkv_w = sd[src + "attn.qkv.weight"].view(3, H, hd, h).transpose(0, 1).reshape(3 * h, h)
        qkv_b = sd[src + "attn.qkv.bias"].view(3, H, hd).transpose(0, 1).reshape(3 * h)
        out.update(
            {
                dst + "input_layernorm.weight": sd[src + "ln_1.weight"].clone(),
                dst + "input_layernorm.bias": sd[src + "ln_1.bias"].clone(),
                dst + "self_attention.linear_qkv.weight": rows(qkv_w),
                dst + "self_attention.linear_qkv.bias": rows(qkv_b),
                dst + "self_attention.linear_proj.weight": cols(sd[src + "attn.proj.weight"]),
                dst + "self_attention.linear_proj.bias": sd[src + "attn.proj.bias"].clone(),
                dst + "pre_mlp_layernorm.weight": sd[src + "ln_2.weight"].clone(),
                dst + "pre_mlp_layernorm.bias": sd[src + "ln_2.bias"].clone(),
                dst + "mlp.linear_fc1.weight": rows(sd[src + "mlp.fc.weight"]),
                dst + "mlp.linear_fc1.bias": rows(sd[src + "mlp.fc.bias"]),
                dst + "mlp.linear_fc2.weight": cols(sd[src + "mlp.proj.weight"]),
                dst + "mlp.linear_fc2.bias": sd[src + "mlp.proj.bias"].clone(),
            }
        )
    return out


class MegatronSystem:
    """Megatron-LM baseline (stage-0 DDP with Megatron TP)."""

    masters: list[torch.Tensor] | None = None
    """fp32 main parameters in fp16/bf16 (None in fp32, and in the peer, whose optimizer holds its own)."""
    scaler = None
    """The fp16 loss scale (``DynamicLossScaler``; disabled in fp32/bf16); None in the peer."""

    def __init__(self, cfg: TrainConfig, mesh: Mesh, ledger: CommLedger, device: torch.device):
        require_megatron()
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
        from megatron.core.transformer.transformer_config import TransformerConfig

        from zerobench.baselines.megatron_compat import causal_mask, cpu_compat

        self.cpu_compat, self.ledger, self.cfg = cpu_compat, ledger, cfg
        m: GPTConfig = cfg.model
        dtype = cfg.zero.precision.param_dtype
        with cpu_compat():
            ps.initialize_model_parallel(tensor_model_parallel_size=cfg.tp)
            model_parallel_cuda_manual_seed(cfg.seed)
            recompute = {}
            if cfg.activation.checkpoint:
                recompute = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
            tcfg = TransformerConfig(
                num_layers=m.layers,
                hidden_size=m.hidden,
                num_attention_heads=m.heads,
                tensor_model_parallel_size=cfg.tp,
                use_cpu_initialization=True,
                params_dtype=dtype,
                bf16=dtype == torch.bfloat16,
                fp16=dtype == torch.float16,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                **recompute,
            )
            model = GPTModel(
                config=tcfg,
                transformer_layer_spec=get_gpt_layer_local_spec(),
                vocab_size=m.vocab,
                max_sequence_length=m.seq,
                position_embedding_type="learned_absolute",
                share_embeddings_and_output_weights=True,
            ).to(device)
            torch.manual_seed(cfg.seed)
            ref = GPT(m)
            state = megatron_state_from_gpt(ref, ps.get_tensor_model_parallel_rank(), cfg.tp)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(state[name])
            self.ddp = DistributedDataParallel(
                tcfg, self._ddp_config(DistributedDataParallelConfig), self._wrap(tcfg, model)
            )
        self.module, self.mesh, self.device = model, mesh, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        with cpu_compat():
            self.optimizer = self._optimizer()
        self.mask = causal_mask(m.seq, device)
        self.positions = torch.arange(m.seq, device=device).unsqueeze(0)
        self.micro = 0

    def _wrap(self, tcfg, model):
        """The module Megatron's DDP wraps: in fp16 and bf16 Megatron-LM's ``Float16Module`` (every parameter, norms
        too, in 16 bits; inputs cast in, the output cast back to fp32), as Megatron-LM wraps every mixed-precision
        model; in fp32 the model itself."""
        if self.cfg.zero.precision.value == "fp32":
            return model
        from megatron.core.transformer.module import Float16Module

        return Float16Module(tcfg, model)

    def _ddp_config(self, config_cls):
        """Megatron-LM's DDP settings: gradients accumulated and reduced in the parameters' dtype, in fp32 for bf16
        (Megatron-LM sets ``accumulate_allreduce_grads_in_fp32`` whenever it trains in bf16)."""
        return config_cls(grad_reduce_in_fp32=self.cfg.zero.precision.value == "bf16")

    def _optimizer(self):
        """``torch.optim.AdamW`` on the fp32 main parameters (the model's own in fp32), decay on 2+-dim ones only
        (zerobench's rule)."""
        from zerobench.zero.optim.loss_scale import DynamicLossScaler

        opt = self.cfg.zero.optimizer
        mixed = self.cfg.zero.precision.value != "fp32"
        self.masters = [p.detach().float().clone() for p in self.params] if mixed else None
        self.scaler = DynamicLossScaler(self.cfg.zero.loss_scale, enabled=self.cfg.zero.precision.value == "fp16")
        stepped = self.masters if mixed else self.params
        return torch.optim.AdamW(
            [
                {"params": [m for p, m in zip(self.params, stepped) if p.dim() >= 2], "weight_decay": opt.weight_decay},
                {"params": [m for p, m in zip(self.params, stepped) if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=opt.lr,
            betas=opt.betas,
            eps=opt.eps,
        )

    def forward_backward(self, x, y):
        with self.cpu_compat():
            accum = self.cfg.zero.grad_accum_steps
            self.micro += 1
            if self.micro % accum:
                with self.ddp.no_sync():
                    loss = self._loss(x, y, accum)
            else:
                loss = self._loss(x, y, accum)
            return loss

    def _loss(self, x, y, accum):
        loss = self.ddp(x, self.positions.expand_as(x), attention_mask=self.mask, labels=y).float().mean()
        scale = self.scaler.scale if self.scaler is not None else 1.0
        (loss * (scale / accum)).backward()
        return loss.detach()

    def step(self) -> bool:
        """One optimizer step, or False where fp16 gradients overflowed on some rank (the step skipped on every
        rank, the loss scale backed off; ``LossScaleAtMinimum`` where it cannot back off further)."""
        with self.cpu_compat():
            self.ddp.finish_grad_sync()
            if self.cfg.zero.clip_grad_norm is not None:
                raise ConfigError("gradient clipping is not wired for the megatron baseline")
            if self.masters is None:  # fp32: the model's parameters are the ones stepped
                for p in self.params:
                    p.grad = p.main_grad.to(p.dtype)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                return True
            unscale = 1.0 / self.scaler.scale
            for p, m in zip(self.params, self.masters):
                g = p.main_grad.float()  # bf16's fp32 main_grad itself, as Megatron-LM's alias: no copy at the peak
                m.grad = g.mul_(unscale) if self.scaler.enabled else g
            overflow = self._overflowed() if self.scaler.enabled else False
            self.scaler.update(overflow)  # raises before the step where the scale is already at its minimum
            if not overflow:
                self.optimizer.step()
                with torch.no_grad():
                    for p, m in zip(self.params, self.masters):
                        p.copy_(m)
            self.optimizer.zero_grad(set_to_none=True)
        return not overflow

    def _overflowed(self) -> bool:
        """Whether any rank's reduced gradients hold a non-finite value: each TP rank holds other shards, so the
        flag is agreed over the whole world (Megatron agrees it over the model-parallel group; DP ranks hold the
        same reduced gradients)."""
        from zerobench.distributed import collectives as C

        bad = torch.zeros(1, device=self.device)
        for m in self.masters:
            bad = torch.maximum(bad, (~torch.isfinite(m.grad)).any().float().reshape(1))
        C.all_reduce(bad, self.mesh.world, self.ledger, "overflow", op=torch.distributed.ReduceOp.MAX)
        return bool(bad.item())

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()

    def memory_ledger(self) -> dict[str, int]:
        grads = [p.main_grad for p in self.params]
        states = [t for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
        return {
            "params": storage_bytes(self.params),
            "grads": storage_bytes(grads),
            "master": storage_bytes(self.masters or []),
            "optimizer_states": storage_bytes(states),
            "comm_buffers": 0,
        }

    def model_state_bytes(self) -> int:
        led = self.memory_ledger()
        return led["params"] + led["grads"] + led["master"] + led["optimizer_states"]

    def model_state_bytes_analytic(self) -> None:
        return None

    def tensors(self) -> list[torch.Tensor]:
        return list(self.params) + list(self.masters or [])
