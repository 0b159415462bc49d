"""``zerobench zero-to-fp32``: a ``save_checkpoint`` directory (stage 3, bf16, 2 ranks) as one fp32 state dict that a
model without ZeRO loads strictly, as DeepSpeed's ``zero_to_fp32.py``; bad input is one line."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.test_cli_train import zb
from tests.helpers.dist import run_distributed
from tests.helpers.ds_export import TiedNet, saved_checkpoint


@pytest.mark.dist
def test_a_checkpoint_becomes_one_state_dict(tmp_path):
    sums = run_distributed(saved_checkpoint, 2, str(tmp_path / "ckpt"))[0]
    r = zb("zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {tmp_path / 'out' / 'pytorch_model.bin'}"
    sd = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True)
    TiedNet().load_state_dict(sd)  # strict: every key of the model, buffers and frozen layer included
    assert {str(v.dtype) for k, v in sd.items() if k != "bn.num_batches_tracked"} == {"torch.float32"}
    assert all(float(sd[n].double().sum()) == s for n, s in sums.items())  # the master, not its bf16 copy
    r = zb("zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "out2"), "--tag", "t", "--exclude-frozen-parameters")
    assert r.returncode == 0, r.stderr
    assert set(sd) - set(torch.load(tmp_path / "out2" / "pytorch_model.bin", weights_only=True)) == {
        "frozen.weight",
        "frozen.bias",
    }
    shard = tmp_path / "ckpt" / "t" / "shard-00001.pt"
    shard.write_bytes(shard.read_bytes()[:1000])  # a copy cut short
    r = zb("zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "out3"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"checkpoint file {shard} is damaged: " in r.stderr, r.stderr


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["{tmp}/none", "{tmp}/out"], "no checkpoint directory"),
        (["{tmp}", "{tmp}/out"], "no latest file in"),
        (["{tmp}", "{tmp}/out", "--tag", "global_step9"], "no checkpoint 'global_step9' in"),
    ],
)
def test_bad_input_is_one_line(tmp_path, argv, msg):
    r = zb("zero-to-fp32", *[a.format(tmp=tmp_path) for a in argv])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and msg in r.stderr, r.stderr
