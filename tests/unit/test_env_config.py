"""Distributed environment detection (torchrun / Slurm) and config validation."""

from __future__ import annotations

import pytest

from zerobench.config import ConfigError, config_hash
from zerobench.distributed.env import detect, first_host
from zerobench.zero import Precision, ZeroConfig


def test_torchrun_env():
    e = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "1234"})
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.master_port, e.source) == (
        3,
        8,
        1,
        "n1",
        1234,
        "torchrun",
    )


def test_slurm_env():
    # What srun sets in each task of a step (checked on a real Slurm: the batch script has no SLURM_STEP_ID).
    e = detect(
        {
            "SLURM_PROCID": "17",
            "SLURM_NTASKS": "400",
            "SLURM_LOCALID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_NODELIST": "dgx[007-031]",
            "SLURM_JOB_ID": "123456",
        }
    )
    assert (e.rank, e.world_size, e.local_rank, e.master_addr, e.source) == (17, 400, 1, "dgx007", "slurm")
    assert 29500 <= e.master_port < 39500 and e.launch_id == "123456.0"


def test_two_steps_of_a_job_and_jobs_10000_apart_get_ports_and_names_of_their_own():
    """The port was 29500 + job id mod 10000: two steps of one job started together shared it, and jobs 10000
    apart too. A rank of the second step joined the first's store and trained as its rank 1, recorded ok (a helper's
    review). The port now hashes the job and the step, and the store is keyed by both."""
    base = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n1"}
    envs = [
        detect({**base, "SLURM_JOB_ID": job, "SLURM_STEP_ID": step})
        for job, step in (("12345", "0"), ("12345", "1"), ("22345", "0"))
    ]
    assert len({e.master_port for e in envs}) == 3 and len({e.launch_id for e in envs}) == 3
    assert detect({**base, "SLURM_JOB_ID": "12345", "SLURM_STEP_ID": "0"}).master_port == envs[0].master_port
    assert detect({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "abc"}).launch_id == "abc"


def test_torchrun_wins_over_slurm():
    e = detect({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_NTASKS": "9"})
    assert e.source == "torchrun" and e.world_size == 2


@pytest.mark.parametrize(
    "nodelist,host",
    [
        ("node1", "node1"),
        ("gpu[003-005,9],cpu1", "gpu003"),
        ("a[1,3]", "a1"),
        ("x-y[10-12]", "x-y10"),
        ("rack[1-2]-node[01-02]", "rack1-node01"),  # was rack1: the name stopped at the first range
        ("rack[3,1]-n[07-09,01],login1", "rack3-n07"),
    ],
)
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


def test_rank_0_is_on_the_steps_first_node_not_the_jobs():
    """A step on part of the allocation (``node[03-04,07]`` of ``node[01-08]``) has rank 0 on node03: the job's
    first node was taken as the rendezvous host."""
    e = detect(
        {
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "3",
            "SLURM_STEP_ID": "2",
            "SLURM_JOB_NODELIST": "node[01-08]",
            "SLURM_STEP_NODELIST": "node[03-04,07]",
        }
    )
    assert e.master_addr == "node03"


@pytest.mark.parametrize("bad", ["", "a[1-2", "a]b", "a b"])
def test_a_node_list_that_is_not_one_is_one_line(bad):
    with pytest.raises(ValueError, match="cannot parse the Slurm node list"):
        first_host(bad)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "5", "WORLD_SIZE": "2"}, "rank 5 is outside a world of 2"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "rank -1 is outside a world of 2"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "world size must be >= 1"),
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "3"}, "local rank 3 does not fit rank 1"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT 70000 is not a TCP port"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n1"}, "not an srun step"),
        (
            {"SLURM_PROCID": "9", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n1"},
            "rank 9 is outside a world of 8",
        ),
    ],
)
def test_rank_environment_mistakes_are_refused_before_rendezvous(env, message):
    with pytest.raises(ConfigError) as e:
        detect(env)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_batch_script_with_one_task_is_a_single_process():
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1"}).source == "single"


def test_srun_step_size_is_the_step_s():
    e = detect(
        {
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "8",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_ID": "3",
            "SLURM_JOB_NODELIST": "n1",
        }
    )
    assert e.world_size == 2


def test_single_process_default():
    assert detect({}).source == "single"


def test_bad_env_value_is_one_line():
    with pytest.raises(ConfigError, match="RANK"):
        detect({"RANK": "x", "WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        ({"stage": 5}, "unknown ZeRO stage 5"),
        ({"bucket_numel": 0}, "bucket size"),
        ({"grad_accum_steps": 0}, "accumulation"),
        ({"clip_grad_norm": -1.0}, "clip norm"),
        ({"precision": "fp8"}, "unknown precision 'fp8': choose fp32, bf16 or fp16"),
    ],
)
def test_zero_config_validation(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        ZeroConfig(**kwargs).validate()


def test_precision_by_its_name_is_the_recipe():
    """``ZeroConfig(precision="bf16")`` as the suites and the CLI spell it; before: ``unknown precision 'bf16':
    choose fp32, bf16 or fp16``, which named the value it refused as one of the choices."""
    for name in ("fp32", "bf16", "FP16"):
        cfg = ZeroConfig(precision=name)
        cfg.validate()
        assert cfg.precision is Precision(name.lower()) and config_hash(cfg) == config_hash(
            ZeroConfig(precision=Precision(name.lower()))
        )


def test_config_hash_is_stable_and_sensitive():
    a, b = ZeroConfig(stage=1), ZeroConfig(stage=1)
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(ZeroConfig(stage=2))
    assert config_hash(ZeroConfig(precision=Precision.BF16)) != config_hash(ZeroConfig())


def test_launchers_share_one_interface():
    """local, srun and sbatch are Launchers of one interface (launch/launchers.py); an unknown name is one line."""
    from zerobench.config import ConfigError
    from zerobench.launch.launchers import LAUNCHERS, get_launcher

    assert set(LAUNCHERS) == {"local", "srun", "sbatch"}
    for name, launcher in LAUNCHERS.items():
        assert callable(launcher.launch)
        assert launcher.name == name and get_launcher(name) is launcher
    with pytest.raises(ConfigError, match="unknown launcher 'ssh': choose local, srun, sbatch"):
        get_launcher("ssh")


def test_env_rank_without_local_rank_takes_slurm_s_local_id():
    """torch's env:// needs only RANK and WORLD_SIZE: a user who sets them inside srun tasks got local rank 0 on every
    task, so every rank of a node took cuda:0 (a helper's review). Slurm's local id is taken where LOCAL_RANK is
    not set."""
    e = detect({"RANK": "5", "WORLD_SIZE": "8", "SLURM_LOCALID": "1", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"})
    assert (e.rank, e.local_rank, e.source) == (5, 1, "torchrun")
    assert detect({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "SLURM_LOCALID": "1"}).local_rank == 3


def test_a_batch_script_s_refusal_names_a_way_that_works():
    from zerobench.config import ConfigError

    with pytest.raises(ConfigError, match=r"not an srun step.*run it with SLURM_NTASKS=1") as e:
        detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert "\n" not in str(e.value)
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).source == "single"  # what it suggests: local ranks
