"""From a run to a plan: suite rows (``suites/paper/*.yaml``) and ``zerobench plan``'s flags both become the
``RunSpec`` a sweep would run, resolved by the one resolver (``bench.spec.to_train_config``: same keys,
defaults, rules and one-line errors), then placed on a cluster (``plan_config``)."""

from __future__ import annotations

from zerobench.config import ConfigError, parse_bytes
from zerobench.plan.memory_model import PlanConfig


def load_suite(name: str) -> dict:
    """The raw YAML of a suite (the planner reads the paper's cluster-scale rows without resolving runs)."""
    from zerobench.bench.suite import find_suite
    from zerobench.bench.suite_yaml import load_yaml

    return load_yaml(find_suite(name))  # duplicate keys, deep nesting and out-of-range numbers refused as a sweep does


def plan_config(spec, gpus_per_node: int, gpu_mem_bytes: float) -> PlanConfig:
    """The plan of the run ``spec`` (a ``bench.spec.RunSpec``) on GPUs of ``gpu_mem_bytes``, resolved as a
    sweep resolves it (P_a implies checkpointing, the vocabulary padded to 128 x TP where TP does not
    divide it, ``bucket_size: None`` = no C_B); raises ``ConfigError`` as the sweep would."""
    from zerobench.bench.spec import to_train_config

    cfg = to_train_config(spec, check_system=False)
    z, act = cfg.zero, cfg.activation
    return PlanConfig(
        model=cfg.model, gpus=cfg.dp * cfg.tp, gpus_per_node=gpus_per_node, mp=cfg.tp, gpu_mem_bytes=gpu_mem_bytes,
        micro_batch=cfg.micro_batch, stage=z.stage, checkpoint_activations=act.checkpoint,
        pa=act.partition and not act.cpu_offload, pa_cpu=act.cpu_offload, cb_elements=spec.bucket_size,
        md=act.contiguous, optim_bits=z.optim_bits, offload_optimizer=z.offload_optimizer != "none",
        offload_param=z.offload_param != "none",
    )


def plan_configs(suite: dict) -> list[tuple[dict, PlanConfig]]:
    """(row, PlanConfig) for every run of a paper suite that has a layer count: each row read as the
    ``RunSpec`` a sweep would run (renamed keys refused) and placed on the suite's ``cluster``."""
    from zerobench.bench.spec import FIELDS, RunSpec
    from zerobench.bench.suite import check_keys

    base, cluster = suite.get("base", {}), suite.get("cluster", {})
    per_node, mem = int(cluster.get("gpus_per_node", 16)), parse_bytes(cluster.get("gpu_mem", "32GB"))
    out = []
    for i, run in enumerate(suite["runs"]):
        r = {**base, **run}
        check_keys(f"runs[{i}]", r)
        if "layers" not in r:
            continue
        spec = RunSpec(**{k: v for k, v in r.items() if k in FIELDS})
        try:
            out.append((r, plan_config(spec, per_node, mem)))
        except ConfigError as e:
            raise ConfigError(f"runs[{i}] ({r.get('label', 'unlabelled')}): {e}") from None
    return out
