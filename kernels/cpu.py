"""Build, cache and bind the C++ CPU kernels (``csrc/zb_cpu_kernels.cpp``).

The library is compiled once per (source, compiler flags, CPU feature set) with g++ into a cache directory
(``$ZEROBENCH_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/zerobench/kernels``) and loaded with ctypes, for this
CPU (``-march=native``) or for the architecture ``$ZEROBENCH_KERNEL_MARCH`` names (a rank under valgrind, which
does not run AVX-512 code, gets ``x86-64-v3``: AVX2); a build
takes about a second because the source uses no torch headers. The compiler command is a fixed argument
list (no shell, nothing pasted from user input). Concurrent builders (several ranks starting at once)
write to a temporary name and rename atomically.

``library()`` returns the bound library or raises ``KernelUnavailable`` with one line saying why.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "csrc" / "zb_cpu_kernels.cpp"
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=c++17"]
MARCH_ENV = "ZEROBENCH_KERNEL_MARCH"
LIBS = ["-lmvec"]  # glibc's vector math (erff/expf in the GeLU and softmax loops)
ABI_VERSION = 5

_lock = threading.Lock()
_log = logging.getLogger(__name__)
_lib: ctypes.CDLL | None = None
_error: str | None = None


class KernelUnavailable(RuntimeError):
    """The C++ CPU kernels cannot be built or loaded here (the message says why and what to do)."""


def cache_dir() -> Path:
    if os.environ.get("ZEROBENCH_KERNEL_CACHE"):
        return Path(os.environ["ZEROBENCH_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zerobench" / "kernels"


def _cpu_features() -> str:
    """The CPU's feature flags: a library built with -march=native only runs where these match."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise KernelUnavailable(f"C++ compiler {cxx!r} not found: install g++ (apt install g++) or set CXX")
    return path


def _flags() -> list[str]:
    march = os.environ.get(MARCH_ENV)
    return [f"-march={march}" if march and f == "-march=native" else f for f in FLAGS]


def build(force: bool = False) -> Path:
    """Compile the library if the cache has no build for this source/flags/CPU; return its path."""
    cxx = _compiler()
    flags = _flags()
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(flags + LIBS).encode(), cxx.encode(), _cpu_features().encode()):
        key.update(part)
    out = cache_dir() / f"zb_cpu_kernels-{key.hexdigest()[:16]}.so"
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *flags, "-o", tmp, str(SOURCE), *LIBS]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        os.unlink(tmp)
        first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
        raise KernelUnavailable(f"building the CPU kernels failed ({first}); use kernels='reference' meanwhile")
    os.replace(tmp, out)
    return out


def _bind(lib: ctypes.CDLL) -> None:
    P, I, L, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float  # noqa: E741 - ctypes letters
    sig = {
        "zb_abi_version": ([], I),
        "zb_adamw": ([P, P, I, P, P, P, I, I, P, L, F, F, F, F, F, F, F, F, I], None),
        "zb_adamw_bandwidth_probe": ([P, P, P, P, L, I], None),
        "zb_nonfinite": ([P, I, L, I], I),
        "zb_bias_gelu_fwd": ([P, P, P, L, L, I, I], None),
        "zb_bias_gelu_bwd": ([P, P, P, P, L, L, I, I], None),
        "zb_layer_norm_fwd": ([P, P, P, P, P, P, L, L, F, I], None),
        "zb_layer_norm_bwd": ([P, P, P, P, P, P, P, P, L, L, I], None),
        "zb_causal_softmax_fwd": ([P, P, L, L, F, I], None),
        "zb_causal_softmax_bwd": ([P, P, P, L, L, F, I], None),
        "zb_flat_copy": ([P, P, P, L, I, I], None),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res


def _load() -> ctypes.CDLL:
    """The cached build, loaded; a cached file that does not load (truncated by a full disk or a killed copy) is built
    again once, since every later process would otherwise find it and fall back to the reference path."""
    path = build()
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        _log.warning("the cached CPU kernel build %s does not load (%s): building it again", path, e)
        return ctypes.CDLL(str(build(force=True)))


def library() -> ctypes.CDLL:
    """The loaded CPU kernel library (built on first use); raises ``KernelUnavailable``."""
    global _lib, _error  # noqa: PLW0603 - a loaded shared library is per process by nature
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if _error is not None:
                raise KernelUnavailable(_error)
            try:
                lib = _load()
                _bind(lib)
                if lib.zb_abi_version() != ABI_VERSION:
                    raise KernelUnavailable("stale CPU kernel build: remove the kernel cache and retry")
            except KernelUnavailable as e:
                _error = str(e)
                raise
            except OSError as e:
                _error = f"loading the CPU kernels failed ({e}); use kernels='reference' meanwhile"
                raise KernelUnavailable(_error) from e
            _lib = lib
    return _lib


def available() -> bool:
    try:
        library()
        return True
    except KernelUnavailable:
        return False


def threads() -> int:
    """OpenMP threads per call: torch's intra-op thread count, so ranks sharing a host do not oversubscribe."""
    import torch

    return max(1, torch.get_num_threads())
