"""Hugging Face ``transformers`` models trained by ``zerobench.zero.initialize`` in spawned ranks, as DeepSpeed
users train them (``out = engine(input_ids=ids, labels=ids)``; ``engine.backward(out.loss)``), and compared with
single-process ``torch.optim.AdamW`` training on the same global batch.

Tiny models, built from configs only (no download): GPT-2 (its ``lm_head`` tied to ``wte``, learned positions,
LayerNorm, Conv1D), Llama (untied head, RMSNorm, rotary positions, SwiGLU) and T5 (an encoder-decoder, its head
tied to the shared embedding; also trained in bf16 from encoder features given as a ``ModelOutput``). Dropout is off so that a rank's
forward and the reference's compute the same function. Each rank trains on its slice of the global batch; the
loss is the mean over a slice's tokens, so the reference's mean of the per-slice losses is the same objective.
"""

from __future__ import annotations

import copy
import warnings

import torch

from tests.helpers.user_models import error_line, slice_of
from zerobench.zero.state.shards import full_parameters

VOCAB, SEQ, GLOBAL_BATCH, STEPS = 128, 16, 4, 3
ATTN = "sdpa"  # what from_config picks on torch with SDPA (no flash-attn)
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def make_hf(kind: str):
    """A tiny ``GPT2LMHeadModel`` (``gpt2``), ``LlamaForCausalLM`` (``llama``) or ``T5ForConditionalGeneration``
    (``t5``) from a config, seeded."""
    import transformers

    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0,
        )  # fmt: skip
        cls = transformers.GPT2LMHeadModel
    elif kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=SEQ, tie_word_embeddings=False,
        )  # fmt: skip
        cls = transformers.LlamaForCausalLM
    elif kind == "t5":  # an encoder-decoder: two stacks of layers; its head tied to the shared embedding
        cfg = transformers.T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
            dropout_rate=0.0, decoder_start_token_id=0,
        )  # fmt: skip
        cls = transformers.T5ForConditionalGeneration
    else:
        raise ValueError(kind)
    cfg._attn_implementation = "eager" if kind == "t5" else ATTN  # T5 has no SDPA path
    torch.manual_seed(0)
    return cls(cfg)


def ds_config(stage: int, world: int) -> dict:
    """fp32, no clipping, AdamW on every parameter (``model_parameters`` given: the config's decay on each)."""
    return {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
        "zero_optimization": {"stage": stage},
    }


def batches(steps: int = STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g) for _ in range(steps)]


def reference_params(model, data, world: int) -> dict[str, torch.Tensor]:
    """A copy trained in one process by ``torch.optim.AdamW``: each step on the mean of the per-slice losses."""
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    for ids in data:
        slices = [slice_of(ids, r, world) for r in range(world)]
        torch.stack([ref(input_ids=s, labels=s).loss for s in slices]).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}


def compare(got: dict[str, torch.Tensor], model_before, ref: dict[str, torch.Tensor]) -> dict:
    """As ``user_models.compare``: the largest element difference and the relative L2 error of the update."""
    init = dict(model_before.named_parameters())
    diff = moved = num = den = 0.0
    for n, r in ref.items():
        if n not in got:
            continue
        d, u = got[n].float() - r, r - init[n].detach()
        diff, moved = max(diff, d.abs().max().item()), max(moved, u.abs().max().item())
        num, den = num + d.pow(2).sum().item(), den + u.pow(2).sum().item()
    return {
        "max_diff": diff,
        "update_rel_err": (num / max(den, 1e-30)) ** 0.5,
        "max_update": moved,
        "missing": sorted(set(ref) - set(got)),
    }


def layers(model) -> list:
    """The layers (stage 3's units when given): GPT-2's ``transformer.h``, Llama's ``model.layers``, T5's encoder's
    and decoder's ``block``."""
    if hasattr(model, "encoder"):
        return [*model.encoder.block, *model.decoder.block]
    return list(model.transformer.h) if hasattr(model, "transformer") else list(model.model.layers)


def train(rank: int, world: int, kind: str, stage: int, checkpointing: str = "", units: str = ""):
    """(engine, the model before training, the data, the last output): DeepSpeed's loop on this rank's slices.
    ``units``: ``"layers"``, the decoder layers given as stage 3's units (zerobench's ``units=``); ``"one"``, none
    (``units=[]``: the whole model one unit); ``""``, the default (initialize finds the layer lists).
    ``checkpointing``: HF's gradient checkpointing, non-reentrant, turned on through the engine after ``initialize``
    (``"engine"``: the module's own method) or on the model before it (``"model"``); ``"reentrant"`` (HF's default),
    through the engine; ``""``: off."""
    from zerobench.zero import initialize

    model = make_hf(kind)
    before = copy.deepcopy(model)
    kwargs = {"use_reentrant": checkpointing == "reentrant"}
    if checkpointing == "model":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    engine, _, _, _ = initialize(
        model=model,
        model_parameters=model.parameters(),
        config=ds_config(stage, world),
        units={"layers": layers(model), "one": [], "": None}[units],
    )
    if checkpointing in ("engine", "reentrant"):
        engine.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    data = batches()
    out = None
    for ids in data:
        mine = slice_of(ids, rank, world)
        out = engine(input_ids=mine, labels=mine)
        engine.backward(out.loss)
        engine.step()
    return engine, before, data, out


def run_parity(rank: int, world: int, cases: list[tuple]) -> dict[str, dict]:
    """Each (model kind, stage, gradient checkpointing as ``train`` takes it, layers as units) trained and compared; one case's failure
    is its result."""
    import warnings

    results = {}
    for kind, stage, ckpt, units in cases:
        key = case_key(kind, stage, ckpt, units)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                engine, before, data, out = train(rank, world, kind, stage, ckpt, units)
            r = compare(full_parameters(engine), before, reference_params(before, data, world))
            r["output"] = output_facts(out)
            r["checkpointing"] = [getattr(layer, "gradient_checkpointing", False) for layer in layers(engine.module)]
            gatherer = engine.gatherer
            r["units"] = None if gatherer is None else [type(b.module).__name__ for b in gatherer.blocks]
            r["one_unit_warnings"] = sum("ZeRO stage 3" in str(w.message) for w in caught)
            results[key] = r
        except Exception as e:  # noqa: BLE001 - one case's failure is that case's result, not the grid's
            results[key] = {"error": f"{type(e).__name__}: {e}"}
    return results


def case_key(kind: str, stage: int, ckpt: str = "", units: str = "") -> str:
    return f"{kind}-s{stage}{f'-ckpt-{ckpt}' if ckpt else ''}{f'-units-{units}' if units else ''}"


def output_facts(out) -> dict:
    """What an HF user reads from ``engine(...)``'s output: its class, its keys, the loss by attribute, key and
    index (one tensor), the logits' shape."""
    from transformers.utils import ModelOutput

    return {
        "type": type(out).__name__,
        "is_model_output": isinstance(out, ModelOutput),
        "keys": list(out.keys()),
        "same_loss": out.loss is out["loss"] and out.loss is out[0] and out.to_tuple()[0] is out.loss,
        "loss_grad": out.loss.requires_grad,
        "logits_shape": tuple(out.logits.shape),
    }


def _reloaded(kind: str, path, sd: dict, master: dict) -> dict:
    """``save_pretrained(path, state_dict=sd)`` on a fresh model of ``kind``, ``from_pretrained(path)``: how far its
    parameters are from the engine's fp32 master, whether the head is still tied, its state dict's keys."""
    fresh = make_hf(kind)
    fresh.save_pretrained(path, state_dict=sd)
    loaded = type(fresh).from_pretrained(path)
    named = dict(loaded.named_parameters(remove_duplicate=False))
    return {
        "keys_match": sorted(sd) == sorted(fresh.state_dict()),
        "max_diff": max((named[n] - v).abs().max().item() for n, v in master.items()),
        "head_diff": (loaded.lm_head.weight - loaded.get_input_embeddings().weight).abs().max().item(),
        "tied": loaded.lm_head.weight is loaded.get_input_embeddings().weight,
    }


def run_export(rank: int, world: int, kind: str, root: str) -> dict:
    """Stage-3 training on the decoder layers as units, then the model taken out as an HF user does it: the fp32
    state dict from ``save_16bit_model`` (training in fp32) and from ``save_checkpoint`` +
    ``get_fp32_state_dict_from_zero_checkpoint``, each given to ``save_pretrained(dir, state_dict=...)`` on DP rank 0
    and read back by ``from_pretrained(dir)``."""
    from pathlib import Path

    from zerobench.zero.compat.deepspeed.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    engine, _, _, _ = train(rank, world, kind, 3, units="layers")
    master = full_parameters(engine)
    root = Path(root)
    engine.save_16bit_model(root / "16bit")
    engine.save_checkpoint(root / "ckpt")
    refused = error_line(lambda: engine.module.save_pretrained(root / f"sharded{rank}"))  # only a shard is held
    counted = [engine.num_parameters()]  # placeholders outside a forward: 0
    with engine.gathered_params():  # the module's own save, its full parameters gathered on every rank
        counted.append(engine.num_parameters())
        if rank == 0:
            engine.module.save_pretrained(root / "gathered")
    engine.eval()
    prompt = batches(1)[0][:, :4]
    with torch.no_grad():
        generated = engine.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if rank != 0:
        return {}
    out = {"master_names": sorted(master), "refused": refused}
    out["num_parameters"] = (*counted, make_hf(kind).num_parameters())
    gathered = type(make_hf(kind)).from_pretrained(root / "gathered")
    out["gathered_diff"] = max((p - master[n]).abs().max().item() for n, p in gathered.named_parameters())
    out["generate_same"] = torch.equal(
        generated, gathered.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    )
    out["generated_shape"] = tuple(generated.shape)
    sd16 = torch.load(root / "16bit" / "pytorch_model.bin", weights_only=True)
    out["dtypes_16bit"] = sorted({str(v.dtype) for v in sd16.values()})
    out["16bit"] = _reloaded(kind, root / "hf16", sd16, master)
    out["zero_to_fp32"] = _reloaded(
        kind, root / "hf32", get_fp32_state_dict_from_zero_checkpoint(root / "ckpt"), master
    )
    return out


def run_encoder_outputs_bf16(rank: int, world: int) -> dict:
    """A tiny T5 trained under bf16 from encoder features computed elsewhere in fp32, passed as
    ``encoder_outputs=BaseModelOutput(...)`` (its decoder reads ``encoder_outputs[0]``), by ``apply_zero``'s
    engine, which casts every floating-point argument as FSDP does (DeepSpeed's ``initialize`` casts none, as
    DeepSpeed's engine): one step's loss and logits' dtype, or the error."""
    import transformers
    from transformers.modeling_outputs import BaseModelOutput

    from tests.helpers.ds import ds_apply_zero
    from zerobench.zero import AdamWConfig, ZeroConfig

    cfg = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(cfg)
    adamw = AdamWConfig(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    # the encoder gets no gradient: its outputs are given (DeepSpeed's initialize allows that by default)
    zc = ZeroConfig(stage=2, precision="bf16", optimizer=adamw, find_unused_parameters=True)
    engine = ds_apply_zero(model, None, zc, micro_batch=GLOBAL_BATCH // world)
    g = torch.Generator().manual_seed(rank)
    feats = BaseModelOutput(last_hidden_state=torch.randn(GLOBAL_BATCH // world, 5, 32, generator=g))
    labels = torch.randint(0, 64, (GLOBAL_BATCH // world, 4), generator=g)
    try:
        out = engine(encoder_outputs=feats, labels=labels)
        engine.backward(out.loss)
        engine.step()
    except Exception as e:  # noqa: BLE001 - the test reports what the rank saw
        return {"error": f"{type(e).__name__}: {e}"}
    return {"loss": out.loss.item(), "logits": str(out.logits.dtype), "applied": engine.was_step_applied()}


def run_generate_lengths(rank: int, world: int) -> dict:
    """Stage-3 ``generate`` where each rank's prompt ends at another length (its EOS comes early on rank 0), then a
    training step: each rank's tokens, the single model's, and whether the step ran. HF syncs the ranks' forwards
    (``synced_gpus``) only when it sees DeepSpeed's ZeRO-3 or FSDP."""
    from zerobench.zero import initialize

    model = make_hf("gpt2")
    plain = copy.deepcopy(model).eval()
    prompts = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        eos = int(plain.generate(prompts[:1], **kw)[0, 4])  # rank 0's first new token: it stops at once
        expected = [plain.generate(prompts[r : r + 1], eos_token_id=eos, **kw) for r in range(world)]
    engine, *_ = initialize(model=model, model_parameters=model.parameters(), config=ds_config(3, world))
    engine.eval()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        by_engine = engine.generate(prompts[rank : rank + 1], eos_token_id=eos, **kw)
        by_module = engine.module.generate(prompts[rank : rank + 1], eos_token_id=eos, **kw)
        # HF's Seq2SeqTrainer passes synced_gpus=is_deepspeed_zero3_enabled(): False, since it cannot see this engine
        by_trainer = engine.module.generate(prompts[rank : rank + 1], eos_token_id=eos, synced_gpus=False, **kw)
    engine.train()
    ids = batches(1)[0][rank : rank + 1]
    out = engine(input_ids=ids, labels=ids)
    engine.backward(out.loss)
    engine.step()
    engine.destroy()
    return {
        "lengths": [e.shape[1] for e in expected],
        "same": all(torch.equal(t, expected[rank]) for t in (by_engine, by_module, by_trainer)),
        "warned": [str(w.message) for w in caught if "synced_gpus=False" in str(w.message)],
        "stepped": engine.global_steps == 1,
        "unwrapped": "generate" not in model.__dict__,
    }
