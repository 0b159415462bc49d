"""Read the paper's suite files (``suites/paper/*.yaml``) into plan configurations."""

from __future__ import annotations

import yaml

from zerobench.config import ConfigError, parse_bytes
from zerobench.models.gpt import GPTConfig
from zerobench.models.sizes import padded_vocab
from zerobench.plan.memory_model import PlanConfig


def load_suite(name: str) -> dict:
    """The raw YAML of a suite (the planner reads the paper's cluster-scale rows without resolving runs)."""
    from zerobench.bench.suite import find_suite

    path = find_suite(name)
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def plan_configs(suite: dict) -> list[tuple[dict, PlanConfig]]:
    """(row, PlanConfig) for every run of a paper suite that has a layer count."""
    base, cluster = suite.get("base", {}), suite.get("cluster", {})
    out = []
    for run in suite["runs"]:
        r = {**base, **run}
        if "layers" not in r:
            continue
        mp = int(r["tp"])
        model = GPTConfig(layers=r["layers"], hidden=r["hidden"], heads=r["heads"],
                          vocab=padded_vocab(r["vocab"], mp), seq=r["seq"])
        cb = r.get("bucket_size")  # null: no C_B (buffers as large as the model)
        out.append((r, PlanConfig(
            model=model, gpus=int(r["gpus"]), gpus_per_node=int(cluster.get("gpus_per_node", 16)), mp=mp,
            gpu_mem_bytes=parse_bytes(cluster.get("gpu_mem", "32GB")), micro_batch=int(r["micro_batch"]),
            stage=int(r.get("stage", 2)), checkpoint_activations=bool(r.get("checkpoint_activations", True)),
            pa=bool(r.get("pa", False)), pa_cpu=bool(r.get("pa_cpu", False)),
            cb_elements=int(cb) if cb else None, md=bool(r.get("md", False)),
        )))
    return out
