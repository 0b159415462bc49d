"""DeepSpeed's configuration read into zerobench's (``zerobench/zero/ds_config.py``): what each key becomes, the
batch triple resolved as DeepSpeed resolves it, and every key zerobench cannot honour refused in one line."""

from __future__ import annotations

import base64
import json

import pytest

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.config import batch_sizes, from_deepspeed
from zerobench.zero.config import LossScaleRule, Precision, ZeroConfig
from zerobench.zero.optim.loss_scale import DynamicLossScaler

ZERO2_BF16 = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "steps_per_print": 10,
    "wall_clock_breakdown": False,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 50_000_000,
        "allgather_bucket_size": 5e8,
    },
}


def test_a_zero2_bf16_config():
    ds = from_deepspeed(ZERO2_BF16, dp=8)
    z = ds.zero
    assert (z.stage, z.precision, z.bucket_numel, z.overlap_comm, z.clip_grad_norm) == (
        2,
        Precision.BF16,
        50_000_000,
        True,
        1.0,
    )
    assert (ds.micro_batch, z.grad_accum_steps, ds.train_batch) == (4, 2, 64)
    assert (z.optimizer.lr, z.optimizer.betas, z.optimizer.weight_decay) == (3e-4, (0.9, 0.95), 0.1)
    assert z.find_unused_parameters  # DeepSpeed's ignore_unused_parameters defaults to true
    assert set(ds.ignored) == {
        "steps_per_print",
        "wall_clock_breakdown",
        "zero_optimization.contiguous_gradients",
        "zero_optimization.allgather_bucket_size",
    }


def test_torch_adam_takes_torch_adamws_default_weight_decay():
    """DeepSpeed builds ``torch.optim.AdamW(params, **params)`` under ``torch_adam``, whose weight decay defaults to
    0.01 (FusedAdam's and DeepSpeedCPUAdam's to 0); before, it was 0 here, and the weights drifted from
    DeepSpeed's by lr x 0.01 x |w| a step."""
    for kind in ("Adam", "AdamW"):
        torch_adam = {"type": kind, "params": {"lr": 1e-3, "torch_adam": True, "foreach": False}}
        fused = {"type": kind, "params": {"lr": 1e-3}}
        got = [from_deepspeed({"train_micro_batch_size_per_gpu": 2, "optimizer": o}, dp=1) for o in (torch_adam, fused)]
        assert [c.zero.optimizer.weight_decay for c in got] == [0.01, 0.0]
    given = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True, "weight_decay": 0.2}}
    assert (
        from_deepspeed({"train_micro_batch_size_per_gpu": 2, "optimizer": given}, 1).zero.optimizer.weight_decay == 0.2
    )


def test_deepspeeds_defaults():
    """Adam's betas (0.9, 0.999) and weight decay 0; overlap_comm on at stage 3 only; clipping at 1.0 (0: none);
    fp32."""
    base = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    z2 = from_deepspeed({**base, "zero_optimization": {"stage": 2}}, dp=2).zero
    z3 = from_deepspeed({**base, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}}, dp=2).zero
    assert (z2.optimizer.betas, z2.optimizer.weight_decay, z2.clip_grad_norm) == ((0.9, 0.999), 0.0, 1.0)
    assert from_deepspeed({**base, "gradient_clipping": 0}, dp=2).zero.clip_grad_norm is None
    assert from_deepspeed({**base, "gradient_clipping": 0.5}, dp=2).zero.clip_grad_norm == 0.5
    assert (z2.overlap_comm, z3.overlap_comm, z2.precision, z3.prefetch) == (False, True, Precision.FP32, False)
    assert from_deepspeed(base, dp=1).zero.stage == 0
    assert (
        not from_deepspeed(base, dp=1).drop_last and from_deepspeed({**base, "dataloader_drop_last": True}, 1).drop_last
    )


def test_fp16_loss_scaling():
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 1},  # a ZeRO optimizer's scaler; stage 0's is the next test's
        "fp16": {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 12,
            "loss_scale_window": 500,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
    }
    z = from_deepspeed(cfg, dp=1).zero
    ls = z.loss_scale
    assert (z.precision, ls.init_scale, ls.growth_interval, ls.hysteresis, ls.min_scale) == (
        Precision.FP16,
        4096.0,
        500,
        2,
        1.0,
    )
    assert (ls.rule, ls.consecutive_hysteresis) == (LossScaleRule.DEEPSPEED, False)
    on = from_deepspeed({**cfg, "fp16": {"enabled": True, "consecutive_hysteresis": True}}, dp=1).zero.loss_scale
    assert (on.rule, on.consecutive_hysteresis, on.hysteresis, on.growth_interval, on.init_scale) == (
        LossScaleRule.DEEPSPEED,
        True,
        2,
        1000,
        2.0**16,
    )  # DeepSpeed's defaults where a key is absent


def test_without_zero_the_fp16_scale_has_no_hysteresis_and_skips_at_its_minimum():
    """At stage 0 DeepSpeed's fp16 optimizer (``FP16_Optimizer``) backs the scale off at every overflow, whatever
    ``hysteresis`` says, and at ``min_loss_scale`` only skips the step; its growth rule is the ZeRO optimizers'."""
    fp16 = {"enabled": True, "initial_scale_power": 3, "loss_scale_window": 2, "hysteresis": 2, "min_loss_scale": 2}
    ds = from_deepspeed({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}, "fp16": fp16}, dp=1)
    ls = ds.zero.loss_scale
    assert (ls.rule, ls.hysteresis, ls.stop_at_min, ls.growth_interval) == (LossScaleRule.DEEPSPEED, 1, False, 2)
    assert "fp16.hysteresis" in ds.ignored
    scaler = DynamicLossScaler(ls, enabled=True)
    scales = []
    with pytest.warns(RuntimeWarning, match="loss scale at its minimum 2: step skipped"):
        for overflow in (True, True, True, False, False, False, True):
            scaler.update(overflow)
            scales.append(scaler.scale)
    assert scales == [4, 2, 2, 2, 2, 4, 2] and scaler.skipped_steps == 4 and scaler.updates == 7
    one = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 1}}
    zero = from_deepspeed({**one, "fp16": fp16}, dp=1)
    assert (zero.zero.loss_scale.hysteresis, zero.zero.loss_scale.stop_at_min) == (2, True)  # a ZeRO optimizer's


def test_a_static_fp16_loss_scale_skips_overflowing_steps_and_never_moves():
    """DeepSpeed's ``fp16.loss_scale`` > 0: a fixed scale. Its ZeRO optimizers still skip an overflowing step."""
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "fp16": {"enabled": True, "loss_scale": 128, "initial_scale_power": 12, "hysteresis": 2},
    }
    ds = from_deepspeed(cfg, dp=1)
    assert ds.zero.loss_scale.init_scale == 128.0 and set(ds.ignored) == {"fp16.initial_scale_power", "fp16.hysteresis"}
    assert ds.zero.loss_scale.rule is LossScaleRule.STATIC
    scaler = DynamicLossScaler(ds.zero.loss_scale, enabled=True)
    for overflow in [True, False, True, True] + [False] * 2000:
        scaler.update(overflow)
    assert (scaler.scale, scaler.skipped_steps) == (128.0, 3)


def test_offload():
    base = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}}
    z = from_deepspeed(
        {
            **base,
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": True},
                "offload_param": {"device": "cpu"},
            },
        },
        dp=1,
    ).zero
    assert (z.offload_optimizer, z.nvme_path, z.offload_param) == ("nvme", "/nvme", "cpu")
    legacy = from_deepspeed({**base, "zero_optimization": {"stage": 2, "cpu_offload": True}}, dp=1).zero
    assert legacy.offload_optimizer == "cpu"


@pytest.mark.parametrize(
    "given, dp, want",
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (4, 2, 32)),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 4}, 4, (2, 4, 32)),
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, 2, (4, 3, 24)),
        ({"train_batch_size": 16}, 4, (4, 1, 16)),
        ({"train_micro_batch_size_per_gpu": 5}, 3, (5, 1, 15)),
        (
            {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4},
            2,
            (3, 4, 24),
        ),
    ],
)
def test_the_batch_triple_as_deepspeed_resolves_it(given, dp, want):
    assert batch_sizes(given, dp) == want


@pytest.mark.parametrize(
    "cfg, words",
    [
        (
            {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
            "train_batch_size 30 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x 2 DP ranks (16)",
        ),
        (
            {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4},
            "not a multiple of train_micro_batch_size_per_gpu",
        ),
        ({"gradient_accumulation_steps": 2}, "give train_batch_size or train_micro_batch_size_per_gpu"),
        ({"train_micro_batch_size_per_gpu": "auto"}, "'auto' is filled in by Hugging Face's Trainer"),
        ({"train_micro_batch_size_per_gpu": 0}, "must be a positive integer, got 0"),
    ],
)
def test_a_batch_that_does_not_add_up_is_one_line(cfg, words):
    with pytest.raises(ConfigError) as e:
        batch_sizes(cfg, 2)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "cfg",
    [
        {"train_batch_size": 33, "train_micro_batch_size_per_gpu": 17, "gradient_accumulation_steps": 2},
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 18},
        {"train_batch_size": 33, "gradient_accumulation_steps": 2},
        {"gradient_accumulation_steps": 2},
        {"train_batch_size": -4},
    ],
)
def test_a_batch_that_does_not_add_up_is_an_assertion_error_as_deepspeeds(cfg):
    """DeepSpeed asserts the triple (its ``TestBatchConfig`` catches ``AssertionError``); it was a plain
    ``ConfigError`` here. It stays one (one line)."""
    with pytest.raises(AssertionError) as e:
        batch_sizes(cfg, 2)
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value)


OK = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}}


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"scheduler": {"type": "WarmupCosine"}}, "scheduler.type 'WarmupCosine': unknown"),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}},
            "params for WarmupLR: unknown warmup_steps",
        ),
        ({"scheduler": {"type": "WarmupDecayLR", "params": {}}}, "params for WarmupDecayLR: missing total_num_steps"),
        ({"scheduler": {"type": "StepLR", "params": {"gamma": 0.5}}}, "params for StepLR: missing step_size"),
        ({"scheduler": {"type": "LambdaLR", "params": {}}}, "'LambdaLR' takes a function: build it in code"),
        ({"scheduler": {"type": "ReduceLROnPlateau"}}, "steps on a metric"),
        ({"scheduler": {"params": {"warmup_num_steps": 10}}}, "scheduler: give its type"),
        ({"scheduler": {"type": "WarmupLR", "param": {}}}, "scheduler: unknown param"),
        ({"scheduler": "WarmupLR"}, "scheduler: must be an object"),
        # values the constructor refuses, with the config, before any engine partitions the model
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}}, "warmup_type 'cosine': give 'log'"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}, "warmup_num_steps: must be a posit"),
        (  # torch's own message spans lines: one line here
            {"scheduler": {"type": "StepLR", "params": {"step_size": 10, "last_epoch": 5}}},
            "scheduler StepLR: \"param 'initial_lr' is not specified in param_groups[0]",
        ),
        (
            {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_min_ratio": "0.1"}}},
            "scheduler WarmupCosineLR: scheduler warmup_min_ratio: must be a number, got '0.1'",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
            "scheduler.params.warmup_num_steps: 'auto' is filled in by Hugging Face's Trainer",
        ),
        ({"optimizer": {"type": "Lamb"}}, "optimizer.type 'Lamb'"),
        ({"optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}, "only decoupled weight decay"),
        ({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}}, "optimizer.params: unknown momentum"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, "optimizer.params.lr: must be a finite number"),
        ({"fp16": {"enabled": True, "loss_scale": -1}}, "give 0 (dynamic) or a positive static scale"),
        ({"fp16": {"enabled": True, "loss_scale_window": 0}}, "fp16.loss_scale_window 0: must be >= 1"),
        ({"fp16": {"enabled": True, "min_loss_scale": 0}}, "fp16.min_loss_scale 0: must be > 0"),
        ({"fp16": {"enabled": True, "consecutive_hysteresis": "auto"}}, "fp16.consecutive_hysteresis: must be true or"),
        ({"gradient_clipping": -1}, "gradient_clipping -1: give a positive norm to clip to, or 0 for no clipping"),
        (
            {"fp16": {"enabled": "auto"}},
            "fp16.enabled: must be true or false, got 'auto' ('auto' is filled in by Hugging",
        ),
        ({"bf16": {"enabled": "true"}}, "bf16.enabled: must be true or false, got 'true'"),
        (
            {"zero_optimization": {"stage": 2, "overlap_comm": "auto"}},
            "zero_optimization.overlap_comm: must be true or false",
        ),
        ({"dataloader_drop_last": 1}, "dataloader_drop_last: must be true or false, got 1"),
        ({"fp16": {"enabled": True, "loss_scale": "dynamic"}}, "fp16.loss_scale: must be a finite number"),
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "enables both bf16 and fp16"),
        ({"zero_optimization": {"stage": 4}}, "unknown ZeRO stage 4"),
        ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "quantized weight communication"),
        ({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 1}}, "zero_optimization.reduce_bucket_sise: unknown"),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "offload_param.device 'nvme'"),
        ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}, "partial offload"),
        ({"gradient_acumulation_steps": 2}, "unknown key 'gradient_acumulation_steps'"),
        ({"fp16": {"enabled": True, "loss_scale_windw": 100}}, "fp16: unknown loss_scale_windw"),
        ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, "bf16 master weights"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memroy": True}}},
            "zero_optimization.offload_optimizer: unknown pin_memroy",
        ),
        ({"optimizer": {"type": "AdamW", "param": {"lr": 0.1}}}, "optimizer: unknown param"),
        ({"communication_data_type": "fp32"}, "reduced in the training dtype"),
        ({"gradient_predivide_factor": 2.0}, "gradient_predivide_factor"),
        # what Python's JSON reader accepts and no DeepSpeed key means: Infinity and NaN (every step skipped at an
        # infinite static loss scale; a count that is not one)
        ({"fp16": {"enabled": True, "loss_scale": float("inf")}}, "fp16.loss_scale: must be a finite number, got inf"),
        ({"fp16": {"enabled": True, "loss_scale": float("nan")}}, "fp16.loss_scale: must be a finite number, got nan"),
        ({"gradient_clipping": float("inf")}, "gradient_clipping: must be a finite number, got inf"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": float("nan")}}}, "optimizer.params.lr: must be a finite"),
        ({"train_batch_size": float("nan")}, "train_batch_size: must be an integer, got nan"),
        ({"zero_optimization": {"stage": float("inf")}}, "zero_optimization.stage: must be an integer, got inf"),
        ({"fp16": {"enabled": True, "initial_scale_power": 1024}}, "fp16.initial_scale_power 1024: give -127 to 127"),
        ({"fp16": {"enabled": True, "min_loss_scale": 2.0**20}}, "minimum loss scale 1.04858e+06 is above the init"),
        # switches written as strings: "false" is truthy, so each would silently mean true
        ({"optimizer": {"type": "AdamW", "params": {"torch_adam": "false"}}}, "params.torch_adam: must be true or"),
        ({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": "false"}}}, "params.adam_w_mode: must be true or"),
        ({"optimizer": {"type": "AdamW", "params": {"amsgrad": "false"}}}, "params.amsgrad: must be true or false"),
        ({"bf16": {"enabled": True, "check_grad_overflow": "no"}}, "bf16.check_grad_overflow: must be true or"),
        ({"fp16": {"enabled": True, "fp16_master_weights_and_grads": "no"}}, "fp16_master_weights_and_grads: must"),
        ({"optimizer": {"type": "AdamW", "params": [1, 2]}}, "optimizer.params: must be an object, got [1, 2]"),
        # schedule values its constructor takes and a later step refuses: refused before any step is applied
        ({"scheduler": {"type": "StepLR", "params": {"step_size": 1, "gamma": "x"}}}, "scheduler StepLR: at step 1"),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_max_lr": -0.1}}},
            "scheduler WarmupLR: its learning rate comes out",
        ),
    ],
)
def test_what_zerobench_cannot_honour_is_refused_in_one_line(extra, words):
    with pytest.raises(ConfigError) as e:
        from_deepspeed({**OK, **extra}, dp=1)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_zero_plus_plus_keys_at_deepspeeds_defaults_are_accepted():
    off = {
        "zero_quantized_weights": False,
        "zero_quantized_gradients": False,
        "zero_hpz_partition_size": 1,
        "mics_shard_size": -1,
    }
    assert from_deepspeed({**OK, "zero_optimization": {"stage": 3, **off}}, dp=1).zero.stage == 3
    for key, on in (("zero_hpz_partition_size", 8), ("mics_shard_size", 8)):
        with pytest.raises(ConfigError, match=f"zero_optimization.{key}: .* is not supported"):
            from_deepspeed({**OK, "zero_optimization": {"stage": 3, **off, key: on}}, dp=1)


def test_activation_checkpointing_and_logging_sections_change_nothing():
    ds = from_deepspeed({**OK, "activation_checkpointing": {"partition_activations": False}, "tensorboard": {}}, dp=1)
    assert set(ds.ignored) == {"activation_checkpointing", "tensorboard"}


def test_a_json_file_and_its_faults(tmp_path):
    good = tmp_path / "ds_config.json"
    good.write_text(json.dumps(ZERO2_BF16))
    assert from_deepspeed(str(good), dp=8).zero.stage == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_batch_size": 8,')
    for path, words in ((bad, "is not valid JSON"), (tmp_path / "none.json", "no such file")):
        with pytest.raises(ConfigError, match=words) as e:
            from_deepspeed(path, dp=1)
        assert "\n" not in str(e.value)
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        from_deepspeed(listed, dp=1)
    # as DeepSpeed reads a config: HJSON (comments, trailing commas), or the file's text base64-encoded
    commented = tmp_path / "commented.json"
    commented.write_text(
        '{\n  // ZeRO-2\n  "train_batch_size": 8,\n  "optimizer": {"type": "AdamW",},\n'
        '  "zero_optimization": {"stage": 2,},\n}\n'
    )
    assert from_deepspeed(commented, dp=8).zero.stage == 2
    encoded = base64.urlsafe_b64encode(json.dumps(ZERO2_BF16).encode()).decode()
    assert from_deepspeed(encoded, dp=8).zero.stage == 2
    with pytest.raises(ConfigError, match="no such file") as e:
        from_deepspeed("ds_confg.json", dp=1)
    assert "\n" not in str(e.value)
    huge = tmp_path / "huge.json"  # hjson reads 1e400 as an int, which overflows in its own reading
    huge.write_text('{"train_batch_size": 8, "gradient_clipping": 1e400}')
    with pytest.raises(ConfigError, match="is not valid JSON") as e:
        from_deepspeed(huge, dp=1)
    assert "\n" not in str(e.value)
    # a key given twice: json's last-one-wins would train at the second stage, silently (DeepSpeed refuses it)
    twice = tmp_path / "twice.json"
    twice.write_text('{"train_batch_size": 8, "zero_optimization": {"stage": 3}, "zero_optimization": {"stage": 1}}')
    with pytest.raises(ValueError, match=r"Duplicate keys in DeepSpeed config: \['zero_optimization'\]") as e:
        from_deepspeed(twice, dp=1)
    assert "\n" not in str(e.value) and str(twice) in str(e.value)


@pytest.mark.parametrize(
    "section",
    [
        {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}},
        {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2}},
        {
            "type": "CosineAnnealingLR",
            "params": {"T_max": 50},
        },  # not DeepSpeed's: torch.optim.lr_scheduler's, as DeepSpeed
        {"type": "OneCycleLR", "params": {"max_lr": 0.1, "total_steps": 20}},
        # what a schedule refuses only at a late batch of its own (beta1 reaching 1 at batch 1311), or a rate that
        # grows without bound, is left to that batch: a shorter run never meets it
        {
            "type": "OneCycle",
            "params": {
                "cycle_min_lr": 1e-4,
                "cycle_max_lr": 1e-2,
                "cycle_first_step_size": 100,
                "decay_step_size": 100,
                "decay_mom_rate": 0.01,
            },
        },
        {"type": "ExponentialLR", "params": {"gamma": 1.5}},
        {"type": "OneCycleLR", "params": {"max_lr": 0.1, "epochs": 2, "steps_per_epoch": 5}},
    ],
)
def test_a_scheduler_section_is_read_as_its_type_and_arguments(section):
    """Each is also stepped on a stand-in before the engine exists (``_dry_build``), which refuses none of them: not
    torch's OneCycleLR either, which refuses a step past its own ``total_steps``."""
    spec = from_deepspeed({**OK, "scheduler": section}, dp=2).scheduler
    assert (spec.type, spec.params) == (section["type"], section["params"])
    assert from_deepspeed(OK, dp=2).scheduler is None


def test_with_a_client_optimizer_the_optimizer_section_is_optional_and_ignored():
    """``initialize(optimizer=...)``: the client's groups carry the hyperparameters, as DeepSpeed lets them."""
    assert from_deepspeed({"train_batch_size": 2}, dp=1, client_optimizer=True).ignored == ()
    ds = from_deepspeed({"train_batch_size": 2, "optimizer": {"type": "Lamb"}}, dp=1, client_optimizer=True)
    assert ds.ignored == ("optimizer",)
    with pytest.raises(ConfigError, match=r"DeepSpeed config has no optimizer: add .* or pass initialize\(optimizer="):
        from_deepspeed({"train_batch_size": 2}, dp=1)


def test_a_config_without_an_optimizer_says_how_to_give_one():
    for cfg in ({"train_micro_batch_size_per_gpu": 1}, {"train_micro_batch_size_per_gpu": 1, "optimizer": {}}):
        with pytest.raises(ConfigError) as e:
            from_deepspeed(cfg, dp=1)
        assert str(e.value).startswith('DeepSpeed config has no optimizer: add {"optimizer"') and "\n" not in str(
            e.value
        )


def test_checkpoint_tag_validation_as_deepspeed_reads_it():
    """``checkpoint.tag_validation``: DeepSpeed's three modes in any case, ``Warn`` by default; another value, and
    ``load_universal`` (DeepSpeed's universal checkpoints), are one line each; the section's other keys are
    listed as ignored."""
    base = {"train_batch_size": 2, "optimizer": {"type": "AdamW"}}
    assert from_deepspeed(base, dp=1).tag_validation == "WARN"
    for given, want in (("Fail", "FAIL"), ("ignore", "IGNORE"), ("WARN", "WARN")):
        assert from_deepspeed({**base, "checkpoint": {"tag_validation": given}}, dp=1).tag_validation == want
    with pytest.raises(ConfigError, match=r"checkpoint.tag_validation: must be Warn, Ignore or Fail .*got 'foo'"):
        from_deepspeed({**base, "checkpoint": {"tag_validation": "foo"}}, dp=1)
    with pytest.raises(
        ConfigError, match=r"checkpoint\.load_universal: DeepSpeed's universal checkpoints are not read"
    ):
        from_deepspeed({**base, "checkpoint": {"load_universal": True}}, dp=1)
    ds = from_deepspeed({**base, "checkpoint": {"load_universal": False, "use_node_local_storage": True}}, dp=1)
    assert "checkpoint.use_node_local_storage" in ds.ignored and ds.tag_validation == "WARN"


def test_bf16_is_read_as_deepspeed_reads_it_and_legacy_fusion_is_listed():
    """``{"bf16": {}, "bfloat16": {"enabled": true}}`` trained in bf16 here and in fp32 in DeepSpeed, which reads
    ``bf16`` whenever the key is there (a helper's review against DeepSpeed 0.19.8). And ``optimizer.legacy_fusion``
    was accepted without being listed among the keys read without effect."""
    from zerobench.zero.config import Precision

    base = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "legacy_fusion": False}}
    both = from_deepspeed({**base, "bf16": {}, "bfloat16": {"enabled": True}}, dp=1)
    assert both.zero.precision is Precision.FP32 and "bfloat16" in both.ignored
    assert from_deepspeed({**base, "bfloat16": {"enabled": True}}, dp=1).zero.precision is Precision.BF16
    assert "optimizer.legacy_fusion" in both.ignored


def test_forward_inputs_are_cast_as_deepspeed_casts_them():
    """DeepSpeed's engine casts no forward input, except under ``fp16.auto_cast``, which casts the positional ones to
    half; the key is read, not listed as ignored. ``apply_zero``'s own engine casts every floating-point argument, as
    FSDP does. The mode is the engine's attribute, not a ``ZeroConfig`` field: a run's identity (its config hash)
    does not move with it."""
    from zerobench.zero.engine import ZeroEngine

    base = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    cases = {
        "none": [base, {**base, "bf16": {"enabled": True}}, {**base, "fp16": {"enabled": True}}],
        "positional": [
            {**base, "fp16": {"enabled": True, "auto_cast": True}},
            {**base, "fp16": {"enabled": True, "auto_cast": True, "loss_scale": 128}},
        ],
    }
    for want, configs in cases.items():
        for cfg in configs:
            ds = from_deepspeed(cfg, dp=1)
            assert ds.cast_inputs == want, cfg
            assert not any("auto_cast" in k for k in ds.ignored), ds.ignored
    assert ZeroEngine.cast_forward_inputs == "all"
    assert "cast_forward_inputs" not in {f.name for f in __import__("dataclasses").fields(ZeroConfig)}


@pytest.mark.parametrize(
    "name, value",
    [
        ("prefetch_bucket_size", 0),
        ("param_persistence_threshold", 100),
        ("model_persistence_threshold", 100),
        ("max_live_parameters", 10**8),
        ("max_reuse_distance", 10**8),
        ("gather_16bit_weights_on_model_save", True),
        ("module_granularity_threshold", 0),
        ("use_all_reduce_for_fetch_params", False),
    ],
)
def test_stage3_keys_are_read_under_deepspeeds_names_without_the_prefix(name, value):
    """DeepSpeed's config model names each stage-3 field without ``stage3_`` and takes the prefixed name as an
    alias; the un-prefixed names were refused here as unknown keys. Both mean the same; both given with different
    values is one line."""
    zero = {"stage": 3, name: value}
    prefixed = {"stage": 3, f"stage3_{name}": value}
    got, want = (from_deepspeed({**OK, "zero_optimization": z}, dp=1) for z in (zero, prefixed))
    assert (got.zero, got.gather_16bit_on_save) == (want.zero, want.gather_16bit_on_save)
    assert [k.replace("stage3_", "") for k in want.ignored] == list(got.ignored)
    if name == "prefetch_bucket_size":
        assert got.zero.prefetch is False
    if name.startswith("gather"):
        assert got.gather_16bit_on_save is True
    same = {**zero, f"stage3_{name}": value}
    assert from_deepspeed({**OK, "zero_optimization": same}, dp=1).zero == want.zero
    other = not value if isinstance(value, bool) else value + 1
    with pytest.raises(ConfigError) as e:
        from_deepspeed({**OK, "zero_optimization": {**zero, f"stage3_{name}": other}}, dp=1)
    assert f"{name} {value!r} and stage3_{name} {other!r} are one key" in str(e.value) and "\n" not in str(e.value)


def test_the_fp16_name_of_gather_on_save_is_one_key_with_the_16bit_names():
    for key in ("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"):
        assert from_deepspeed({**OK, "zero_optimization": {"stage": 3, key: True}}, dp=1).gather_16bit_on_save
    both = {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True, "gather_16bit_weights_on_model_save": False}
    with pytest.raises(ConfigError, match="are one key"):
        from_deepspeed({**OK, "zero_optimization": both}, dp=1)


def test_deepspeeds_legacy_offload_switches():
    """DeepSpeed's older parameter-offload switch is ``cpu_offload_param``; ``cpu_offload_params``, which zerobench
    read and documented, is a key DeepSpeed refuses, and ``cpu_offload_param`` was refused here as unknown."""
    base = {**OK, "zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": True}}
    z = from_deepspeed(base, dp=1).zero
    assert (z.offload_optimizer, z.offload_param) == ("cpu", "cpu")
    pinned = {"stage": 2, "cpu_offload": True, "cpu_offload_use_pin_memory": True}
    assert (
        "zero_optimization.cpu_offload_use_pin_memory" in from_deepspeed({**OK, "zero_optimization": pinned}, 1).ignored
    )
    with pytest.raises(ConfigError) as e:
        from_deepspeed({**OK, "zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_params": True}}, 1)
    assert "cpu_offload_params: DeepSpeed's key is cpu_offload_param" in str(e.value)
    agree = {"stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert from_deepspeed({**OK, "zero_optimization": agree}, 1).zero.offload_optimizer == "cpu"
    clash = {"stage": 2, "cpu_offload": False, "offload_optimizer": {"device": "cpu"}}
    with pytest.raises(AssertionError) as e:  # DeepSpeed asserts a deprecated key beside its replacement
        from_deepspeed({**OK, "zero_optimization": clash}, 1)
    assert isinstance(e.value, ConfigError) and "cpu_offload (False) is DeepSpeed's older spelling" in str(e.value)


def test_keys_whose_value_is_what_zerobench_does_are_taken():
    """``data_types.grad_accum_dtype`` naming the training dtype, ``gradient_allreduce_op`` ``mean``, the ``aio``
    section (NVMe I/O tuning) and ``zero_optimization.pipeline_loading_checkpoint`` (load order) were refused as
    unknown keys; each describes what zerobench does anyway, or tunes only speed or host memory."""
    cfg = {
        **OK,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "bf16"},
        "gradient_allreduce_op": "MEAN",
        "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": False},
        "zero_optimization": {"stage": 3, "pipeline_loading_checkpoint": True},
    }
    ds = from_deepspeed(cfg, dp=1)
    assert ds.zero.precision is Precision.BF16 and ds.zero.stage == 3
    assert set(ds.ignored) == {
        "data_types.grad_accum_dtype",
        "gradient_allreduce_op",
        "aio",
        "zero_optimization.pipeline_loading_checkpoint",
    }
    for dtype, precision in (("fp32", {}), ("float16", {"fp16": {"enabled": True}}), ("bfloat16", cfg)):
        assert from_deepspeed({**OK, **precision, "data_types": {"grad_accum_dtype": dtype}}, dp=1).zero


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
            (
                "data_types.grad_accum_dtype 'fp32': zerobench accumulates and reduces gradients in the training "
                "dtype (bf16); give 'bf16' or remove the key"
            ),
        ),
        ({"data_types": {"grad_accum_dtype": "int8"}}, "grad_accum_dtype 'int8': give fp32, fp16 or bf16"),
        ({"data_types": {"grad_acum_dtype": "fp32"}}, "data_types: unknown grad_acum_dtype"),
        ({"gradient_allreduce_op": "sum"}, "gradient_allreduce_op 'sum': gradients are averaged over DP ranks (mean)"),
    ],
)
def test_values_of_those_keys_zerobench_does_not_train_are_one_line(extra, words):
    with pytest.raises(ConfigError) as e:
        from_deepspeed({**OK, **extra}, dp=1)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "zero, words",
    [
        (
            {"stage": 3, "offload_param": {"device": "cpu"}},
            "offload_param: zerobench offloads parameters together with the optimizer: set zero_optimization.offload",
        ),
        (
            {"stage": 2, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
            "set zero_optimization.stage 3 (it is 2) and offload_optimizer.device to cpu or nvme",
        ),
        ({"stage": 3, "cpu_offload_param": True}, "offload_optimizer.device to cpu or nvme too"),
        ({"stage": 0, "offload_optimizer": {"device": "cpu"}}, "set zero_optimization.stage to 1, 2 or 3"),
        (
            {"stage": 2, "offload_optimizer": {"device": "nvme"}},
            "offload_optimizer.device nvme: give offload_optimizer",
        ),
    ],
)
def test_an_offload_zerobench_cannot_run_is_refused_in_the_configs_keys(zero, words):
    """These were refused in ``zerobench train``'s flags (``--offload-optimizer cpu or nvme``, ``--stage``,
    ``--nvme-path``), which a DeepSpeed config has none of."""
    with pytest.raises(ConfigError) as e:
        from_deepspeed({**OK, "zero_optimization": zero}, dp=1)
    assert words in str(e.value) and "\n" not in str(e.value) and "--" not in str(e.value), str(e.value)
