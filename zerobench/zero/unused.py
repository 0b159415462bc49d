"""Parameters unused in forward: refused on every rank at once, or, when allowed, a zero gradient.

The bucket group always keeps the ranks' collectives matched (a bucket missing gradients is filled with
zeros and started in order), so a model whose unused parameters differ by rank cannot desynchronise the
group. What remains is the decision: with ``find_unused_parameters=False`` (the default, as DDP's) the
ranks agree on whether any of them saw an unused parameter, with one all-reduce of one integer per rank
at ``step()``, and all of them raise the same error. With ``True`` nothing is checked and the ranks
that skipped a parameter contribute zeros to its gradient, which is single-process training's gradient
on the global batch. A parameter unused on *every* rank then still takes an optimizer step with a zero
gradient (its moments decay; weight decay applies), where ``torch.optim`` would skip it.
"""

from __future__ import annotations

import torch

from zerobench.distributed import collectives as C


class UnusedParametersError(RuntimeError):
    """Some rank's forward left trained parameters without a gradient."""


def check_unused(engine) -> None:
    """Raise ``UnusedParametersError`` on every DP rank if any rank's last window left a parameter unused."""
    if engine.config.find_unused_parameters:
        return
    unused = engine.grads.unused
    group = engine.group
    if group.size == 1:
        counts = [len(unused)]
    else:
        t = torch.zeros(group.size, dtype=torch.int64, device=engine.device)
        t[group.rank] = len(unused)
        C.all_reduce(t, group, engine.ledger, "unused_check")
        counts = t.tolist()
    ranks = [r for r, n in enumerate(counts) if n]
    if not ranks:
        return
    names = [engine.zparams[i].name for i in unused]
    here = f"here (rank {group.rank}): {names[:4]}{' ...' if len(names) > 4 else ''}; " if names else ""
    raise UnusedParametersError(
        f"{sum(counts)} trained parameter(s) got no gradient on rank(s) {ranks}: unused in forward; {here}"
        "pass ZeroConfig(find_unused_parameters=True) (--find-unused-parameters) to treat their gradient as "
        "zero where they are skipped, or freeze them (requires_grad=False)"
    )
