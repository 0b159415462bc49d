"""Run a function on N gloo ranks in fresh processes, with a hang timeout and failures propagated.

Like DeepSpeed's ``DistributedTest``: every rank initialises gloo through a file store, runs ``fn(rank,
world_size, *args)``, and sends back its (picklable) result or its traceback. Any rank's exception fails
the test with that rank's traceback; a rank that dies without reporting, or a run that exceeds
``timeout``, kills every process and fails loudly instead of hanging the suite.

Ranks are forked from a ``forkserver`` that has imported torch and the engine once (``PRELOAD``), not spawned:
a spawned rank spent 1.6 s importing before it ran anything (0.05 s forked, on the 2-core VM), and the fast tier
starts a few hundred of them. A forked rank is still a fresh process with no process group, no tensors and the
RNG state torch starts with; it takes the test's environment as a spawned one would (``_entry`` applies it).
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import tempfile
import time
import traceback

import torch.multiprocessing as mp


class DistributedFailure(AssertionError):
    pass


PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "zerobench.zero.engine", "zerobench.parallel.parallelize"]
"""``torch._dynamo`` too: ``torch.optim.Optimizer.add_param_group`` imports it on its first call (its
``_disable_dynamo`` wrapper), which cost every rank 1.7-2.5 s before its first engine existed (profiled)."""


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _entry(fn, rank, world_size, store, q, args, coll_timeout, environ):
    import torch
    import torch.distributed as dist

    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=coll_timeout),
        )
        # as bytes: a tensor put on the queue as it is travels as a file descriptor that the parent fetches from
        # this process's resource sharer, which is gone if this process has exited first (a loaded host)
        q.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent as a traceback
        q.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, timeout: float = 240.0, coll_timeout: float = 60.0) -> list:
    """Return ``[fn(0, ...), ..., fn(world_size-1, ...)]`` computed on separate gloo ranks."""
    ctx = _context()
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_entry, args=(fn, r, world_size, store, q, args, coll_timeout, dict(os.environ)), daemon=True
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < world_size:
                try:
                    rank, ok, payload = q.get(timeout=0.5)
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                    if dead:
                        raise DistributedFailure(
                            f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} without reporting"
                        ) from None
                    if time.monotonic() > deadline:
                        missing = sorted(set(range(world_size)) - set(results))
                        raise DistributedFailure(
                            f"ranks {missing} did not finish within {timeout:.0f}s (hang?)"
                        ) from None
                    continue
                if not ok:
                    raise DistributedFailure(f"rank {rank} failed:\n{payload}")
                results[rank] = pickle.loads(payload)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [results[r] for r in range(world_size)]
