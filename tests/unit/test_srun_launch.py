"""The srun launcher's pure parts, without Slurm: who a failed step blames, how a step is laid out on the
allocation, and which rendezvous port it takes (``tests/slurm`` runs them on a real Slurm)."""

from __future__ import annotations

import pytest

from zerobench.launch import slurm
from zerobench.launch.channel import RankFile


def _ends(tmp_path, *lines_per_rank):
    d = tmp_path / "ranks"
    d.mkdir()
    for rank, lines in enumerate(lines_per_rank):
        (d / f"rank{rank}").write_text("".join(f"{t:.6f} {m}\n" for t, m in lines))
    return d


def test_the_first_rank_to_fail_is_blamed_with_its_own_code(tmp_path):
    reports = _ends(
        tmp_path,
        [(20.0, "error rank 0 lost its connection to a peer rank in a collective: the peer died"), (20.1, "exit 1")],
        [(10.0, "error rank 1 ran out of memory: CUDA out of memory"), (10.2, "exit 75")],
    )
    log = tmp_path / "run.log"
    log.write_text("srun: error: n1: task 1: Exited with exit code 75\nsrun: error: n1: task 0: Terminated\n")
    assert slurm.blame(reports, log, 143) == ("oom", "rank 1 ran out of memory: CUDA out of memory", 75)


def test_a_rank_that_died_without_a_word_is_blamed_from_sruns_line(tmp_path):
    reports = _ends(tmp_path, [(5.0, "error RuntimeError: Connection reset by peer"), (5.1, "exit 1")])
    log = tmp_path / "run.log"
    log.write_text("srun: error: n1: task 1: Exited with exit code 17\nsrun: error: n1: task 0: Terminated\n")
    assert slurm.blame(reports, log, 143) == ("failed", "rank 1 exited with code 17", 17)
    log.write_text("srun: error: n2: task 1: Killed\n")
    assert slurm.blame(reports, log, 137)[:2] == ("failed", "rank 1 ended: killed (srun)")


def test_with_nothing_said_the_step_is_blamed_with_sruns_code(tmp_path):
    (tmp_path / "ranks").mkdir()
    log = tmp_path / "run.log"
    log.write_text("")
    assert slurm.blame(tmp_path / "ranks", log, 1) == ("failed", "srun step exited with code 1", 1)


def test_a_rank_file_keeps_its_first_error_and_its_code(tmp_path):
    f = RankFile(tmp_path, 3)
    f.error("rank 3 could not write its results")
    f.error("a later line")
    f.exited(74)
    (end,) = slurm.read_rank_files(tmp_path)
    assert (end.rank, end.error, end.code, end.done) == (3, "rank 3 could not write its results", 74, False)


@pytest.mark.parametrize(
    "world, per_node, want",
    [
        (2, "2(x2)", ["--ntasks=2", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=6"]),
        (64, "16(x25)", ["--ntasks=64", "--nodes=4", "--ntasks-per-node=16", "--cpus-per-task=6"]),
        (24, "16(x25)", ["--ntasks=24", "--nodes=2", "--ntasks-per-node=16", "--cpus-per-task=6"]),
        (3, "2,1", ["--ntasks=3", "--cpus-per-task=6"]),
    ],
)
def test_a_step_takes_whole_nodes_and_the_jobs_cpus_per_task(monkeypatch, world, per_node, want):
    """Without --nodes, srun spread a step smaller than the allocation one task per node, so a TP group of 16 in a
    400-GPU job crossed nodes; and Slurm 22.05-23.02's srun does not take the job's --cpus-per-task."""
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", per_node)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert slurm.step_layout(world) == want


def test_steps_of_two_jobs_take_different_ports(monkeypatch):
    """Every step took 29500 + its index, so two jobs sharing a node took the same port."""
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    a = [slurm.step_port(i) for i in range(3)]
    monkeypatch.setenv("SLURM_JOB_ID", "1235")
    b = [slurm.step_port(i) for i in range(3)]
    assert len(set(a)) == 3 and not set(a) & set(b) and all(20000 <= p < 32768 for p in a + b)


class _Slurm:
    """``subprocess.run`` for the Slurm commands: each answer in turn (an int is a failure with that code)."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, cmd, **kw):
        import subprocess

        self.calls.append(cmd)
        a = self.answers.pop(0)
        if isinstance(a, int):
            return subprocess.CompletedProcess(cmd, a, "", "slurm_load_jobs error: Socket timed out on send/recv")
        return subprocess.CompletedProcess(cmd, 0, a, "")


def test_a_failed_query_is_asked_again_before_it_counts(monkeypatch):
    """One failed scontrol read as 'UNKNOWN', which was final: a job that went on to complete was recorded failed."""
    fake = _Slurm(1, 1, "JobId=7 JobState=COMPLETED ExitCode=0:0")
    monkeypatch.setattr(slurm.subprocess, "run", fake)
    monkeypatch.setattr(slurm.time, "sleep", lambda s: None)
    assert slurm.job_state("7") == ("COMPLETED", "0:0") and len(fake.calls) == 3
    fake = _Slurm(*[1] * 5)
    monkeypatch.setattr(slurm.subprocess, "run", fake)
    state, code = slurm.job_state("7")
    assert state == "UNKNOWN" and len(fake.calls) == 5
    assert slurm.status_of(state, code) == (
        "failed",
        "Slurm no longer reports the job (scontrol show job failed): how it ended is not known",
    )


def test_a_slurm_failure_is_one_line_of_slurms_own(monkeypatch):
    monkeypatch.setattr(
        slurm.subprocess,
        "run",
        lambda cmd, **kw: slurm.subprocess.CompletedProcess(
            cmd, 1, "", "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"
        ),
    )
    with pytest.raises(slurm.SlurmCommandFailed) as e:
        slurm._run(["sbatch", "--parsable", "x.sh"])
    assert str(e.value) == (
        "sbatch --parsable failed: sbatch: error: Batch job submission failed: Requested node configuration is not "
        "available"
    )


@pytest.mark.parametrize(
    "launcher, gpus, words",
    [("local", 1, "--gpus-per-task is what each job of --launcher slurm requests"), ("slurm", -1, "0 or more")],
)
def test_gpus_per_task_belongs_to_the_slurm_launcher(tmp_path, launcher, gpus, words):
    from zerobench.bench import suite
    from zerobench.bench.runner import run_sweep
    from zerobench.config import ConfigError

    with pytest.raises(ConfigError, match=words):
        run_sweep(suite.load("cpu/quick"), tmp_path / "out", launcher=launcher, gpus_per_task=gpus)


@pytest.mark.parametrize(
    "state, code, want",
    [
        ("PREEMPTED", "0:15", "cancelled"),
        ("DEADLINE", "0:0", "timeout"),
        ("FAILED", "2:0", "invalid"),
        ("FAILED", "75:0", "oom"),
        ("NODE_FAIL", "0:0", "failed"),
    ],
)
def test_slurm_states_read_as_the_other_launchers_statuses(state, code, want):
    assert slurm.status_of(state, code)[0] == want


def test_a_failed_job_blames_its_first_failing_rank(tmp_path):
    """run_one.sh's srun exits 143 for a rank 1 that ran out of memory; the job read 'failed, exit code 143'."""
    _ends(tmp_path, [], [(3.0, "error rank 1 ran out of memory: CUDA out of memory"), (3.1, "exit 75")])
    (tmp_path / "slurm-9.out").write_text("srun: error: n1: task 1: Exited with exit code 75\n")
    assert slurm.status_of("FAILED", "143:0", tmp_path, "9") == (
        "oom",
        "rank 1 ran out of memory: CUDA out of memory (Slurm state FAILED, exit code 143:0)",
    )


@pytest.mark.parametrize(
    "text, kind",
    [
        ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
        (
            "NCCL error in: ProcessGroupNCCL.cpp:1270, unhandled cuda error, NCCL version 2.21.5\nCUDA error: out of memory",
            "oom",
        ),
        ("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory", "oom"),
        ("Connection reset by peer", "peer"),
        ("Watchdog caught collective operation timeout", "timeout"),
        ("shape mismatch", None),
    ],
)
def test_a_device_allocation_outside_the_caching_allocator_is_out_of_memory(text, kind):
    """cuBLAS's workspace and NCCL's buffers fail as RuntimeErrors, not torch.OutOfMemoryError: a maxsize probe that
    ran out of memory there aborted the search as a run failure instead of reading 'does not fit'."""
    from zerobench.launch.worker import classify

    assert classify(RuntimeError(text)) == kind
