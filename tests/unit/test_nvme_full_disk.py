"""The NVMe tier on a full disk: a failed write of the optimizer-state file is one line (exit 1 from the CLI)
naming the NVMe path, the space the states need and the space free there, never an OSError traceback; the
file is removed when the store fails while writing its initial state."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from tests.unit.test_bad_inputs import run
from zerobench.config import RunFailed
from zerobench.zero.offload.nvme import NvmeStore
from zerobench.zero.optim.states import Fp32Codec, Int8Codec

REAL_PWRITEV = os.pwritev


def disk_full_after(budget: int):
    """os.pwritev that writes ``budget`` bytes in all, then fails as a full disk does."""
    written = [0]

    def pwritev(fd, buffers, offset):
        n = sum(len(b) for b in buffers)
        if written[0] + n > budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += n
        return REAL_PWRITEV(fd, buffers, offset)

    return pwritev


def assert_names_path_and_space(e: RunFailed, path, need: int) -> None:
    msg = str(e)
    assert "\n" not in msg and "No space left on device" in msg, msg
    assert f"NVMe path {str(path)!r}" in msg and f"({need} bytes)" in msg and "is free" in msg, msg


@pytest.mark.parametrize("codec", [Fp32Codec(), Int8Codec()])
def test_a_full_disk_while_the_initial_state_is_written(codec, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "pwritev", disk_full_after(4096))
    with pytest.raises(RunFailed) as e:
        NvmeStore(codec, [3000, 5000], str(tmp_path))
    need = sum(t.numel() * t.element_size() for n in (3000, 5000) for t in codec.alloc(n, torch.device("cpu")).values())
    assert_names_path_and_space(e.value, tmp_path, need)
    assert list(tmp_path.iterdir()) == [], "the partial state file and its directory are removed"


def test_a_full_disk_while_a_chunk_is_written_back(tmp_path, monkeypatch):
    """A write queued on the store's thread pool fails there; its error reaches the step as the same line."""
    codec = Fp32Codec()
    store = NvmeStore(codec, [3000, 5000], str(tmp_path))
    monkeypatch.setattr(os, "pwritev", disk_full_after(0))
    enc = store.acquire(0)
    store.release(0, enc)
    with pytest.raises(RunFailed) as e:
        store.flush()
    assert_names_path_and_space(e.value, tmp_path, store.file_bytes())


def test_train_with_nvme_offload_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "pwritev", disk_full_after(4096))
    code, err = run(
        [
            "train",
            "--preset",
            "tiny",
            "--dp",
            "1",
            "--stage",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--offload-optimizer",
            "nvme",
            "--nvme-path",
            str(tmp_path / "nvme"),
            "--out",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    lines = err.strip().splitlines()
    assert code == 1, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("zerobench: error: cannot write optimizer states under NVMe path"), lines[0]
    assert "No space left on device" in lines[0] and "is free" in lines[0], lines[0]
    assert list((tmp_path / "nvme").iterdir()) == []
