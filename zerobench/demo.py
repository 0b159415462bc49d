"""The embedded default job: train the tiny GPT at every ZeRO stage on local processes and compare.

Runs stages 0-3 at the same DP degree and global batch, then prints, from the rows the runs wrote,
what each stage holds per rank (measured vs the paper's formula), what it communicates per step, its
median step time and its final loss — the paper's memory/communication trade-off on one screen.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from zerobench.models.sizes import preset
from zerobench.results.rows import read_rows
from zerobench.train.config import TrainConfig
from zerobench.train.launch import launch_local
from zerobench.zero.config import Precision, ZeroConfig


def run_demo(out: Path | None, dp: int = 2, steps: int = 8, precision: str = "bf16") -> int:
    out = out or Path("runs") / ("demo-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    model = preset("tiny")
    failed = []
    for stage in range(4):
        cfg = TrainConfig(
            model=model, preset="tiny", dp=dp, steps=steps, warmup_steps=2,
            zero=ZeroConfig(stage=stage, precision=Precision(precision), bucket_numel=50_000),
        )
        print(f"\n=== stage {stage} ({['baseline DP', 'P_os', 'P_os+g', 'P_os+g+p'][stage]}), dp {dp} ===", flush=True)
        res = launch_local(cfg, out / f"stage{stage}", run_id=f"demo-stage{stage}", timeout_s=600)
        if not res.ok:
            failed.append(f"stage {stage}: {res.reason}")
    print_summary(out)
    if failed:
        print("failed runs: " + "; ".join(failed))
        return 1
    print(f"\nrows: {out}/*/rows.jsonl")
    return 0


def print_summary(out: Path) -> None:
    rows = read_rows(out)
    by_run: dict[str, dict] = {}
    for r in rows:
        d = by_run.setdefault(r["run_id"], {"stage": r["config"]["zero"]["stage"]})
        if r.get("rank", 0) == 0 and r["metric"] != "loss":
            d[r["metric"]] = r["value"]
        if r["metric"] == "loss":
            d["final_loss"] = r["value"]
    print("\nZeRO stages side by side (rank 0; bytes measured from the engine's tensors):")
    print(f"  {'stage':>5} {'model states':>14} {'paper formula':>14} {'comm/step (elem)':>17} "
          f"{'step time':>10} {'final loss':>10}")
    for d in sorted(by_run.values(), key=lambda d: d["stage"]):
        print(f"  {d['stage']:>5} {d.get('model_state_bytes', 0) / 2**20:11.3f} MiB "
              f"{d.get('model_state_bytes_analytic', 0) / 2**20:11.3f} MiB {d.get('comm_volume_elements_per_step', 0):17.0f} "
              f"{d.get('step_time_s', 0) * 1e3:8.1f}ms {d.get('final_loss', float('nan')):10.4f}")
