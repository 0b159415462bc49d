"""The referee of a lockstep A/B round: grants training-step turns to the two sides alternately.

Both sides' sweeps run at the same time on the same CPUs; rank 0 of each side's current run asks for a
turn before every step (``zerobench.train.turnstile``). The referee lets exactly one side step at a time
and alternates: baseline step k, candidate step k, baseline step k+1, ... (or candidate first). Each side's
step time is measured inside its turn, so the sides never compete for a CPU, and machine noise that lasts
longer than a step (a neighbour's burst on a shared VM, a clock change) lands on both sides' steps alike.

The side whose turn it is may be between steps (starting its next run, writing rows); the other waits.
Once a side's sweep has exited, the other side steps freely, so a failed or shorter side never hangs the
round. One thread, one ``selectors`` loop, started by ``start``; ``close`` stops it.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing.Self is Python 3.11+; the project supports 3.10
    from typing_extensions import Self


class Referee:
    """Alternates turns between two named sides over a Unix socket (``path``)."""

    def __init__(self, sides: tuple[str, str], first: str):
        if first not in sides:
            raise ValueError(f"first side {first!r} is not one of {sides}")
        self.sides, self.turn = sides, first
        self._dir = tempfile.mkdtemp(prefix="zerobench-lockstep-")
        self.path = os.path.join(self._dir, "turns.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._conns: dict[str, socket.socket] = {}
        self._ready: dict[str, bool] = dict.fromkeys(sides, False)
        self._finished: dict[str, Callable[[], bool]] = {s: (lambda: False) for s in sides}
        self._holder: str | None = None
        self._stop = threading.Event()
        self.grants: dict[str, int] = dict.fromkeys(sides, 0)
        """Turns granted per side (the round's check that both sides really took turns)."""
        self._thread = threading.Thread(target=self._loop, name="zerobench-lockstep", daemon=True)

    def start(self) -> None:
        """Start granting turns. The socket listens from construction on, so the sides can be started
        first (clients that connect early wait for their first turn) and no thread runs while they fork."""
        self._thread.start()

    def env(self, side: str) -> dict[str, str]:
        """The environment that makes ``side``'s runs take turns here."""
        return {"ZEROBENCH_TURNSTILE": f"{self.path}:{side}"}

    def watch(self, side: str, proc: subprocess.Popen) -> None:
        """``side`` is finished (the other may step freely) once ``proc`` has exited."""
        self._finished[side] = lambda: proc.poll() is not None

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for c in list(self._conns.values()):
            c.close()
        self._sel.close()
        self._listener.close()
        try:
            os.unlink(self.path)
            os.rmdir(self._dir)
        except OSError:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the loop -------------------------------------------------------------------------------
    def _other(self, side: str) -> str:
        return self.sides[1] if side == self.sides[0] else self.sides[0]

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.05):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._receive(key.fileobj, key.data)
            self._grant()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        self._sel.register(conn, selectors.EVENT_READ, {"side": None, "buf": b""})

    def _receive(self, conn: socket.socket, data: dict) -> None:
        try:
            got = conn.recv(256)
        except OSError:
            got = b""
        if not got:  # the run's rank 0 exited (normally after its last step, or crashed)
            self._drop(conn, data["side"])
            return
        if data["side"] is None:
            data["buf"] += got
            if b"\n" not in data["buf"]:
                return
            name, _, got = data["buf"].partition(b"\n")
            side = name.decode(errors="replace")
            if side not in self.sides:
                self._drop(conn, None)
                return
            data["side"] = side
            if side in self._conns and self._conns[side] is not conn:
                self._drop(self._conns[side], side)
            self._conns[side] = conn
        side = data["side"]
        for b in got:
            if b == ord("r"):
                self._ready[side] = True
            elif b == ord("d") and self._holder == side:
                self._holder, self.turn = None, self._other(side)

    def _drop(self, conn: socket.socket, side: str | None) -> None:
        self._sel.unregister(conn)
        conn.close()
        if side is not None and self._conns.get(side) is conn:
            del self._conns[side]
            self._ready[side] = False
            if self._holder == side:  # died inside its turn: the other side goes next
                self._holder, self.turn = None, self._other(side)

    def _grant(self) -> None:
        if self._holder is not None:
            return
        for side in (self.turn, self._other(self.turn)):
            if self._ready[side] and (side == self.turn or self._finished[self.turn]()):
                self._ready[side], self._holder = False, side
                self.grants[side] += 1  # before the send: the side may finish before this thread runs again
                try:
                    self._conns[side].sendall(b"g")
                except OSError:
                    self.grants[side] -= 1
                    self._drop(self._conns[side], side)
                return
