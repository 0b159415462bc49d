"""Communication volume per GPU and step (paper §7), in elements.

DP: 2Ψ_mp (N_d−1)/N_d for stages 0-2 (all-reduce, or reduce-scatter + all-gather), 3Ψ_mp (N_d−1)/N_d for
stage 3. MP (Megatron): per transformer block and micro-batch, all-reduces of b*s*h elements — two in
forward, two in backward and, with recomputation, two more: the paper's 12*b*s*h (an all-reduce moving
twice its size), times (MP−1)/MP in the same accounting zerobench's ledger uses. P_a adds one all-gather
of b*s*h per block. The measured engine reproduces exactly these (tests/distributed/test_zero_r.py).
"""

from __future__ import annotations

from zerobench.plan.memory_model import PlanConfig, params_per_mp_rank


def comm_per_gpu(p: PlanConfig) -> dict[str, float]:
    m = p.model
    psi = params_per_mp_rank(m, p.mp)
    nd, mp = p.dp, p.mp
    dp_factor = 3 if p.stage == 3 else 2
    dp = dp_factor * psi * (nd - 1) / nd if nd > 1 else 0.0
    bsh = p.micro_batch * m.seq * m.hidden
    passes = 6 if p.checkpoint_activations else 4
    frac = (mp - 1) / mp if mp > 1 else 0.0
    mp_vol = m.layers * passes * 2 * bsh * frac
    pa = m.layers * bsh * frac if (p.pa or p.pa_cpu) and p.checkpoint_activations else 0.0
    return {
        "dp_elements": dp,
        "mp_elements": mp_vol,
        "pa_elements": pa,
        "paper_mp_elements": (m.layers * (12 if p.checkpoint_activations else 8) * bsh) if mp > 1 else 0.0,
    }
