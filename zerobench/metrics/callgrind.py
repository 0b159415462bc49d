"""Instruction counts of a process's own work under valgrind's callgrind, as CodSpeed and iai-callgrind count them.

A count of executed instructions does not depend on the machine's load: a neighbour that takes the CPU, the
caches or the memory bandwidth changes how long the work takes, not how many instructions it is. Between
unchanged runs of the same code it moves by hash-seed and address effects only (well under 1%), so a change of a
few per cent in host work is visible on a shared, noisy machine where CPU time moves by tens of per cent.

How: the launcher starts a rank as ``valgrind --tool=callgrind --instr-atstart=no ... python ...``
(``valgrind_command``): the process runs without instrumentation (importing torch takes ~25 s instead of ~3 s)
until it asks callgrind, by a client request, to start counting. Client requests are machine-code sequences
that valgrind recognises and a native run executes as no-ops; Python cannot emit them, so ``Marks`` loads a
five-function C library compiled from callgrind.h on first use (``cc``; cached beside the C++ kernels,
``kernels/cpu.py``).
``Marks.dump(label)`` writes the counts since the last dump to a file named after the process and zeroes them;
``read_counts`` reads those files back as {label: instructions}.

Needs valgrind (its headers: callgrind.h) and a C compiler; ``check`` says in one line what is missing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels.cpu import cache_dir

SOURCE = r"""
#include <valgrind/callgrind.h>
void zb_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void zb_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void zb_zero(void) { CALLGRIND_ZERO_STATS; }
void zb_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int zb_running(void) { return RUNNING_ON_VALGRIND; }
"""
HEADER = "valgrind/callgrind.h"
INCLUDE_DIRS = ("/usr/include", "/usr/local/include")
OUT_PREFIX = "callgrind.out"
ENV = "ZEROBENCH_CALLGRIND"
"""Set by the local launcher for a rank it starts under callgrind: the directory the dumps go to."""


class CallgrindUnavailable(RuntimeError):
    """valgrind, its headers or a C compiler is missing (the message says which and how to install it)."""


def _header() -> Path | None:
    return next((Path(d) / HEADER for d in INCLUDE_DIRS if (Path(d) / HEADER).exists()), None)


def check() -> str:
    """The ``valgrind`` executable; raises ``CallgrindUnavailable`` naming what is missing."""
    valgrind = shutil.which("valgrind")
    missing = [
        what
        for what, ok in (
            ("valgrind", valgrind),
            (f"{HEADER} (valgrind's headers)", _header()),
            ("a C compiler (cc)", shutil.which("cc")),
        )
        if not ok
    ]
    if missing:
        raise CallgrindUnavailable(
            f"counting instructions needs {', '.join(missing)}: install the Debian packages "
            f"valgrind and gcc (bash tests/setup-tools.sh does, as root)"
        )
    return valgrind


def library() -> Path:
    """The compiled marks library (built once per source version, atomically: concurrent ranks may race)."""
    check()
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    lib = cache_dir() / f"callgrind-marks-{digest}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        src, tmp_lib = Path(tmp) / "marks.c", Path(tmp) / "marks.so"
        src.write_text(SOURCE)
        r = subprocess.run(
            ["cc", "-O1", "-shared", "-fPIC", "-o", str(tmp_lib), str(src)], capture_output=True, text=True, check=False
        )
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["cc failed"])[-1]
            raise CallgrindUnavailable(f"cannot compile the callgrind marks library: {last}")
        os.replace(tmp_lib, lib)
    return lib


class Marks:
    """Client requests to callgrind from this process (no-ops when it does not run under valgrind)."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(str(library()))
        self._lib.zb_dump.argtypes = [ctypes.c_char_p]

    @property
    def running(self) -> bool:
        """Whether this process runs under valgrind."""
        return bool(self._lib.zb_running())

    def start(self) -> None:
        """Start counting (with ``--instr-atstart=no`` nothing is counted before)."""
        self._lib.zb_start()

    def stop(self) -> None:
        self._lib.zb_stop()

    def zero(self) -> None:
        """Forget what was counted so far."""
        self._lib.zb_zero()

    def dump(self, label: str) -> None:
        """Write the counts since the last dump or zero, under ``label``, and zero them."""
        self._lib.zb_dump(label.encode())


def valgrind_command(cmd: list[str], out_dir: str | Path, name: str) -> list[str]:
    """``cmd`` under callgrind, counting nothing until a client request says so; its dumps are written to
    ``out_dir/callgrind.out.<name>.<pid>.<n>-<thread>``, one per thread (``read_counts`` reads the main thread's:
    the host work; the communication library's threads move with the peer's timing)."""
    # valgrind expands %p and %q{VAR} in the file name: a % of the directory or the name is doubled, not a pattern
    out = str(Path(out_dir) / f"{OUT_PREFIX}.{name}").replace("%", "%%") + ".%p"
    return [
        check(),
        "--tool=callgrind",
        "--instr-atstart=no",
        "--collect-atstart=yes",
        "--separate-threads=yes",
        "--fair-sched=yes",
        "--error-limit=no",
        "--quiet",
        f"--callgrind-out-file={out}",
        *cmd,
    ]


_DESC = re.compile(r"^desc: Trigger: Client Request: (?P<label>.*)$")
_TOTAL = re.compile(r"^(?:summary|totals): (?P<n>\d+)")


def read_counts(out_dir: str | Path, name: str, pid: int | None = None, thread: int = 1) -> dict[str, int]:
    """{label: instructions of ``thread`` (1: the main thread)} of the dumps ``Marks.dump`` made in process ``pid``
    (default: this one), in the order they were made; a label dumped more than once sums."""
    stem = f"{OUT_PREFIX}.{name}.{os.getpid() if pid is None else pid}"
    counts: dict[str, int] = {}
    numbered = {}  # callgrind names the n-th dump of a process <stem>.<n>, or <stem>.<n>-<thread> per thread
    for f in Path(out_dir).glob(f"{stem}.*"):
        n, _, tid = f.name[len(stem) + 1 :].partition("-")
        if n.isdigit() and (not tid or (tid.isdigit() and int(tid) == thread)):
            numbered[int(n)] = f
    for _, f in sorted(numbered.items()):
        label, total = None, None
        for line in f.read_text(errors="replace").splitlines():
            if (m := _DESC.match(line)) is not None:
                label = m["label"]
            elif (m := _TOTAL.match(line)) is not None and total is None:
                total = int(m["n"])
        if label is not None and total is not None:
            counts[label] = counts.get(label, 0) + total
    return counts


if __name__ == "__main__":  # python -m zerobench.metrics.callgrind: build the library, say where it is
    try:
        print(library())
    except CallgrindUnavailable as e:
        print(f"zerobench: {e}", file=sys.stderr)
        sys.exit(2)
