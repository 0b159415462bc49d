"""The rendezvous: every rank meets rank 0's key-value store at ``MASTER_ADDR:MASTER_PORT`` before the process
group exists, bounded by the collective timeout and explained in one line when it fails.

Rank 0 listens on the port (torchrun's agent listens instead when it sets ``TORCHELASTIC_USE_AGENT_STORE``);
the others connect to it. Two failures are worth naming, because torch neither names them nor bounds one of
them:

- the port is held by another process: rank 0 cannot listen (EADDRINUSE, a traceback from torch);
- a rank that connects to that other process instead of rank 0 waits for an answer that never comes, past
  any timeout (the store's client gives up on connecting, not on a silent peer).

So the store is made on a helper thread (torch releases the GIL while it waits) with the collective timeout,
and the rank waits for it a little longer (``GRACE_S``: torch's own timeout, where it has one, ends the wait
with its reason, and leaves no store thread behind); then ``RendezvousError`` says which address, for how long,
and what to change. The thread left waiting on a silent peer is a daemon: it ends with the process.
"""

from __future__ import annotations

import datetime
import re
import threading
from typing import TYPE_CHECKING

from zerobench.config import RunFailed

if TYPE_CHECKING:
    import torch.distributed as dist


GRACE_S = 5.0
"""How much longer than the timeout a rank waits for torch's own rendezvous to give up."""

_STORES: dict[tuple, object] = {}
"""The store each (rank, world, address, port) met, kept for the process group: ``agree_value`` meets the ranks
before ``init_process_group`` does, on the same store (a second store on the port would find it taken); or the
``RendezvousError`` that meeting raised, raised again at once rather than waited out a second time."""


class RendezvousError(RunFailed):
    """The ranks could not meet: one line naming the address, the timeout and the fix."""


def connect_store(rank: int, world_size: int, addr: str, port: int, timeout_s: float, launch: str = "") -> dist.Store:
    """This rank's handle on the job's store at ``addr:port`` (rank 0 hosts it), within ``timeout_s``, or a
    ``RendezvousError``. The store is prefixed as ``init_process_group`` prefixes the one it makes itself, so
    a store shared with torchrun's agent keeps the process group's keys apart, and by ``launch`` (``DistEnv``'s
    ``launch_id``), so that a rank of another launch that reached this port never joins this one's group."""
    import torch.distributed as dist

    key = (rank, world_size, addr, port)
    try:
        return dist.PrefixStore(f"default_pg/{launch}" if launch else "default_pg", _met(key, timeout_s))
    finally:
        _STORES.pop(key, None)  # the process group takes the store over; a later call meets afresh


def agree_value(
    rank: int, world_size: int, addr: str, port: int, timeout_s: float, name: str, value: str, launch: str = ""
) -> str:
    """Rank 0's ``value`` of ``name`` on every rank (each rank's own clock named runs apart by a second under
    torchrun), through the job's store, which the process group then uses; a ``RendezvousError`` as
    ``connect_store``'s."""
    import torch.distributed as dist

    store = dist.PrefixStore(
        f"zerobench/{launch}" if launch else "zerobench", _met((rank, world_size, addr, port), timeout_s)
    )
    if rank == 0:
        store.set(name, value)
        return value
    return store.get(name).decode()


def _met(key: tuple, timeout_s: float):
    """The store ``key`` (rank, world, address, port) met, meeting it now if no call has; a failed meeting is kept
    too, and raised again."""
    if key not in _STORES:
        try:
            _STORES[key] = _meet(*key, timeout_s)
        except RendezvousError as e:
            _STORES[key] = e
            raise
    if isinstance(_STORES[key], RendezvousError):
        raise _STORES[key]
    return _STORES[key]


def _meet(rank: int, world_size: int, addr: str, port: int, timeout_s: float):
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    made: dict[str, object] = {}

    def make() -> None:
        try:
            made["store"], _, _ = next(dist.rendezvous(f"tcp://{addr}:{port}", rank, world_size, timeout=timeout))
        except Exception as e:  # noqa: BLE001 - whatever torch raised is handed to the waiting thread to explain
            made["error"] = e

    helper = threading.Thread(target=make, name="zerobench-rendezvous", daemon=True)
    helper.start()
    helper.join(timeout_s + GRACE_S)
    if "store" in made:
        store = made["store"]
        store.set_timeout(timeout)
        return store
    error = made.get("error")
    raise RendezvousError(explain(rank, world_size, addr, port, timeout_s, error)) from None


def explain(rank: int, world_size: int, addr: str, port: int, timeout_s: float, error: BaseException | None) -> str:
    """One line for a failed rendezvous: ``error`` is what torch raised, None when the wait outlasted
    the timeout with no answer at all (a silent peer on the port)."""
    where = f"{addr}:{port}"
    first = _first_line(error) if error is not None else None
    text = (first or "").lower()
    if rank == 0 and ("eaddrinuse" in text or "address already in use" in text):
        return (
            f"rank 0 cannot listen on {where} (MASTER_ADDR:MASTER_PORT): another process holds port {port} "
            "(EADDRINUSE); choose another MASTER_PORT, the same on every rank"
        )
    if rank == 0 and (error is None or "clients" in text):  # the store waits for every rank to connect
        joined = re.search(r"(\d+)/(\d+) clients joined", text)
        who = f"only {joined[1]} of {joined[2]} ranks" if joined else f"not every rank of {world_size}"
        return (
            f"rank 0 waited {timeout_s:g} s at {where} and {who} joined: start every rank with the same "
            "MASTER_ADDR and MASTER_PORT, or raise --collective-timeout"
        )
    if rank == 0:
        return f"rank 0 could not open the rendezvous at {where}: {first}"
    why = f" ({first})" if first else ""
    return (
        f"rank {rank} could not reach rank 0 at {where} within {timeout_s:g} s{why}: rank 0 is not running, "
        "failed, or another process holds that port; check rank 0's output, MASTER_ADDR and MASTER_PORT "
        "(choose another MASTER_PORT if it is taken)"
    )


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(e).__name__
