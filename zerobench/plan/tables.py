"""The paper's Table 1 and Table 2, computed from the memory model, and the max-model-size search."""

from __future__ import annotations

import dataclasses

from zerobench.metrics.analytic import paper_model_state_bytes
from zerobench.plan.memory_model import PlanConfig, memory_per_gpu, params_per_mp_rank

TABLE1_PSI = {"7.5B": 7.5e9, "128B": 128e9, "1T": 1e12}
TABLE1_ND = (1, 4, 16, 64, 256, 1024)
TABLE2_MP = (1, 2, 4, 8, 16)
TABLE2_GPUS = (64, 128, 256, 512, 1024)


def table1() -> list[dict]:
    """Per-device model-state memory in GB (1e9 bytes) for each Ψ, N_d and ZeRO-DP stage."""
    rows = []
    for nd in TABLE1_ND:
        row = {"dp": nd}
        for name, psi in TABLE1_PSI.items():
            for stage, label in ((1, "P_os"), (2, "P_os+g"), (3, "P_os+g+p")):
                row[f"{name} {label}"] = paper_model_state_bytes(psi, nd, stage) / 1e9
        rows.append(row)
    return rows


def table2(gpu_mem_bytes: float = 32e9) -> list[dict]:
    """Theoretical maximum model size (parameters) whose model states fit, for MP and GPU counts."""
    rows = []
    for mp, gpus in zip(TABLE2_MP, TABLE2_GPUS):
        nd = gpus // mp
        # model-state bytes per GPU are linear in Ψ: solve c * Ψ/mp = memory
        per_param = {s: paper_model_state_bytes(1.0, nd, s) for s in range(4)}
        rows.append(
            {
                "mp": mp,
                "gpus": gpus,
                **{
                    label: gpu_mem_bytes / per_param[s] * mp
                    for s, label in ((0, "baseline"), (1, "P_os"), (2, "P_os+g"), (3, "P_os+g+p"))
                },
            }
        )
    return rows


def max_layers(p: PlanConfig, limit: int = 100_000) -> int:
    """The largest layer count that fits (0 if none): memory is monotone in layers, so bisect."""

    def fits(layers: int) -> bool:
        return bool(memory_per_gpu(dataclasses.replace(p, model=dataclasses.replace(p.model, layers=layers)))["fits"])

    from zerobench.bench.search import largest_fitting

    return largest_fitting(fits, limit)


def max_size(p: PlanConfig, limit: int = 100_000) -> dict:
    """The largest model that fits, by layers; ``at_least``: the search's ``limit`` itself fits (the answer is a
    lower bound, as ``zerobench maxsize`` says of its own)."""
    layers = max_layers(p, limit)
    model = dataclasses.replace(p.model, layers=max(layers, 1))
    from zerobench.models.sizes import num_params

    return {
        "max_layers": layers,
        "max_params": num_params(model) if layers else 0,
        "params_per_mp_rank": params_per_mp_rank(model, p.mp) if layers else 0,
        "at_least": layers == limit,
    }
