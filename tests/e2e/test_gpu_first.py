"""``scripts/gpu_first.sh``'s torchrun, table and Slurm sections on a CPU (``GPU_FIRST_SMOKE=1``: tiny sizes), the
same commands a lent GPU runs at real sizes: each section passes and leaves its archive with the rows in it."""

from __future__ import annotations

import shutil
import tarfile

import pytest

from tests.unit.test_gpu_first import run_smoke
from zerobench.results.rows import read_rows

pytestmark = pytest.mark.dist


def _extract(tmp_path, section: str):
    with tarfile.open(tmp_path / f"{section}.tgz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    return tmp_path / "x" / section


@pytest.mark.slow  # two torchrun launches and a five-system comparison, one compiled: about 2.5 minutes on 2 cores
def test_torchrun_and_table_sections_smoke(tmp_path):
    r = run_smoke(tmp_path, "torchrun", "table", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["torchrun", "table"] and all(" ok in " in s for s in summary)
    torchrun = _extract(tmp_path, "torchrun")
    for st in (0, 3):
        rows = read_rows(torchrun / f"s{st}")
        assert len([x for x in rows if x["metric"] == "loss"]) == 3 and rows[0]["config"]["dp"] == 2
    table = _extract(tmp_path, "table")
    by = {(x["candidate"], x["metric"]): x for x in read_rows(table / "1.3b-smoke" / "summary")}
    for s in ("zerobench-0", "zerobench-3", "zerobench-3-compiled", "torch-ddp", "fsdp2"):
        assert by[(s, "peer_step_time_s")]["value"] > 0 and by[(s, "peer_step_time_s")]["config"]["peers"]["dp"] == 1
        assert by[(s, "peer_step_time_s")]["config"]["peers"]["precision"] == "bf16"


@pytest.mark.slurm
@pytest.mark.slow  # starts and stops a local Slurm cluster: about 16 s
@pytest.mark.skipif(not shutil.which("sbatch"), reason="Slurm is not installed: run tests/setup-tools.sh (as root)")
def test_slurm_section_smoke_submits_with_a_gres_and_stops_the_cluster(tmp_path):
    r = run_smoke(tmp_path, "slurm", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    slurm = _extract(tmp_path, "slurm")
    job = (slurm / "job.txt").read_text()
    assert "JobState=COMPLETED" in job and "gres:gpu:1" in job
    assert "Name=gpu" in (slurm / "gres.conf").read_text() and "GresTypes=gpu" in (slurm / "slurm.conf").read_text()
    # pinned: on a cgroup-v2 host without D-Bus (the lent H200) slurmd's autodetected cgroup/v2 failed to start
    assert (slurm / "cgroup.conf").read_text().split() == ["CgroupPlugin=cgroup/v1"]
    rows = [x for p in (slurm / "results").rglob("rows.jsonl") for x in read_rows(p.parent)]
    assert {x["status"] for x in rows if x["metric"] == "run_status"} == {"ok"}
    assert "local Slurm stopped" in r.stdout
