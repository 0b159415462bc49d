"""The paper predictions (``zerobench.sim.paper``) as text for the terminal and as result rows."""

from __future__ import annotations


def _bound(c: dict) -> str:
    return f"{c['bound']} {c['paper']:g}".strip()


def _claim_line(c: dict) -> str:
    holds = "" if c["bound_holds"] is None else ("  (holds)" if c["bound_holds"] else "  (does not hold)")
    tag = " [fitted]" if c["fitted"] else ""
    return f"  {c['what'] + tag:<66} {_bound(c):>12} {c['simulated']:10.2f}  {c['error']:+7.1%}  {c['unit']}{holds}"


def _path(breakdown: dict) -> str:
    total = sum(breakdown.values())
    return ", ".join(
        f"{k} {v / total:.0%}" for k, v in sorted(breakdown.items(), key=lambda kv: -kv[1]) if v / total >= 0.005
    )


def format_paper(out: dict) -> str:
    conv = out["chosen"]
    r = out["conventions"][conv]
    fit = r["fit"]
    lines = [
        f"the paper's figures on {out['device']}",
        (
            f"one fitted factor: compute_scale {fit['value']:.3f} on {fit['fitted_on']} ({fit['source']}); "
            f"{conv} FLOPs ({out['chosen_because']})"
        ),
        f"  {'figure':<66} {'paper':>12} {'simulated':>10}  {'error':>7}",
    ]
    if out.get("relative_speed", 1.0) != 1.0:  # stated, not fitted: the node against the one the fit ran on
        lines.insert(
            2,
            f"stated, not fitted: device times / {out['relative_speed']:.3f} against the fit's node "
            f"({out['relative_speed_source']})",
        )
    lines += [_claim_line(c) for c in r["anchors"] + r["claims"] + out["max_size"]]
    lines.append(
        f"\nFig 3, 60B (MP 16) from 64 to 400 GPUs ({conv} FLOPs; x: aggregate vs the previous point, "
        "against the GPU ratio):"
    )
    prev = None
    for f in r["figures"]["fig3"]:
        s = f["at_paper_batch"]
        tf = s["hw_tflops_per_gpu" if conv == "hardware" else "tflops_per_gpu"]
        pf = s["hw_pflops_aggregate" if conv == "hardware" else "pflops_aggregate"]
        step = ""
        if prev is not None:
            grow, more = pf / prev[1], f["gpus"] / prev[0]
            step = f"  x{grow:.2f} for x{more:.2f} GPUs" + ("  superlinear" if grow > more * 1.005 else "")
        planner = f["planner_micro_batch"]
        lines.append(
            f"  {f['gpus']:>4} GPUs  micro-batch {f['micro_batch']:>3} (planner fits {planner:>3})  "
            f"{tf:6.1f} TFLOP/s per GPU  {pf:6.2f} PFLOP/s{step}"
        )
        lines.append(f"             critical path: {_path(s['breakdown_s'])}")
        prev = (f["gpus"], pf)
    lines.append(
        "  where it is superlinear, the micro-batch grew: P_os+g over more DP ranks frees memory for it, and a "
        "larger batch does the same DP traffic per step in more compute (dp_comm's share falls)"
    )
    lines.append(
        f"\nFig 8, 60B on 128 GPUs (MP 16), C1-C5 ({conv} FLOPs) at the paper's micro-batch and at the largest "
        "the memory planner fits:"
    )
    for f in r["figures"]["fig8"]:
        key = "hw_tflops_per_gpu" if conv == "hardware" else "tflops_per_gpu"
        best = f["at_planner_batch"]
        lines.append(
            f"  {f['config']}  micro-batch {f['micro_batch']:>3}: {f['at_paper_batch'][key]:6.1f} TFLOP/s per GPU"
            f"   planner's {f['planner_micro_batch']:>3}: "
            + (f"{best[key]:6.1f}" if best else "  none fits")
            + f"   critical path at the paper's: {_path(f['at_paper_batch']['breakdown_s'])}"
        )
    lines += _open_lines(r.get("open", []), conv)
    other = next(c for c in out["conventions"] if c != conv)
    o = out["conventions"][other]
    lines.append(f"\nread as {other} FLOPs instead (compute_scale {o['fit']['value']:.3f}):")
    lines += [_claim_line(c) for c in o["anchors"] + o["claims"]]
    return "\n".join(lines)


def _open_lines(statements: list[dict], conv: str) -> list[str]:
    """The statements whose run the paper does not configure: every candidate run, and which land within 15%."""
    if not statements:
        return []
    lines = [f"\nstatements whose run the paper does not configure ({conv} FLOPs; beside the claims, not among them):"]
    for s in statements:
        lines.append(f"  {s['what']}: paper {_bound(s)} {s['unit']}  ({s['source']})")
        lines.append(f"    left open: {s['left_open']}")
        for c in s["candidates"]:
            lines.append(
                f"    {c['label']:<24} {c['simulated']:6.1f}  {c['error']:+7.1%}   critical path: {_path(c['breakdown_s'])}"
            )
        lines.append(f"    within 15%: {'; '.join(s['within']) or 'none'}")
    return lines


def paper_rows(out: dict) -> list[dict]:
    """One row per (convention, figure): metric ``sim_paper_figure`` (the simulated value) with the paper's."""
    rows = []
    for conv, r in out["conventions"].items():
        for c in r["anchors"] + r["claims"] + out["max_size"]:
            rows.append(
                {
                    "metric": "sim_paper_figure",
                    "value": c["simulated"],
                    "unit": c["unit"],
                    "what": c["what"],
                    "paper": c["paper"],
                    "bound": c["bound"],
                    "error": c["error"],
                    "convention": conv,
                    "fitted": c["fitted"],
                    "chosen": conv == out["chosen"],
                    "compute_scale": r["fit"]["value"],
                    "device": out["device"],
                }
            )
        for label, sim in r["figures"]["fig2"].items():
            rows.append(_fig_row("fig2", label, sim, conv, out, r))
        for label, sim in r["figures"]["fig4"].items():
            rows.append(_fig_row("fig4", label, sim, conv, out, r))
        for f in r["figures"]["fig3"]:
            rows += _batch_rows("fig3", f"60B {f['gpus']} GPUs", f, conv, out, r, gpus=f["gpus"])
        for f in r["figures"]["fig8"]:
            rows += _batch_rows("fig8", f"60B {f['config']}", f, conv, out, r, zero_r=f["config"])
        rows += _open_rows(r.get("open", []), conv, out, r)
    return rows


def _open_rows(statements: list[dict], conv: str, out: dict, r: dict) -> list[dict]:
    """One ``sim_paper_open`` row per candidate run of a statement whose run the paper does not configure."""
    return [
        {
            "metric": "sim_paper_open",
            "value": c["simulated"],
            "unit": s["unit"],
            "what": s["what"],
            "candidate": c["label"],
            "paper": s["paper"],
            "bound": s["bound"],
            "error": c["error"],
            "source": s["source"],
            "left_open": s["left_open"],
            "convention": conv,
            "chosen": conv == out["chosen"],
            "step_time_s": c["step_time_s"],
            "breakdown_s": c["breakdown_s"],
            "compute_scale": r["fit"]["value"],
            "device": out["device"],
            **{k: c[k] for k in ("micro_batch", "tp") if k in c},
        }
        for s in statements
        for c in s["candidates"]
    ]


def _batch_rows(fig: str, label: str, f: dict, conv: str, out: dict, r: dict, **extra) -> list[dict]:
    """A point simulated at the paper's micro-batch and at the planner's largest: one row each."""
    at = {
        "paper": (f["at_paper_batch"], f["micro_batch"]),
        "planner": (f["at_planner_batch"], f["planner_micro_batch"]),
    }
    return [
        _fig_row(fig, label, sim, conv, out, r, batch_from=k, micro_batch=b, **extra)
        for k, (sim, b) in at.items()
        if sim
    ]


def _fig_row(fig: str, label: str, sim: dict, conv: str, out: dict, r: dict, **extra) -> dict:
    tf = sim["hw_tflops_per_gpu" if conv == "hardware" else "tflops_per_gpu"]
    pf = sim["hw_pflops_aggregate" if conv == "hardware" else "pflops_aggregate"]
    return {
        "pflops_aggregate": pf,
        "metric": "sim_paper_tflops_per_gpu",
        "value": tf,
        "unit": f"TFLOP/s per GPU ({conv} FLOPs)",
        "figure": fig,
        "label": label,
        "convention": conv,
        "chosen": conv == out["chosen"],
        "step_time_s": sim["step_time_s"],
        "breakdown_s": sim["breakdown_s"],
        "compute_scale": r["fit"]["value"],
        "device": out["device"],
        **extra,
    }
