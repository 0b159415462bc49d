"""Published training throughput (``results/reference/sim-published/published.csv``), as rows the simulator
predicts on a stated device.

Every row is another team's run: its model shape, its batch, its parallelism and stage, its precision, its
recompute and its hardware. Next to these stand the figure that team published and where they published it
(the table's README). A row is read into the ``RunSpec`` keys a sweep would run (``run_keys``), and its
figure into tokens per second per GPU (``published_tokens``). TFLOP/s need a FLOP count to become tokens. For
``formula-3`` rows (Narayanan et al. 2021, eq. 3) that count is exact, and it equals zerobench's hardware
convention. A source that prints no formula (``unknown``) is read both ways, with and without the recompute,
and each reading is kept. Relative figures are read against their reference row: ``speedup`` is a ratio of
step times, and ``weak_scaling_efficiency`` a ratio of FLOP/s per GPU.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, fields
from pathlib import Path

TABLE = Path(__file__).resolve().parents[2] / "results" / "reference" / "sim-published" / "published.csv"
METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "speedup", "weak_scaling_efficiency")
CONVENTIONS = ("hardware", "model")
"""FLOP readings of a TFLOP/s figure: with the recompute's extra forward (hardware) and without (model)."""
ATTENTION = ("unfused", "fused-softmax", "flash", "flash-triton")


@dataclass(frozen=True)
class Row:
    """One published figure and the run it was measured on (the CSV's columns)."""

    id: str
    split: str
    """``calibration`` (at most one per device class, never a ZeRO/FSDP run) or ``held_out``."""
    device: str
    """A stated device (``zerobench.sim.stated.DEVICES``)."""
    gpu_mem_gb: int
    gpus: int
    tp: int
    zero: int
    """0: plain data parallelism (Megatron-LM); 2: FSDP SHARD_GRAD_OP; 3: ZeRO-3 / FSDP FULL_SHARD."""
    framework: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    micro_batch: int
    grad_accum: int
    precision: str
    reduce_dtype: str
    """The element type gradients are reduced in (fp32 for Composer's DEFAULT mixed precision)."""
    recompute: bool
    attention: str
    """The attention kernels the run states: ``unfused``, ``fused-softmax``, ``flash`` (FlashAttention-2, CUDA) or
    ``flash-triton`` (FlashAttention in Triton)."""
    metric: str
    published: float
    relative_to: str
    flop_convention: str
    """``formula-3`` (Narayanan et al. 2021, eq. 3: with the recompute), ``unknown``, or empty."""
    source: str
    """Where the figure is published (a URL), or, for the project's own measured run, its reference dataset's
    README (``results/reference/...``), which gives the command, the card and the versions."""
    where: str
    notes: str

    @property
    def dp(self) -> int:
        return self.gpus // self.tp

    @property
    def device_class(self) -> str:
        """The GPU generation (``v100``, ``a100``, ``h100``): a calibration figure serves one class."""
        return self.device.split("-")[0]


_INT = {f.name for f in fields(Row) if f.type == "int"}


def load(path: str | Path = TABLE, data: bytes | None = None) -> list[Row]:
    """The table's rows, checked: raises ``ValueError`` naming the first bad row and what is wrong with it.
    ``data``: the file's bytes, already read (then ``path`` only names it in messages)."""
    from zerobench.sim.stated import DEVICES

    if data is None:
        data = Path(path).read_bytes()
    raw = list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))
    want = [f.name for f in fields(Row)]
    if not raw or list(raw[0]) != want:
        raise ValueError(f"{path}: the columns must be {','.join(want)}")
    rows, seen = [], set()
    for r in raw:
        try:
            row = Row(
                **{
                    k: (
                        int(v) if k in _INT else float(v) if k == "published" else v == "yes" if k == "recompute" else v
                    )
                    for k, v in r.items()
                }
            )
        except ValueError as e:
            raise ValueError(f"{path}: row {r.get('id')!r}: {e}") from None
        bad = (
            "its id repeats an earlier row's"
            if row.id in seen
            else f"unknown device {row.device!r}"
            if row.device not in DEVICES
            else f"{row.device} states no {row.gpu_mem_gb} GB card (zerobench/sim/stated.py hbm_bw_by_mem)"
            if not _card_known(DEVICES[row.device], row.gpu_mem_gb)
            else f"unknown metric {row.metric!r}"
            if row.metric not in METRICS
            else f"unknown attention {row.attention!r}"
            if row.attention not in ATTENTION
            else f"split must be calibration or held_out, not {row.split!r}"
            if row.split not in ("calibration", "held_out")
            else f"gpus {row.gpus} is not divisible by tp {row.tp}"
            if row.gpus % row.tp
            else ""
        )
        if bad:
            raise ValueError(f"{path}: row {row.id!r}: {bad}")
        seen.add(row.id)
        rows.append(row)
    for row in rows:
        if row.metric in ("speedup", "weak_scaling_efficiency") and row.relative_to not in seen:
            raise ValueError(f"{path}: row {row.id!r}: relative_to {row.relative_to!r} is not a row of the table")
    return rows


def _card_known(dev, gb: int) -> bool:
    return gb * 1e9 == dev.mem_bytes or gb in dev.hbm_bw_by_mem


def stack(row: Row):
    """The program the row's framework ran (``software.Stack``), with its ZeRO-3 machinery where it differs from
    zerobench's engine."""
    from zerobench.sim.software import STACKS

    fw = row.framework
    if fw.startswith("megatron-lm 2019") and ("deepspeed" in fw or "zero paper's cluster" in fw):
        return STACKS["megatron-2019+deepspeed-0.2"]  # the ZeRO team's Megatron-LM and DeepSpeed, as the paper's runs
    if fw.startswith("megatron-lm 2019"):
        return STACKS["megatron-2019"]
    if fw.startswith("megatron-lm 2021"):
        return STACKS["megatron-2021+deepspeed-0.3" if "deepspeed" in fw else "megatron-2021"]
    if fw.startswith("zerobench"):  # the project's own measured run (its GPT, SDPA)
        return STACKS["zerobench"]
    if fw.startswith("llm-foundry"):  # attn_impl: triton (the stack's) or flash (FlashAttention-2's CUDA kernel)
        return STACKS["llm-foundry-flash2" if row.attention == "flash" else "llm-foundry"]
    raise ValueError(f"row {row.id!r}: no program is described for framework {fw!r} (zerobench/sim/software.py)")


def model_state_floor(row: Row) -> dict:
    """The bytes of model states one GPU of the row's run holds at least (``sim.memory.state_floor``: the parameters
    of one TP rank times the bytes its program's optimizer keeps for each, as ZeRO partitions them), against its
    card. The card is taken at its binary size (a 32 GB V100 as 32 GiB), so a row whose floor exceeds its card
    could not have run as the table states it. ``{"bytes", "card_bytes", "per_param", "params"}``."""
    from zerobench.sim.memory import state_floor

    return {**state_floor(train_config(run_keys(row)), stack(row)), "card_bytes": row.gpu_mem_gb * 2**30}


def run_keys(row: Row) -> dict:
    """The row as ``RunSpec`` keys (``zerobench.bench.spec``). Megatron-LM's data parallelism is one all-reduce of
    all gradients after backward (no C_B). FSDP gathers and reduces one flat parameter per wrapped block (one bucket
    per unit). DeepSpeed's 2021 ZeRO-3 does it per parameter (a bucket per parameter); its 2020 ZeRO-1 in
    sub-partitions of at most 5e8 elements (``max_elements_per_comm``'s default)."""
    keys = dict(
        layers=row.layers,
        hidden=row.hidden,
        heads=row.heads,
        vocab=row.vocab,
        seq=row.seq,
        gpus=row.gpus,
        tp=row.tp,
        micro_batch=row.micro_batch,
        grad_accum=row.grad_accum,
        precision=row.precision,
        checkpoint_activations=row.recompute,
        stage=row.zero,
    )
    if row.framework.startswith("zerobench"):
        keys.update(system="zerobench")
    elif row.zero == 0:
        keys.update(system="megatron", bucket_size=None)
    elif "deepspeed 0.1" in row.framework:  # ZeRO-1's reduce-scatter in sub-partitions of 5e8 elements at most
        keys.update(bucket_size=500_000_000)
    elif "deepspeed" in row.framework:
        keys.update(bucket_size=1)
    else:
        keys.update(bucket_size=None)
    return keys


def train_config(keys: dict):
    """Run keys resolved as a sweep resolves them, in planner mode (the system is not checked: the paper's fp16
    Megatron-LM rows are configurations, not runs of this host's baseline)."""
    from zerobench.bench.spec import FIELDS, RunSpec, to_train_config

    return to_train_config(RunSpec(**{k: v for k, v in keys.items() if k in FIELDS}), check_system=False)


def flops_per_token(row: Row, convention: str) -> float:
    """FLOPs per token of the row's model in ``convention`` (zerobench's count; ``hardware`` is Narayanan et al.'s
    eq. 3 exactly: 96·l·h²·(1 + s/6h + V/16lh) per token when the run recomputes)."""
    from zerobench.models.sizes import flops_per_token as fpt

    model = train_config(run_keys(row)).model
    return fpt(model, recompute=row.recompute and convention == "hardware")


def readings(row: Row, rows: dict[str, Row]) -> dict[str, float]:
    """The published figure as tokens per second per GPU, per FLOP convention it can be read in (one key,
    ``exact``, where it needs no convention or states its own)."""
    if row.metric == "tokens_per_s_per_gpu":
        return {"exact": row.published}
    if row.metric == "tflops_per_gpu":
        if row.flop_convention == "formula-3":
            return {"exact": row.published * 1e12 / flops_per_token(row, "hardware")}
        return {c: row.published * 1e12 / flops_per_token(row, c) for c in CONVENTIONS}
    ref = rows[row.relative_to]
    base = readings(ref, rows)
    if row.metric == "weak_scaling_efficiency":  # FLOP/s per GPU relative to the reference's
        return {c: row.published * v * flops_per_token(ref, c) / flops_per_token(row, c) for c, v in base.items()}
    # speedup: the same tokens per step in 1/speedup of the reference's time, over this row's GPUs
    return {c: row.published * v * ref.gpus / row.gpus for c, v in base.items()}
