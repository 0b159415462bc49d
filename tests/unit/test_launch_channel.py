"""The local launcher's hold on its ranks, without training: a port no other process is given."""

from __future__ import annotations

import errno
import socket

import pytest

from zerobench.launch.local import reserved_port


def test_a_reserved_port_is_refused_to_other_binds_and_open_to_a_reusing_listener():
    with reserved_port() as port:
        other = socket.socket()
        with pytest.raises(OSError) as e:
            other.bind(("127.0.0.1", port))
        assert e.value.errno == errno.EADDRINUSE
        other.close()
        store = socket.socket()  # as rank 0's store binds: SO_REUSEADDR, then listen
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", port))
        store.listen(1)
        store.close()
