"""The rendezvous in one process: a port held by another process is one line on rank 0 at once, and a rank
that reaches that other process instead of rank 0 gives up within the timeout, in one line."""

from __future__ import annotations

import socket
import time

import pytest

from zerobench.distributed import rendezvous
from zerobench.distributed.rendezvous import RendezvousError, connect_store


@pytest.fixture
def silent_listener():
    """Another process's server on a port: it accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def test_rank_0_names_a_port_in_use_in_one_line(silent_listener):
    with pytest.raises(RendezvousError) as e:
        connect_store(0, 2, "127.0.0.1", silent_listener, timeout_s=30)
    msg = str(e.value)
    assert "\n" not in msg and f"127.0.0.1:{silent_listener}" in msg, msg
    assert "EADDRINUSE" in msg and "choose another MASTER_PORT" in msg, msg


def test_a_rank_answered_by_another_process_gives_up_within_the_timeout(silent_listener, monkeypatch):
    monkeypatch.setattr(rendezvous, "GRACE_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as e:
        connect_store(1, 2, "127.0.0.1", silent_listener, timeout_s=1)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"rank 1 could not reach rank 0 at 127.0.0.1:{silent_listener} within 1 s"), msg


def test_rank_0_alone_says_how_many_ranks_joined():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RendezvousError) as e:
        connect_store(0, 3, "127.0.0.1", port, timeout_s=1)
    msg = str(e.value)
    assert "\n" not in msg and "rank 0 waited 1 s" in msg and "of 3 ranks joined" in msg, msg


def _member(rank: int, port: int, launch: str, q) -> None:
    import datetime

    store = connect_store(rank, 2, "127.0.0.1", port, 60, launch)
    try:
        if rank == 0:
            store.set("run_id", launch)
            store.get("done")  # hold the server until this launch's rank 1 has read it
            time.sleep(4)  # and while the other launch's rank waits in vain
            q.put((launch, rank, "served"))
            return
        store.set_timeout(datetime.timedelta(seconds=8 if launch == "a" else 3))
        got = store.get("run_id").decode()
        store.set("done", "1")
        q.put((launch, rank, got))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((launch, rank, type(e).__name__))


def test_a_rank_of_another_launch_on_the_port_never_meets_this_launch_s_ranks():
    """Two steps of one Slurm job started together met on one port, and the second step's rank 1 joined the first's
    run, recorded ok (a helper's review). The store is keyed by the launch (``DistEnv.launch_id``): launch b's rank 1,
    reaching launch a's rank 0 first, waits for its own rank 0 and fails at its timeout; launch a meets as before."""
    import multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(0, port, "a", q))]
    procs[0].start()
    for launch in ("b", "a"):  # the stray first
        time.sleep(1.0)
        procs.append(ctx.Process(target=_member, args=(1, port, launch, q)))
        procs[-1].start()
    got = {(launch, rank): what for launch, rank, what in (q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(30)
    assert got[("a", 1)] == "a" and got[("a", 0)] == "served", got
    assert got[("b", 1)] not in ("a", "b"), got  # a timeout of its own, never launch a's value
