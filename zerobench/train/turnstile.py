"""Lockstep turns for interleaved A/B timing (the client side; the referee is ``zerobench.bench.lockstep``).

With ``ZEROBENCH_TURNSTILE=SOCKET:SIDE`` in the launcher's environment (read by ``launch/worker.py``), rank 0 of a run connects to the A/B
controller's Unix socket and, around every training step, asks for a turn and hands it back: the
baseline's and the candidate's steps then alternate one by one on the same CPUs, so a burst of machine
noise lasting longer than a step lands on both sides instead of on one. The other ranks of the run wait
at a barrier until rank 0 has its turn. Unset, nothing happens.

Protocol (bytes on one stream connection): ``SIDE\\n`` once, then per step ``r`` (ready) -> ``g`` (go,
from the referee) -> ``d`` (done). A turn not granted within the timeout is an error, never a hang.
"""

from __future__ import annotations

import socket

ENV = "ZEROBENCH_TURNSTILE"
TIMEOUT_ENV = "ZEROBENCH_TURNSTILE_TIMEOUT"


class TurnstileError(RuntimeError):
    """The A/B referee went away or did not grant a turn in time."""


class Turnstile:
    """Rank 0's connection to the referee."""

    def __init__(self, path: str, side: str, timeout_s: float):
        self.path, self.timeout_s = path, timeout_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
            self._sock.sendall(side.encode() + b"\n")
        except OSError as e:
            self._sock.close()
            raise TurnstileError(f"cannot reach the A/B referee at {path}: {e}") from None

    def acquire(self) -> None:
        """Block until it is this side's turn."""
        try:
            self._sock.sendall(b"r")
            got = self._sock.recv(1)
        except TimeoutError:
            raise TurnstileError(
                f"no lockstep turn from the A/B referee at {self.path} within "
                f"{self.timeout_s:.0f}s (is the other side stuck?)"
            ) from None
        except OSError as e:
            raise TurnstileError(f"lost the A/B referee at {self.path}: {e}") from None
        if got != b"g":
            raise TurnstileError(f"the A/B referee at {self.path} closed the connection")

    def release(self) -> None:
        """Hand the turn to the other side."""
        try:
            self._sock.sendall(b"d")
        except OSError as e:
            raise TurnstileError(f"lost the A/B referee at {self.path}: {e}") from None

    def close(self) -> None:
        self._sock.close()


def from_spec(spec: str | None, timeout_s: float = 600.0) -> Turnstile | None:
    """Rank 0's turnstile for ``spec`` = ``SOCKET_PATH:SIDE`` (the ``ZEROBENCH_TURNSTILE`` value), else None."""
    if not spec:
        return None
    path, sep, side = spec.rpartition(":")
    if not sep or not path or not side:
        raise TurnstileError(f"{ENV}={spec!r}: expected SOCKET_PATH:SIDE")
    return Turnstile(path, side, timeout_s)
