"""From a run to a plan: suite rows (``suites/paper/*.yaml``) and ``zerobench plan``'s flags both become the
``RunSpec`` a sweep would run, resolved by the one resolver (``bench.spec.to_train_config``: same keys,
defaults, rules and one-line errors), then placed on a cluster (``plan_config``)."""

from __future__ import annotations

from zerobench.config import ConfigError, from_dict, parse_bytes
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
    z, act, gpus = cfg.zero, cfg.activation, cfg.dp * cfg.tp
    if gpus_per_node < 1 or (gpus > gpus_per_node and gpus % gpus_per_node):  # before, planned as given
        raise ConfigError(
            f"gpus {gpus} is not a whole number of nodes of gpus_per_node {gpus_per_node}: give a multiple of "
            f"{gpus_per_node} GPUs (or up to {gpus_per_node}, part of one node), or the nodes' real GPU count"
            if gpus_per_node >= 1
            else f"gpus_per_node must be a positive integer, got {gpus_per_node}"
        )
    return PlanConfig(
        model=cfg.model,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        mp=cfg.tp,
        gpu_mem_bytes=gpu_mem_bytes,
        micro_batch=cfg.micro_batch,
        stage=z.stage,
        checkpoint_activations=act.checkpoint,
        pa=act.partition and not act.cpu_offload,
        pa_cpu=act.cpu_offload,
        cb_elements=spec.bucket_size,
        md=act.contiguous,
        optim_bits=z.optim_bits,
        offload_optimizer=z.offload_optimizer != "none",
        offload_param=z.offload_param != "none",
        precision=z.precision.value,
    )


def plan_configs(suite: dict, where: str = "suite") -> list[tuple[dict, PlanConfig]]:
    """(row, PlanConfig) for every run of a paper suite that has a layer count: each row read as the
    ``RunSpec`` a sweep would run (renamed keys refused, values type-checked) and placed on the suite's
    ``cluster``. A suite of another shape is one ``ConfigError`` line that starts with ``where`` (its file)."""
    from zerobench.bench.spec import RunSpec
    from zerobench.bench.suite import check_keys

    if not isinstance(suite, dict) or not isinstance(suite.get("runs"), list):
        raise ConfigError(
            f"{where}: a suite to plan is a mapping with a 'runs' list (and optional 'base' and "
            "'cluster' mappings), as suites/paper/fig2.yaml"
        )
    base, cluster = suite.get("base") or {}, suite.get("cluster") or {}
    if not isinstance(base, dict) or not isinstance(cluster, dict):
        raise ConfigError(f"{where}: a suite's 'base' and 'cluster' must be mappings")
    try:
        per_node = int(cluster.get("gpus_per_node", 16))
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}: cluster: gpus_per_node must be an integer, got {cluster['gpus_per_node']!r}"
        ) from None
    try:
        mem = parse_bytes(cluster.get("gpu_mem", "32GB"))
    except ConfigError as e:
        raise ConfigError(f"{where}: cluster: gpu_mem: {e}") from None
    out = []
    for i, run in enumerate(suite["runs"]):
        if not isinstance(run, dict):
            raise ConfigError(f"{where}: runs[{i}] must be a mapping of run keys, got {run!r}")
        r = {"label": f"runs[{i}]", **base, **run}  # the plan's tables name every run
        check_keys(f"{where}: runs[{i}]", r)
        if "layers" not in r:
            continue
        spec = from_dict(RunSpec, r, where=f"{where}: runs[{i}]")
        try:
            out.append((r, plan_config(spec, per_node, mem)))
        except ConfigError as e:
            raise ConfigError(f"{where}: runs[{i}] ({r['label']}): {e}") from None
    return out
