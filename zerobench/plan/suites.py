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
    """(row, PlanConfig) for every run of a paper suite that has a layer count.

    Each row is read as the ``RunSpec`` a sweep would run (same keys, same defaults, renamed keys refused);
    the planner adds the cluster (``gpus_per_node``, ``gpu_mem``) and pads the vocabulary as Megatron-LM
    does (to a multiple of 128 x TP). ``bucket_size: null`` is no C_B (buffers as large as the model)."""
    from zerobench.bench.spec import FIELDS, RunSpec
    from zerobench.bench.suite import check_keys

    base, cluster = suite.get("base", {}), suite.get("cluster", {})
    out = []
    for i, run in enumerate(suite["runs"]):
        r = {**base, **run}
        check_keys(f"runs[{i}]", r)
        if "layers" not in r:
            continue
        spec = RunSpec(**{k: v for k, v in r.items() if k in FIELDS})
        tp = spec.tp or 1
        model = GPTConfig(layers=spec.layers, hidden=spec.hidden, heads=spec.heads,
                          vocab=padded_vocab(spec.vocab, tp), seq=spec.seq)
        out.append((r, PlanConfig(
            model=model, gpus=int(spec.gpus), gpus_per_node=int(cluster.get("gpus_per_node", 16)), mp=tp,
            gpu_mem_bytes=parse_bytes(cluster.get("gpu_mem", "32GB")), micro_batch=spec.micro_batch,
            stage=spec.stage, checkpoint_activations=spec.checkpoint_activations or spec.pa or spec.pa_cpu,
            pa=spec.pa, pa_cpu=spec.pa_cpu, cb_elements=spec.bucket_size, md=spec.md,
        )))
    return out
