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
