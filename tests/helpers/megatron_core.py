"""Rank body of the megatron-core peer's CPU test: the peer built up to its optimizer (Megatron's optimizers are
CUDA-only), with what it would hand Megatron recorded."""

from __future__ import annotations

import dataclasses

import torch


def build_without_optimizer(rank: int, world: int, precision: str) -> dict:
    from zerobench.distributed.mesh import build_mesh
    from zerobench.metrics.comm import CommLedger
    from zerobench.models.gpt import GPT
    from zerobench.models.sizes import num_params, preset
    from zerobench.peers.megatron_peer import MegatronCoreSystem
    from zerobench.train.config import TrainConfig
    from zerobench.zero.config import Precision, ZeroConfig

    class Recorded(MegatronCoreSystem):
        def _optimizer(self):
            return None  # Megatron's optimizer allocates on "cuda": checked separately, here it is not built

    cfg = TrainConfig(system="megatron-core", dp=1, preset="tiny", zero=ZeroConfig(precision=Precision(precision)))
    peer = Recorded("megatron-core", cfg, build_mesh(1, 1), CommLedger(), torch.device("cpu"))
    torch.manual_seed(cfg.seed)
    ours = GPT(preset("tiny"))
    try:
        MegatronCoreSystem._optimizer(peer)
        refused = ""
    except Exception as e:  # noqa: BLE001 - the test reads the message
        refused = f"{type(e).__name__}: {e}"
    opt = peer.optimizer_config()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, ours.config.vocab, (2, ours.config.seq), generator=g)
    y = torch.randint(0, ours.config.vocab, (2, ours.config.seq), generator=g)
    loss = peer.forward_backward(x, y)  # Float16Module (bf16) -> GPTModel -> DDP's gradient hooks
    with torch.no_grad():
        ref = ours(x, y)
    return {
        "loss": float(loss),
        "zerobench_loss": float(ref),
        "main_grads_nonzero": all(bool(p.main_grad.abs().sum() > 0) for p in peer.params),
        "megatron_params": sum(p.numel() for p in peer.params),
        "zerobench_params": sum(p.numel() for p in ours.parameters()),
        "formula": num_params(preset("tiny")),
        "param_dtypes": sorted({str(p.dtype) for p in peer.params}),
        "main_grad_dtypes": sorted({str(p.main_grad.dtype) for p in peer.params}),
        "grad_reduce_in_fp32": peer.ddp.ddp_config.grad_reduce_in_fp32,
        "optimizer": {k: v for k, v in dataclasses.asdict(opt).items() if k in OPTIMIZER_FIELDS},
        "embedding_equal": bool(
            torch.equal(peer.module.embedding.word_embeddings.weight.float(), ours.wte.weight.to(torch.float32))
            if precision == "fp32"
            else True
        ),
        "refused": refused,
    }


OPTIMIZER_FIELDS = ("optimizer", "lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "bf16", "clip_grad")
OPTIMIZER_FIELDS += ("use_distributed_optimizer",)
