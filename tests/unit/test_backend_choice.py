"""Which process-group backend a rank initialises (``distributed/env.py``): NCCL where every rank of a node has
a GPU of its own, gloo on CPU and where ranks share a GPU (issue 23: several ranks on one card), decided alike
on every rank from the job's layout; what cannot work is one line before any rendezvous."""

from __future__ import annotations

import pytest
import torch

from zerobench.config import ConfigError
from zerobench.distributed.env import choose_backend, detect, tasks_per_node

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.mark.parametrize(
    ("requested", "device", "local", "gpus", "chosen"),
    [
        ("auto", CPU, 4, 0, "gloo"),
        ("gloo", CPU, None, 0, "gloo"),
        ("auto", CUDA, 8, 8, "nccl"),  # one GPU per rank
        ("auto", CUDA, None, 1, "nccl"),  # layout unknown: as torch's default
        ("auto", CUDA, 2, 1, "gloo"),  # two ranks share the card
        ("auto", CUDA, 16, 8, "gloo"),
        ("gloo", CUDA, 8, 8, "gloo"),
        ("nccl", CUDA, 4, 8, "nccl"),
    ],
)
def test_the_backend_follows_the_layout(requested, device, local, gpus, chosen):
    assert choose_backend(requested, device, local, gpus) == chosen


@pytest.mark.parametrize(
    ("requested", "device", "local", "gpus", "message"),
    [
        ("nccl", CPU, 2, 0, "--backend nccl needs CUDA devices and this process has none: use --backend gloo or auto"),
        (
            "nccl",
            CUDA,
            2,
            1,
            "--backend nccl needs one GPU per rank: 2 ranks on this node share 1 GPU(s); use --backend gloo",
        ),
        ("mpi", CPU, 1, 0, "unknown backend 'mpi': choose auto, nccl, gloo"),
    ],
)
def test_a_backend_that_cannot_work_is_one_line(requested, device, local, gpus, message):
    with pytest.raises(ConfigError) as e:
        choose_backend(requested, device, local, gpus)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize(("value", "count"), [("4", 4), ("4(x2)", 4), ("8(x3),8", 8), ("2,1", None), ("", None)])
def test_slurm_tasks_per_node(value, count):
    assert tasks_per_node(value) == count


def test_the_local_world_size_comes_from_the_launcher():
    assert detect({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}).local_world_size == 2
    assert detect({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}).local_world_size is None
    slurm = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "3",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "gpu[1-2]",
    }
    assert detect({**slurm, "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}).local_world_size == 4
    assert detect({**slurm, "SLURM_TASKS_PER_NODE": "5,3"}).local_world_size is None
    assert detect({}).local_world_size == 1


@pytest.mark.parametrize(("per_task", "chosen"), [(1, "nccl"), (None, "gloo"), (2, "gloo")])
def test_slurm_s_gpus_per_task_binding_is_no_sharing(per_task, chosen):
    """``sweep --launcher slurm --gpus-per-task 1`` binds each task to its own GPU, so a task sees one of the node's
    four: read as four ranks sharing one card, it trained on gloo instead of NCCL, silently (a helper's review).
    ``SLURM_GPUS_PER_TASK`` says each task's GPUs are its own (2 per task with 1 visible is still a share)."""
    assert choose_backend("auto", CUDA, 4, 1, per_task) == chosen
    if per_task == 1:
        assert choose_backend("nccl", CUDA, 4, 1, per_task) == "nccl"
