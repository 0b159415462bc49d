"""What ``initialize(mpu=...)`` refuses before any group is used: an mpu beside ``dp_group=``, an mpu with pipeline
stages, and an object without DeepSpeed's getters, each in one line."""

from __future__ import annotations

import pytest

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.mpu import mpu_groups


class _Pipelined:
    def get_pipeline_model_parallel_world_size(self):
        return 2

    def get_model_parallel_group(self):
        raise AssertionError("not read")

    def get_data_parallel_group(self):
        raise AssertionError("not read")


@pytest.mark.parametrize(
    "mpu, dp_group, words",
    [
        (_Pipelined(), None, "mpu= has 2 pipeline stages; zerobench has no pipeline parallelism"),
        (object(), None, "mpu= (object) has no get_model_parallel_group()"),
        (_Pipelined(), object(), "give the data-parallel group once"),
    ],
    ids=["pipeline", "no-getters", "twice"],
)
def test_an_mpu_zerobench_cannot_take_is_one_line(mpu, dp_group, words):
    with pytest.raises(ConfigError) as err:
        mpu_groups(mpu, dp_group)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_without_an_mpu_the_groups_are_the_dp_group_alone():
    marker = object()
    assert mpu_groups(None, marker) == (marker, None)
