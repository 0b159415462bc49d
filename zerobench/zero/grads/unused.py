"""Parameters unused in forward: refused on every rank at once, or, when allowed, a zero gradient.

The bucket group always keeps the ranks' collectives matched (a bucket missing gradients is filled with
zeros and started in order), so a model whose unused parameters differ by rank cannot desynchronise the
group. What remains is the decision: with ``find_unused_parameters=False`` (the default, as DDP's) the
ranks agree on whether any of them saw an unused parameter, from one flag per rank summed over the group,
and all of them raise the same error at ``step()``. At stage 0 the flags ride in the last gradient bucket's
all-reduce (one element per rank after the flat gradient buffer: by the time the last bucket starts, every
bucket before it has, so the rank knows), which costs no collective of its own; at stages 1-3, whose
gradient collectives are reduce-scatters, they are one all-reduce of one integer per rank, started at the
end of backward behind the last gradient buckets (``start_unused_check``), so it completes with them
instead of costing ``step()`` a round trip of its own. With ``True`` nothing is checked and the ranks
that skipped a parameter contribute zeros to its gradient, which is single-process training's gradient
on the global batch. A parameter unused on *every* rank then still takes an optimizer step with a zero
gradient (its moments decay; weight decay applies), where ``torch.optim`` would skip it.
"""

from __future__ import annotations

import torch

from zerobench.distributed import collectives as C
from zerobench.zero.protocols import Engine


class UnusedParametersError(RuntimeError, AssertionError):
    """Some rank's forward left trained parameters without a gradient. An ``AssertionError`` too, as DeepSpeed's ZeRO
    optimizers assert it (``test_ignore_unused_parameters.py`` expects that type)."""


def check_unfrozen(frozen: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Refuse, in one line, parameters frozen when the engine was built and unfrozen since (``requires_grad_(True)``):
    autograd would give them a ``.grad`` that no rank synchronises and no optimizer step applies, so they would
    silently never be trained."""
    thawed = [n for n, p in frozen if p.requires_grad]
    if thawed:
        raise RuntimeError(
            f"parameter(s) {thawed[:4]}{' ...' if len(thawed) > 4 else ''} were unfrozen (requires_grad=True) after "
            "apply_zero: the engine trains the parameters that required a gradient when it was built; unfreeze "
            "them before apply_zero (or build a new engine)"
        )


def check_added(engine: Engine) -> None:
    """Refuse, in one line, trainable parameters the model gained after ``apply_zero`` (a module assigned or
    replaced: ``model.head = nn.Linear(...)``, ``resize_token_embeddings``): the engine trains the parameters it was
    built with, so these would silently never be stepped. And refuse parameters the engine trains that the model no
    longer holds: one replaced by a parameter the engine already knows (weights tied after ``apply_zero``,
    ``model[1].weight = model[0].weight``), which the engine would go on stepping, unused, beside the model's own.
    One walk of the model's parameters per step."""
    known, held, added = engine._known_param_ids, set(), []
    for n, p in engine.module.named_parameters():
        held.add(id(p))
        if p.requires_grad and id(p) not in known:
            added.append(n)
    if added:
        raise RuntimeError(
            f"parameter(s) {added[:4]}{' ...' if len(added) > 4 else ''} were added to the model after apply_zero "
            "(a module assigned or replaced): the engine trains the parameters it was built with and would never "
            "step these; give the model its final modules before apply_zero (or build a new engine)"
        )
    dropped = [zp.name for zp in engine.zparams if id(zp.param) not in held]
    if dropped:
        raise RuntimeError(
            f"parameter(s) {dropped[:4]}{' ...' if len(dropped) > 4 else ''} are no longer the model's: replaced "
            "after apply_zero by another parameter of the model (weights tied after it?), so the engine would go on "
            "stepping them unused; tie or replace parameters before apply_zero (or build a new engine)"
        )


class UnusedCheck:
    """Whether each rank left a parameter unused in a window (1 or 0 per rank), being summed over the DP group."""

    def __init__(self, engine: Engine, unused: list[int]):
        """Stage 0: the flags rode in the last gradient bucket's all-reduce (``GradBucketGroup.unused_flags``; the
        bucket group has waited for it). Else starts their own all-reduce (asynchronous; collectives of one group
        run in launch order)."""
        group, riding = engine.group, engine.grads.unused_flags
        self.unused, self.work = unused, None
        if riding is not None:
            self.flags = riding
            return
        self.flags = torch.zeros(group.size, dtype=torch.int64, device=engine.device)
        self.flags[group.rank] = int(bool(unused))
        self.work = C.all_reduce(self.flags, group, engine.ledger, "unused_check", async_op=True)

    def wait(self) -> list[int]:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return [round(f) for f in self.flags.tolist()]


def start_unused_check(engine: Engine, unused: list[int]) -> UnusedCheck | None:
    """At the end of a synchronised window's backward, once every bucket is started: the check's
    collective (None with ``find_unused_parameters=True``: nothing is checked)."""
    return None if engine.config.find_unused_parameters else UnusedCheck(engine, unused)


def check_unused(engine: Engine, pending: UnusedCheck | None) -> None:
    """Raise ``UnusedParametersError`` on every DP rank if any rank's last window left a parameter unused; and
    refuse parameters unfrozen, frozen or added after ``apply_zero`` (``check_unfrozen``, ``check_added``)."""
    check_unfrozen(engine.frozen)
    check_added(engine)
    # Frozen since apply_zero: refused whether unused parameters are allowed or not. Allowed, they would go on
    # being stepped with a zero gradient (momentum, weight decay), where torch.optim skips a parameter without one.
    frozen = [zp.name for zp in engine.zparams if not zp.param.requires_grad]
    if frozen:
        if pending is not None:
            pending.wait()  # its collective completes on every rank before any raises
        raise UnusedParametersError(
            f"parameter(s) {frozen[:4]}{' ...' if len(frozen) > 4 else ''} were frozen (requires_grad=False) after "
            "apply_zero: the engine's partition is fixed when it is built, and it would go on stepping them; "
            "freeze them before apply_zero (or build a new engine)"
        )
    if pending is None:
        return
    flags, unused, group = pending.wait(), pending.unused, engine.group
    ranks = [r for r, n in enumerate(flags) if n]
    if not ranks:
        return
    names = [engine.zparams[i].name for i in unused]
    here = f"here (rank {group.rank}, {len(names)}): {names[:4]}{' ...' if len(names) > 4 else ''}; " if names else ""
    raise UnusedParametersError(
        f"trained parameter(s) got no gradient on rank(s) {ranks}: unused in forward; {here}"
        f"{engine.unused_hint} to treat their gradient as zero where they are skipped, or freeze them "
        "(requires_grad=False)"
    )
