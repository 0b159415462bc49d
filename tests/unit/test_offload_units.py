"""Offload building blocks without processes: 8-bit quantization, state codecs and stores (NVMe files),
the host partition's buffers, the tracker pause, config errors and the analytic device/host split."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from zerobench.config import ConfigError
from zerobench.metrics.analytic import host_state_bytes_analytic, model_state_bytes_analytic
from zerobench.metrics.memory import LiveTensorTracker, untracked
from zerobench.zero import ZeroConfig
from zerobench.zero.layout import ParamSpec, build_layout
from zerobench.zero.offload.host import HostPartition
from zerobench.zero.offload.nvme import NvmeStore
from zerobench.zero.optim import quant8
from zerobench.zero.optim.states import Fp32Codec, Int8Codec, MemoryStore


@pytest.mark.parametrize("signed", [True, False])
def test_code_books_are_sorted_unique_and_hold_the_extremes(signed):
    b = quant8.code_book(signed)
    assert b.numel() == 256 and torch.all(b[1:] > b[:-1])
    assert 0.0 in b.tolist() and 1.0 in b.tolist()
    assert (-1.0 in b.tolist()) == signed
    # seven decades below the block maximum are representable (dynamic range)
    assert b[b > 0].min() <= 1e-6


@pytest.mark.parametrize("n", [1, 2047, 2048, 5000])
def test_quantize_round_trip_error_is_bounded_by_the_book_spacing(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 0, n)[torch.randperm(n, generator=g)]
    codes, absmax = torch.empty(n, dtype=torch.uint8), torch.empty(quant8.num_blocks(n))
    quant8.quantize_(x, codes, absmax, signed=True)
    y = quant8.dequantize(codes, absmax, signed=True)
    for blk in range(quant8.num_blocks(n)):
        sl = slice(blk * quant8.BLOCK, min(n, (blk + 1) * quant8.BLOCK))
        a = x[sl].abs().max()
        assert absmax[blk] == a
        # the widest steps are the top decade's negative side (63 steps over 0.9): half of one is the worst
        assert (y[sl] - x[sl]).abs().max() <= a * 0.9 / 63 / 2 + 1e-12
    assert y[x.abs().argmax()] == x[x.abs().argmax()], "the block maximum is represented exactly"
    # re-quantizing decoded values on the same blocks gives the same codes (exact checkpoint reloads)
    codes2, absmax2 = torch.empty_like(codes), torch.empty_like(absmax)
    quant8.quantize_(y, codes2, absmax2, signed=True)
    assert torch.equal(codes2, codes) and torch.equal(absmax2, absmax)


def test_zero_blocks_and_unsigned_values():
    x = torch.zeros(3000)
    x[2500:] = torch.rand(500) ** 4
    codes, absmax = torch.empty(3000, dtype=torch.uint8), torch.empty(2)
    quant8.quantize_(x, codes, absmax, signed=False)
    y = quant8.dequantize(codes, absmax, signed=False)
    assert absmax[0] == 0 and torch.all(y[:2048] == 0)
    # the unsigned book's widest steps: the top decade, 128 steps over 0.9 of the block maximum
    assert (y - x).abs().max() <= absmax[1] * 0.9 / 128 / 2 + 1e-12
    assert (y[x > 0.1 * absmax[1]] / x[x > 0.1 * absmax[1]] - 1).abs().max() <= 0.9 / 128 / 2 / 0.1


@pytest.mark.parametrize("codec", [Fp32Codec(), Int8Codec()])
def test_codecs_round_trip(codec):
    enc = codec.alloc(4100, torch.device("cpu"))
    m0, v0 = codec.decode(enc)
    assert not m0.any() and not v0.any(), "fresh states are zero"
    m, v = torch.randn(4100) * 1e-3, torch.rand(4100) * 1e-6
    codec.encode(m, v, enc)
    m1, v1 = codec.decode(enc)
    tol = 0 if isinstance(codec, Fp32Codec) else 0.9 / 63 / 2
    assert (m1 - m).abs().max() <= tol * m.abs().max() + 1e-12
    assert (v1 - v).abs().max() <= tol * v.abs().max() + 1e-12
    assert sum(t.numel() * t.element_size() for t in enc.values()) <= codec.bytes_per_element() * 4100 + 16


@pytest.mark.parametrize("codec", [Fp32Codec(), Int8Codec()])
def test_nvme_store_round_trips_through_its_file_with_read_ahead(tmp_path, codec):
    sizes = [3000, 10, 5000]
    store = NvmeStore(codec, sizes, str(tmp_path / "nvme"), rank=3)
    assert os.path.exists(store.path) and os.path.getsize(store.path) == store.file_bytes() > 0
    want = []
    for i, n in enumerate(sizes):
        enc = store.acquire(i)
        assert (i + 1 in store.reads) == (i + 1 < len(sizes)), "the next chunk is read ahead"
        m, v = torch.randn(n), torch.rand(n)
        codec.encode(m, v, enc)
        want.append(codec.decode(enc))
        store.release(i, enc)
    store.flush()
    for i, enc in enumerate(store.read_all()):
        m, v = codec.decode(enc)
        assert torch.equal(m, want[i][0]) and torch.equal(v, want[i][1])
    assert store.tensors() == [] and MemoryStore(codec, sizes, torch.device("cpu")).file_bytes() == 0
    directory = store.dir
    del store, enc
    gc.collect()
    assert not os.path.exists(directory), "state files are removed with the engine"


def test_nvme_store_bad_path_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot use NVMe path"):
        NvmeStore(Fp32Codec(), [10], str(blocker / "sub"))


def test_host_partition_buffers_and_chunks():
    layout = build_layout([ParamSpec("a", (100,)), ParamSpec("b", (50, 3))], shards=2, bucket_numel=64)
    for dtype, params, fp32_master_is_params in [(torch.bfloat16, False, False), (torch.float32, True, True)]:
        h = HostPartition(layout, torch.device("cpu"), dtype, dtype, offload_params=params)
        assert h.grads.numel() == layout.shard_numel and h.master.dtype == torch.float32
        assert (h.master is h.params) == fp32_master_is_params
        chunks = h.chunks(h.grads)
        assert [c.numel() for c in chunks] == [b.shard_numel for b in layout.buckets]
        shard = torch.arange(chunks[1].numel(), dtype=dtype)
        h.grad_ready(1, shard, accumulate=False)
        h.grad_ready(1, shard, accumulate=True)
        h.finish_grad_copies()
        assert torch.equal(h.chunks(h.grads)[1], 2 * shard)
        dev = [torch.zeros(c.numel(), dtype=dtype) for c in chunks]
        on_chunk = h.start_copy_back(None if params else dev)
        assert (on_chunk is None) == params


def test_untracked_pauses_the_live_tensor_tracker():
    tr = LiveTensorTracker()
    with tr:
        a = torch.empty(1000)
        with untracked():
            b = torch.empty(5000)
            b.add_(1)
        c = torch.empty(10)
    assert tr.peak == (1000 + 10) * 4
    del a, b, c


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(stage=0, offload_optimizer="cpu"), "use --stage 1, 2 or 3"),
        (dict(stage=2, offload_optimizer="gpu"), "unknown optimizer offload"),
        (dict(stage=2, offload_optimizer="cpu", offload_param="cpu"), "needs --stage 3"),
        (dict(stage=3, offload_param="cpu"), "needs --stage 3 and optimizer offload"),
        (dict(stage=2, offload_optimizer="nvme"), "needs --nvme-path"),
        (dict(stage=2, optim_bits=4), "must be 32 or 8"),
    ],
)
def test_offload_config_errors_are_one_line(kw, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        ZeroConfig(**kw).validate()
    assert "\n" not in str(e.value)


def test_analytic_split_device_and_host():
    psi, n = 1_000_000, 4
    # stage 2 mixed precision with optimizer offload: 2Ψ on the device, 16Ψ/N on the host
    dev = model_state_bytes_analytic(psi, n, 2, 2, 2, 4, offload_optimizer=True)
    assert sum(dev.values()) == 2 * psi
    assert sum(host_state_bytes_analytic(psi, n, 2, 2, 2).values()) == 16 * psi / n
    # stage 3 with parameter offload: nothing persistent on the device
    assert sum(model_state_bytes_analytic(psi, n, 3, 2, 2, 4, offload_optimizer=True, offload_param=True).values()) == 0
    # 8-bit moments: K = 4 + 2 + 8/2048 instead of 12
    k8 = sum(model_state_bytes_analytic(psi, 1, 1, 2, 2, 4, quant8.state_bytes_per_element()).values()) / psi - 4
    assert k8 == pytest.approx(6.0 + 8 / 2048)


def test_allocators_plain_and_tracked():
    """The engine's allocator interface: the plain one only resizes; the tracked one keeps an active
    live-tensor tracker informed of resizes and pauses it for host work."""
    from zerobench.metrics.memory import TrackedAllocator
    from zerobench.zero.storage.allocator import PlainAllocator

    t = torch.empty(256)
    PlainAllocator().resize(t, 0)
    assert t.untyped_storage().nbytes() == 0
    with PlainAllocator().host_region():
        pass
    tr = LiveTensorTracker()
    with tr:
        full = torch.empty(1024)  # 4 KiB tracked
        before = tr.current
        TrackedAllocator().resize(full, 0)
        assert tr.current == before - 4096
        TrackedAllocator().resize(full, 4096)
        assert tr.current == before
        with TrackedAllocator().host_region():
            torch.empty(1 << 16)  # host work: not counted
        assert tr.current == before


@pytest.mark.parametrize(
    ("opt", "param", "want"),
    [
        ("none", "none", ("device", "device", "device", False)),
        ("cpu", "none", ("device", "host", "host", True)),
        ("nvme", "none", ("device", "host", "nvme", True)),
        ("cpu", "cpu", ("host", "host", "host", True)),
    ],
)
def test_placement_from_the_config(opt, param, want):
    from zerobench.zero.config import ZeroConfig
    from zerobench.zero.storage.placement import Placement

    p = Placement.of(ZeroConfig(stage=3, offload_optimizer=opt, offload_param=param, nvme_path="/tmp"))
    assert (p.params.value, p.master.value, p.states.value, p.offloaded) == want


def test_a_failed_nvme_write_refuses_every_later_use_of_the_store(tmp_path, monkeypatch):
    """A write that failed mid-step (ENOSPC once) left chunks of two steps in the file beside an updated master, and
    the engine went on: the next save raised the stale error, the one after saved the mixed state, training drifted
    (a helper's review). Every later use of the store is now refused, naming the first failure."""
    from zerobench.config import RunFailed
    from zerobench.zero.offload import nvme

    codec, sizes = Fp32Codec(), [100, 100]
    store = NvmeStore(codec, sizes, str(tmp_path / "nvme"))
    real, calls = os.pwritev, []

    def pwritev(fd, bufs, off):
        calls.append(off)
        if len(calls) == 2:  # chunk 1's first tensor
            raise OSError(28, "No space left on device")
        return real(fd, bufs, off)

    monkeypatch.setattr(nvme.os, "pwritev", pwritev)
    with pytest.raises(RunFailed, match="No space left on device"):  # where the step next meets the store
        for i in range(2):
            store.release(i, store.acquire(i))
        store.flush()
    monkeypatch.setattr(nvme.os, "pwritev", real)  # the disk has room again
    for use in (
        lambda: store.acquire(0),
        store.flush,
        store.read_all,
        lambda: store.release(0, codec.alloc(100, torch.device("cpu"))),
    ):
        with pytest.raises(RunFailed, match=r"No space left on device.*torn since .*restart from the last checkpoint"):
            use()


def test_a_failed_nvme_read_refuses_every_later_use_of_the_store(tmp_path, monkeypatch):
    """A read that failed mid-step (EIO on chunk 1, after chunk 0 was read, updated and written back) raised a bare
    OSError and left the store usable: the next step ran on a master and moments of two steps, and a save wrote them
    as a checkpoint (a helper's review). It is now one line, and every later use is refused as after a failed
    write."""
    from zerobench.config import RunFailed
    from zerobench.zero.offload import nvme

    codec, sizes = Fp32Codec(), [100, 100]
    store = NvmeStore(codec, sizes, str(tmp_path / "nvme"))
    store.flush()
    real = os.preadv

    def preadv(fd, bufs, off):
        if off >= store.offsets[1]:
            raise OSError(5, "Input/output error")
        return real(fd, bufs, off)

    monkeypatch.setattr(nvme.os, "preadv", preadv)
    with pytest.raises(RunFailed, match=r"^cannot read optimizer states under NVMe path .*: Input/output error"):
        for i in range(2):
            store.release(i, store.acquire(i))
    monkeypatch.setattr(nvme.os, "preadv", real)  # the disk reads again
    for use in (
        lambda: store.acquire(0),
        store.flush,
        store.read_all,
        lambda: store.release(0, codec.alloc(100, torch.device("cpu"))),
    ):
        with pytest.raises(RunFailed, match=r"Input/output error.*torn since .*restart from the last checkpoint"):
            use()


def test_destroy_removes_the_nvme_file_and_a_dead_process_s_is_reclaimed(tmp_path):
    """The state file went only when the store was collected: a forked rank (``os._exit``), a killed one, or a kept
    reference left a partition-sized file per run that nothing removed (a helper's review). ``close()`` (called by
    ``destroy()``) removes it; the next store under the path removes a dead process's, never a live one's, another
    host's or a look-alike's."""
    import json
    import subprocess
    import sys

    from zerobench.zero.offload.nvme import OWNER, reclaim

    root = tmp_path / "nvme"
    store = NvmeStore(Fp32Codec(), [10], str(root))
    store.close()
    assert not os.path.exists(store.dir)
    child = (
        "import os, sys; from zerobench.zero.offload.nvme import NvmeStore; "
        "from zerobench.zero.optim.states import Fp32Codec; "
        f"s = NvmeStore(Fp32Codec(), [10], {str(root)!r}); print(s.dir, flush=True); os._exit(0)"
    )
    dead = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isdir(dead)
    live = NvmeStore(Fp32Codec(), [10], str(root))  # reclaims the dead one's as it starts
    assert not os.path.exists(dead) and os.path.isdir(live.dir)
    kept = []
    for name, owner in (("keepme", None), ("other-host", {"pid": 1, "host": "elsewhere"})):
        d = root / f"zerobench-states-rank0-{name}"
        d.mkdir()
        if owner is not None:
            (d / OWNER).write_text(json.dumps(owner))
        kept.append(d)
    assert reclaim(str(root)) == [] and all(d.is_dir() for d in kept) and os.path.isdir(live.dir)


_FORKED_CHILD = """
import gc, os, sys
from zerobench.zero.offload.nvme import NvmeStore
from zerobench.zero.optim.states import Fp32Codec

store = NvmeStore(Fp32Codec(), [10], sys.argv[1])
for how in ("exit", "drop"):
    pid = os.fork()
    if pid == 0:  # the child: ends as a worker would, or lets go of its copy of the store first
        if how == "drop":
            del store
            gc.collect()
        sys.exit(0)  # a normal exit runs the inherited finalizer
    os.waitpid(pid, 0)
    print(how, os.path.exists(store.path), flush=True)
store.close()
print("closed", os.path.exists(store.dir), flush=True)
"""


def test_a_forked_child_that_exits_leaves_its_parent_s_nvme_states(tmp_path):
    """A child forked from a process with an NVMe store (a data-loader worker, a subprocess helper) inherits the
    store's finalizer; at its exit that removed the parent's live state file, and the parent's next read failed.
    Only the process that made the store removes it."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _FORKED_CHILD, str(tmp_path / "nvme")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["exit True", "drop True", "closed False"]


def test_engine_destroy_removes_its_nvme_states_at_once(tmp_path):
    from tests.unit.test_checkpoint_files import engine, step

    e = engine(stage=2, offload_optimizer="nvme", nvme_path=str(tmp_path / "nvme"))
    step(e)
    (d,) = list((tmp_path / "nvme").iterdir())
    e.destroy()
    assert not d.exists() and e.module is not None


def test_8bit_blocks_start_afresh_at_each_break():
    """Under TP the blocks restart at the edges of the TP-replicated ranges (``Int8Codec(breaks)``): a run's codes and
    scales are those of the run quantized alone, whatever the elements beside it hold, so TP ranks that hold the same
    replicated values and different shards store the replicated moments alike."""
    n, breaks = 5000, [[1000, 3100]]
    codec = Int8Codec(breaks)
    assert quant8.runs(n, breaks[0]) == [(0, 1000, 0), (1000, 3100, 1), (3100, 5000, 3)]
    torch.manual_seed(0)
    encs, ms = [], []
    for scale in (1.0, 50.0):  # the same middle run beside other values (a TP rank's other shards)
        m, v = torch.randn(n) * 1e-3, torch.rand(n) * 1e-6
        m[:1000] *= scale
        m[3100:] *= scale
        enc = codec.alloc(n, torch.device("cpu"), chunk=0)
        assert enc["m_absmax"].numel() == quant8.run_blocks(n, breaks[0]) == 4
        codec.encode(m, v, enc, chunk=0)
        encs.append(enc)
        ms.append(m)
    ms[1][1000:3100] = ms[0][1000:3100]
    encs[1] = codec.alloc(n, torch.device("cpu"), chunk=0)
    codec.encode(ms[1], torch.rand(n) * 1e-6, encs[1], chunk=0)
    a, b = (codec.decode(e, chunk=0)[0] for e in encs)
    assert torch.equal(a[1000:3100], b[1000:3100]) and not torch.equal(a[:1000], b[:1000])
    alone = Int8Codec()
    run = alone.alloc(2100, torch.device("cpu"))
    alone.encode(ms[0][1000:3100].clone(), torch.zeros(2100), run)
    assert torch.equal(alone.decode(run)[0], a[1000:3100])
    no_breaks = Int8Codec()  # without breaks: one run, the blocks as before
    assert quant8.runs(n) == [(0, n, 0)] and no_breaks.alloc(n, torch.device("cpu"))["m_absmax"].numel() == 3


def test_nvme_store_with_8bit_breaks_round_trips(tmp_path):
    sizes, breaks = [3000, 10, 5000], [[100, 2500], [], [4096]]
    codec = Int8Codec(breaks)
    store = NvmeStore(codec, sizes, str(tmp_path / "nvme"))
    want = []
    for i, n in enumerate(sizes):
        enc = store.acquire(i)
        codec.encode(torch.randn(n), torch.rand(n), enc, chunk=i)
        want.append(codec.decode(enc, chunk=i))
        store.release(i, enc)
    store.flush()
    for i, enc in enumerate(store.read_all()):
        m, v = codec.decode(enc, chunk=i)
        assert torch.equal(m, want[i][0]) and torch.equal(v, want[i][1])
