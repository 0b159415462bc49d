"""``zerobench train``'s flags that say one thing and ran another: an explicit flag that conflicts with
``--paper-config`` is refused in one line (``--paper-config C1 --stage 3`` ran stage 1, ``C1 --pa`` ran C2), and
flags the run would not use are refused rather than dropped. Nothing trains: the resolved configuration is caught
where the run would start."""

from __future__ import annotations

import pytest

from zerobench.cli import main, training


@pytest.fixture
def resolved(monkeypatch, tmp_path):
    """``train``'s argv -> (exit code, the TrainConfig it would run or None); the run itself is not started."""
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    seen = []
    monkeypatch.setattr(training, "_train_into", lambda cfg, *a: seen.append(cfg) or 0)

    def run(*argv):
        seen.clear()
        code = main(["train", "--steps", "2", "--warmup", "1", "--out", str(tmp_path / "out"), *argv])
        return code, (seen[0] if seen else None)

    return run


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--paper-config", "C1", "--stage", "3"], "--stage 3 conflicts with --paper-config C1 (P_os + C_B + M_D), "),
        (["--paper-config", "C3", "--stage", "0"], "which is stage 2: drop --stage, or drop --paper-config"),
        (["--paper-config", "C1", "--pa"], "--pa conflicts with --paper-config C1 (P_os + C_B + M_D), which runs "),
        (["--paper-config", "C3", "--pa"], "drop --pa, or choose C4 or C5, which has it"),
        (["--paper-config", "C4", "--pa-cpu"], "runs without P_a+cpu: drop --pa-cpu, or choose C5, which has it"),
    ],
)
def test_a_flag_that_conflicts_with_the_paper_config_is_refused(resolved, capsys, argv, needle):
    code, cfg = resolved(*argv)
    assert code == 2 and cfg is None
    assert needle in _one_line(capsys)


def test_flags_that_agree_with_the_paper_config_and_defaults_still_work(resolved):
    _, c1 = resolved("--paper-config", "C1")
    assert (c1.zero.stage, c1.activation.contiguous, c1.activation.checkpoint, c1.activation.partition) == (
        1,
        True,
        True,
        False,
    )
    _, same = resolved("--paper-config", "C1", "--stage", "1", "--md", "--checkpoint-activations")
    assert same == c1
    _, c5 = resolved("--paper-config", "C5", "--stage", "2", "--pa", "--pa-cpu")
    assert (c5.zero.stage, c5.activation.partition, c5.activation.cpu_offload) == (2, True, True)
    _, plain = resolved()
    assert plain.zero.stage == 0 and not plain.activation.checkpoint
    assert resolved("--stage", "3")[1].zero.stage == 3


def test_nvme_path_without_nvme_offload_is_refused(resolved, capsys, tmp_path):
    """``--nvme-path`` with another optimizer offload was dropped without a word: the run kept its states elsewhere."""
    for offload in ([], ["--stage", "2", "--offload-optimizer", "cpu"]):
        code, cfg = resolved(*offload, "--nvme-path", str(tmp_path / "nvme"))
        assert code == 2 and cfg is None
        line = _one_line(capsys)
        assert "is where --offload-optimizer nvme keeps the optimizer states" in line
        assert f"optimizer offload is {'cpu' if offload else 'none'}: add --offload-optimizer nvme, or drop" in line
    code, cfg = resolved("--stage", "2", "--offload-optimizer", "nvme", "--nvme-path", str(tmp_path / "nvme"))
    assert code == 0 and (cfg.zero.offload_optimizer, cfg.zero.nvme_path) == ("nvme", str(tmp_path / "nvme"))


def test_maxsize_and_suites_refuse_nvme_path_without_nvme_offload(tmp_path, capsys):
    """The same resolver checks maxsize's flags and a suite's keys."""
    code = main(["maxsize", "--budget", "8MiB", "--stage", "2", "--dp", "1", "--nvme-path", str(tmp_path)])
    assert code == 2 and "drop --nvme-path" in _one_line(capsys)
    p = tmp_path / "s.yaml"
    p.write_text("base: {preset: tiny, steps: 2, warmup: 1, dp: 1}\nruns:\n- {stage: 2, nvme_path: /tmp/x}\n")
    assert main(["sweep", str(p), "--check"]) == 2
    assert "is where --offload-optimizer nvme keeps the optimizer states" in capsys.readouterr().err


def test_sequence_parallelism_at_tp_1_is_refused(resolved, capsys):
    """At TP 1 there is no group to split the sequence over: the run went without SP and was recorded as
    ``sequence_parallel: true``. Megatron-LM turns it off there; no suite relies on it, so it is refused."""
    code, cfg = resolved("--sp")
    assert code == 2 and cfg is None
    assert "--sp splits the sequence over the TP group, and at --tp 1 there is none" in _one_line(capsys)
    code, cfg = resolved("--sp", "--tp", "2")
    assert code == 0 and cfg.sequence_parallel and cfg.tp == 2
