"""``zerobench peers`` smoke run (CI): 2 processes, zerobench stages next to torch's peers (DeepSpeed too
when installed), one round; rows, the table, loss parity with one process, and the report section."""

import subprocess
import sys

import pytest

from zerobench.peers.registry import deepspeed_available
from zerobench.results.rows import read_rows

pytestmark = pytest.mark.dist


@pytest.mark.slow
def test_peers_smoke_writes_summary_rows_and_reports_them(tmp_path):
    systems = [
        "zerobench-0",
        "zerobench-2",
        "zerobench-3",
        "torch-ddp",
        "torch-zero1",
        "fsdp1-shard-grad-op",
        "fsdp2",
    ] + ([f"deepspeed-{s}" for s in range(4)] if deepspeed_available() else [])
    out = tmp_path / "peers"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerobench",
            "peers",
            "--systems",
            *systems,
            "--dp",
            "2",
            "--rounds",
            "1",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_rows(out / "summary")
    by = {(r["candidate"], r["metric"]): r["value"] for r in rows}
    for s in systems:
        assert by[(s, "peer_step_time_s")] > 0
        assert by[(s, "peer_peak_live_bytes")] > 0
        # every system trains the same model on the same global batch as one process does: fp32 rounding keeps the
        # losses within 1e-6 of it; an FSDP1 that missed the weight decay stood at 2.2e-5, which 1e-4 let pass
        assert by[(s, "peer_loss_max_abs_diff")] < 1e-5, (s, by[(s, "peer_loss_max_abs_diff")])
    assert by[("torch-ddp", "peer_time_vs_torch_ddp")] == 1.0
    # the memory run breaks its highest sampled RSS down: tensors at least the live peak's resident part,
    # and the categories add up to no more than the VmHWM peak (a sample is taken between operators)
    for s in systems:
        cats = {c: by[(s, f"peer_rss_{c}_bytes")] for c in ("tensors", "libraries", "heap", "native", "other")}
        assert cats["tensors"] > 0 and cats["libraries"] > 0, (s, cats)
        assert sum(cats.values()) <= by[(s, "peer_peak_rss_bytes")] + (1 << 20), (s, cats)
    assert "highest sampled RSS by category" in proc.stdout
    assert "zerobench-2 " in proc.stdout and "fastest peer" in proc.stdout
    rep = subprocess.run(
        [sys.executable, "-m", "zerobench", "report", str(out), "--out", str(tmp_path / "rep")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "zerobench vs peers" in md and "fsdp1-shard-grad-op" in md
    (fig,) = (tmp_path / "rep").glob("figures-*/peers.png")
    assert (
        fig.stat().st_size > 10_000
        and f'src="{fig.parent.name}/peers.png"' in (tmp_path / "rep" / "index.html").read_text()
    )


@pytest.mark.slow  # DeepSpeed builds its CPU Adam (C++) on first use: about a minute on 2 cores
@pytest.mark.skipif(not deepspeed_available(), reason="DeepSpeed is not installed (optional peer)")
def test_deepspeed_offload_peer_trains_bf16_with_checkpointing_like_zerobench(tmp_path):
    """The setup of the one-card offload comparison (bf16, activation checkpointing, optimizer offload),
    on 2 CPU processes: DeepSpeed's ZeRO-Offload and zerobench's train the same model to the same losses
    within bf16's precision (3 steps)."""
    common = [
        "--precision",
        "bf16",
        "--checkpoint-activations",
        "--dp",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--no-track-memory",
    ]
    losses = {}
    for name, args in [
        ("deepspeed", ["--system", "deepspeed-2-offload"]),
        ("zerobench", ["--stage", "2", "--offload-optimizer", "cpu"]),
    ]:
        out = tmp_path / name
        r = subprocess.run(
            [sys.executable, "-m", "zerobench", "train", *args, *common, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        losses[name] = [row["value"] for row in read_rows(out) if row["metric"] == "loss"]
    assert len(losses["deepspeed"]) == 3, losses
    assert max(abs(a - b) for a, b in zip(losses["deepspeed"], losses["zerobench"], strict=True)) < 1e-2, losses


@pytest.mark.slow  # the CPU Adam build, as above
@pytest.mark.skipif(not deepspeed_available(), reason="DeepSpeed is not installed (optional peer)")
def test_deepspeed_peer_trains_in_one_process_without_a_launcher(tmp_path):
    """``zerobench train --system deepspeed-*`` in one process (the one-card comparison's setup): no
    torchrun, so no LOCAL_RANK, which DeepSpeed's initialize asserts on unless zerobench supplies it."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    out = tmp_path / "one"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerobench",
            "train",
            "--system",
            "deepspeed-2-offload",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shards as stage 2" in r.stdout
    rows = read_rows(out)
    assert len([row for row in rows if row["metric"] == "loss"]) == 2
    # ZeRO-Offload's ledger, measured from DeepSpeed's tensors: fp32 params on the device (4 B/param); its
    # fp32 gradient partition, master copy and Adam moments on the host (4 + 4 + 8 B/param)
    by = {row["metric"]: row["value"] for row in rows if row.get("step") is None}
    psi = by["num_params"]
    assert by["memory_master_bytes"] == 0 and by["memory_optimizer_states_bytes"] == 0
    assert by["model_state_bytes"] == pytest.approx(4 * psi, rel=0.01)
    assert by["memory_host_master_bytes"] == pytest.approx(4 * psi, rel=0.01)
    assert by["memory_host_grads_bytes"] == pytest.approx(4 * psi, rel=0.01)
    assert by["memory_host_optimizer_states_bytes"] == pytest.approx(8 * psi, rel=0.01)
    assert by["host_model_state_bytes"] == pytest.approx(16 * psi, rel=0.01)


@pytest.mark.slow  # torch.compile of the blocks: half a minute to a minute and a half on 2 CPU cores
@pytest.mark.parametrize("precision, bound", [("fp32", 1e-4), ("bf16", 2e-3)])
def test_the_single_card_tables_torch_peers_train_like_torch_ddp_at_a_world_of_one(tmp_path, precision, bound):
    """The single-card table's setup (``scripts/gpu_first.sh``: ``--dp 1``, bf16) on CPU: FSDP2 eager and with
    each block compiled train the tiny GPT to torch-ddp's losses (in bf16 each with its own mixed precision: DDP
    under autocast, FSDP2 with bf16 compute and fp32 reduction), and zerobench's stages too."""
    systems = ["zerobench-0", "zerobench-3", "torch-ddp", "fsdp2", "fsdp2-compiled"]
    out = tmp_path / "peers"
    args = ["--systems", *systems, "--dp", "1", "--precision", precision, "--rounds", "1", "--steps", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "zerobench", "peers", *args, "--warmup", "1", "--no-memory-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by = {(r["candidate"], r["metric"]): r["value"] for r in read_rows(out / "summary")}
    for s in systems:
        assert by[(s, "peer_step_time_s")] > 0 and by[(s, "peer_model_flops_per_step")] > 0
        assert by[(s, "peer_loss_max_abs_diff")] < bound, s
        assert (s, "peer_mfu") not in by  # a CPU has no stated peak
    assert by[("torch-ddp", "peer_loss_max_abs_diff")] == 0.0  # the reference is torch-ddp's configuration
    configs = {r["config"]["system"]: r["config"]["zero"]["precision"] for r in read_rows(out / "r0-fsdp2-compiled")}
    assert configs == {"fsdp2-compiled": precision}
