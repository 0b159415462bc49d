"""Where Adam's moments live and in what form: codecs (fp32 or blockwise 8-bit) and stores (memory or NVMe).

The optimizer works chunk by chunk (one chunk = this rank's shard of one bucket). For each chunk it
``acquire``s the encoded state from the store, ``decode``s it to fp32 ``(m, v)``, runs the fused update,
``encode``s the result back and ``release``s the chunk.

- ``Fp32Codec``: the state *is* fp32 ``m, v`` (decode returns the stored tensors; the update is in place).
- ``Int8Codec``: codes (uint8) and per-block absmax for each moment (``zerobench.zero.optim.quant8``); decode
  makes fp32 temporaries of one chunk, encode re-quantizes them. 2 + 8/2048 bytes per element, not 8.
- ``MemoryStore``: every chunk's encoded state resident (device memory, or host memory under offload).
- ``NvmeStore`` (``zerobench.zero.offload.nvme``): encoded chunks in files, read ahead and written behind.
"""

from __future__ import annotations

import torch

from zerobench.zero.optim.quant8 import code_book, dequantize, quantize_, run_blocks, runs, state_bytes_per_element

State = dict[str, torch.Tensor]


class Fp32Codec:
    name = "fp32"

    def alloc(self, numel: int, device: torch.device, pin: bool = False, chunk: int = 0) -> State:
        return {
            "m": torch.zeros(numel, dtype=torch.float32, device=device, pin_memory=pin),
            "v": torch.zeros(numel, dtype=torch.float32, device=device, pin_memory=pin),
        }

    def decode(self, enc: State, chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return enc["m"], enc["v"]

    def encode(self, m: torch.Tensor, v: torch.Tensor, enc: State, chunk: int = 0) -> None:
        if m is not enc["m"]:
            enc["m"].copy_(m)
            enc["v"].copy_(v)

    @staticmethod
    def bytes_per_element() -> float:
        return 8.0


class Int8Codec:
    """``breaks``: per chunk, the offsets where a quantization block must start afresh (None: none). With TP, the
    edges of the TP-replicated ranges: a block holding sharded and replicated elements would take a different absmax
    on each TP rank, and the replicated parameters, rounded differently, would drift apart across TP ranks."""

    name = "int8"

    def __init__(self, breaks: list[list[int]] | None = None):
        self.breaks = breaks

    def _runs(self, chunk: int, numel: int) -> list[tuple[int, int, int]]:
        return runs(numel, self.breaks[chunk] if self.breaks is not None else ())

    def alloc(self, numel: int, device: torch.device, pin: bool = False, chunk: int = 0) -> State:
        nb = run_blocks(numel, self.breaks[chunk] if self.breaks is not None else ())
        enc = {
            "m_codes": torch.empty(numel, dtype=torch.uint8, device=device, pin_memory=pin),
            "v_codes": torch.empty(numel, dtype=torch.uint8, device=device, pin_memory=pin),
            "m_absmax": torch.zeros(nb, dtype=torch.float32, device=device, pin_memory=pin),
            "v_absmax": torch.zeros(nb, dtype=torch.float32, device=device, pin_memory=pin),
        }
        # Zero moments: absmax 0 makes every code decode to 0 whatever it is; pick the code of 0.0 anyway.
        enc["m_codes"].fill_(int(torch.searchsorted(code_book(True), torch.tensor(0.0))))
        enc["v_codes"].fill_(0)
        return enc

    def decode(self, enc: State, chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self._runs(chunk, enc["m_codes"].numel())
        if len(parts) <= 1:
            m = dequantize(enc["m_codes"], enc["m_absmax"], signed=True)
            v = dequantize(enc["v_codes"], enc["v_absmax"], signed=False)
            return m.contiguous(), v.contiguous()
        out = []
        for key, signed in (("m", True), ("v", False)):
            codes, absmax = enc[f"{key}_codes"], enc[f"{key}_absmax"]
            out.append(
                torch.cat([dequantize(codes[a:b], absmax[k : k + run_blocks(b - a)], signed) for a, b, k in parts])
            )
        return out[0], out[1]

    def encode(self, m: torch.Tensor, v: torch.Tensor, enc: State, chunk: int = 0) -> None:
        for a, b, k in self._runs(chunk, m.numel()):
            nb = run_blocks(b - a)
            quantize_(m[a:b], enc["m_codes"][a:b], enc["m_absmax"][k : k + nb], signed=True)
            quantize_(v[a:b], enc["v_codes"][a:b], enc["v_absmax"][k : k + nb], signed=False)

    @staticmethod
    def bytes_per_element() -> float:
        return state_bytes_per_element()


def make_codec(bits: int, breaks: list[list[int]] | None = None):
    """The codec of ``bits``-bit moments; ``breaks``: ``Int8Codec``'s."""
    if bits == 32:
        return Fp32Codec()
    if bits == 8:
        return Int8Codec(breaks)
    raise ValueError(f"optimizer state bits must be 32 or 8, got {bits}")


class MemoryStore:
    """Every chunk's encoded state resident in memory (fp32 moments in two flat buffers)."""

    def __init__(self, codec, sizes: list[int], device: torch.device, pin: bool = False):
        self.codec = codec
        if isinstance(codec, Fp32Codec):  # two flat buffers, chunks are views (one allocation each)
            flat = codec.alloc(sum(sizes), device, pin)
            self.flat = [flat["m"], flat["v"]]
            self.chunks, off = [], 0
            for n in sizes:
                self.chunks.append({"m": flat["m"][off : off + n], "v": flat["v"][off : off + n]})
                off += n
        else:
            self.chunks = [codec.alloc(n, device, pin, chunk=i) for i, n in enumerate(sizes)]
            self.flat = [t for c in self.chunks for t in c.values()]

    def acquire(self, i: int) -> State:
        return self.chunks[i]

    def release(self, i: int, enc: State) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Nothing to remove: the chunks are memory, freed with the store."""

    def tensors(self) -> list[torch.Tensor]:
        return list(self.flat)

    def file_bytes(self) -> int:
        return 0
