"""``--only``: a key given twice names alternatives (it kept the last value only, running a part of what was
asked without a word), a key no run has is named, and ``sweep --check`` runs the sweep's own checks with its
options, so a check passes only where the sweep would start."""

from __future__ import annotations

import pytest

from zerobench.bench import suite as suites
from zerobench.bench.runner import matching_runs, parse_only, selected
from zerobench.cli import main
from zerobench.config import ConfigError


@pytest.fixture(autouse=True)
def _away_from_the_checkout(tmp_path, monkeypatch):
    """``sweep --check`` checks the sweep's default ``--out`` (``runs/<suite name>``) in the working directory: the
    checkout's own earlier sweeps there must not decide these checks."""
    monkeypatch.chdir(tmp_path)


def test_a_repeated_key_is_alternatives():
    s = suites.load("cpu/quick")
    only = parse_only(["stage=1", "stage=2", "dp=4"])
    assert only == {"stage": frozenset({"1", "2"}), "dp": frozenset({"4"})}
    runs = matching_runs(s, only)
    assert sorted((r.spec.stage, r.spec.dp) for r in runs) == [(1, 4), (2, 4)]
    assert len(selected(s, parse_only(["stage=1", "stage=2"])).runs) == 6
    assert selected(s, {}) is s
    assert len(selected(s, {"stage": "3"}).runs) == 3  # a key's one value as a plain string


def test_label_matches_the_runs_unique_label():
    s = suites.load("cpu/quick")
    label = s.runs[4].label
    assert [r.label for r in matching_runs(s, parse_only([f"label={label}"]))] == [label]


@pytest.mark.parametrize(
    "items, needle",
    [
        (["stage"], "--only takes KEY=VALUE, got 'stage'"),
        (["=1"], "--only takes KEY=VALUE, got '=1'"),
    ],
)
def test_items_without_a_key_and_value_are_refused(items, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_only(items)


def test_no_match_names_the_unknown_key():
    s = suites.load("cpu/quick")
    with pytest.raises(ConfigError) as e:
        matching_runs(s, parse_only(["stagee=1"]))
    msg = str(e.value)
    assert "no run matches stagee=1: a run has no key 'stagee'" in msg and "stage," in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=r"no run matches stage=7\|9$"):
        matching_runs(s, parse_only(["stage=9", "stage=7"]))


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("zerobench: warning")]
    assert len(err) == 1, err
    return err[0]


def test_sweep_check_counts_what_only_selects(capsys):
    assert main(["sweep", "cpu/quick", "--check", "--only", "stage=1", "--only", "stage=2"]) == 0
    assert "6 of 12 runs (selected by --only), all valid" in capsys.readouterr().out
    assert main(["sweep", "cpu/quick", "--check", "--only", "nokey=1"]) == 2
    assert "no run matches nokey=1: a run has no key 'nokey'" in _one_line(capsys)


def test_sweep_check_takes_the_launcher_options(capsys, monkeypatch):
    """A cluster suite is checked for the launcher it will run under, not refused for the local launcher's limit;
    an option the sweep would refuse fails the check too."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["sweep", "paper/fig3", "--check", "--launcher", "slurm", "--gpus-per-task", "1"]) == 0
    capsys.readouterr()
    assert main(["sweep", "paper/fig3", "--check"]) == 2
    assert "the local launcher runs at most 16" in _one_line(capsys)
    assert main(["sweep", "cpu/quick", "--check", "--gpus-per-task", "1"]) == 2
    assert "--gpus-per-task is what each job of --launcher slurm requests" in _one_line(capsys)
    assert main(["sweep", "cpu/quick", "--check", "--launcher", "srun"]) == 2
    assert "runs inside a Slurm allocation" in _one_line(capsys)


def test_the_ab_gate_checks_only_before_any_checkout(capsys):
    code = main(["regress", "--ab", "cpu/quick", "--baseline-tree", ".", "--only", "stage=9"])
    assert code == 2 and "no run matches stage=9" in _one_line(capsys)


def test_the_ab_gate_refuses_alternatives(capsys):
    """Each side sweeps with its own code: a baseline from before alternatives would run the last value only, and the
    gate would blame the other side's extra runs on a failure."""
    code = main(["regress", "--ab", "cpu/quick", "--baseline-tree", ".", "--only", "stage=1", "--only", "stage=2"])
    assert code == 2 and "--ab --only stage: one value per key" in _one_line(capsys)


def test_check_and_warnings_are_about_the_selected_runs(tmp_path, capsys):
    """An invalid run or a duplicate that --only leaves out is not this sweep's: the check passes, without warnings."""
    p = tmp_path / "mixed.yaml"
    p.write_text(
        "base: {preset: tiny, steps: 2, warmup: 1, dp: 1}\n"
        "runs:\n"
        "- {label: good, stage: 1}\n"
        "- {label: bad, stage: 2, system: megatron}\n"
        "- {label: pa, stage: 3, pa: true}\n"
        "- {label: pa-ckpt, stage: 3, pa: true, checkpoint_activations: true}\n"
    )
    assert main(["sweep", str(p), "--check"]) == 2
    err = capsys.readouterr().err
    assert "run 1 (bad) is invalid" in err and "resolve to one configuration" in err
    assert main(["sweep", str(p), "--check", "--only", "stage=1"]) == 0
    io = capsys.readouterr()
    assert "zerobench: warning" not in io.err and "1 of 4 runs (selected by --only), all valid" in io.out


def test_entries_resolving_to_one_configuration_are_warned(tmp_path, capsys):
    """Two entries that differ only where resolution overrides them (P_a implies activation checkpointing) are one
    configuration: the sweep measured it twice without a word, and the gate then refused the sweep as a baseline."""
    p = tmp_path / "twice.yaml"
    p.write_text(
        "base: {preset: tiny, steps: 2, warmup: 1, stage: 1, dp: 1}\n"
        "runs:\n"
        "- {label: pa, pa: true}\n"
        "- {label: pa-ckpt, pa: true, checkpoint_activations: true}\n"
        "- {label: plain}\n"
    )
    from zerobench.bench.runner import same_configurations

    assert same_configurations(suites.load(p)) == [["pa", "pa-ckpt"]]
    assert main(["sweep", str(p), "--check"]) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("zerobench: warning")]
    assert len(warn) == 1 and "runs 'pa', 'pa-ckpt' resolve to one configuration" in warn[0], warn
    assert same_configurations(suites.load("cpu/quick")) == []


def _write(tmp_path, text: str):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return suites.load(p)


def test_only_matches_the_value_a_run_resolves_to(tmp_path):
    """A key a run leaves to the default is matched by the value the run resolves to: ``--only dp=1`` took only the
    runs that spelled ``dp: 1`` out, and on a suite that never does said no run matches."""
    s = _write(
        tmp_path,
        "name: onlydp\nbase: {preset: tiny, steps: 2, warmup: 1}\nruns:\n"
        "- {label: a, stage: 0}\n- {label: b, stage: 1, dp: 1}\n- {label: c, stage: 2, tp: 1}\n"
        "- {label: d, stage: 1, gpus: 4, tp: 2}\n",
    )
    labels = lambda only: [r.label for r in matching_runs(s, parse_only(only))]  # noqa: E731
    assert labels(["dp=1"]) == ["a", "b", "c"]
    assert labels(["tp=1"]) == ["a", "b", "c"]
    assert labels(["dp=2"]) == labels(["tp=2"]) == ["d"]  # dp from gpus / tp
    assert labels(["gpus=1"]) == ["a", "b", "c"] and labels(["gpus=4"]) == ["d"]
    assert labels(["layers=2", "seq=64", "vocab=512", "hidden=64", "heads=4"]) == ["a", "b", "c", "d"]
    with pytest.raises(ConfigError, match=r"no run matches dp=3$"):
        matching_runs(s, parse_only(["dp=3"]))


def test_only_dp_on_a_suite_that_never_spells_dp_out(tmp_path, capsys):
    p = tmp_path / "tiny.yaml"
    p.write_text("name: tiny\nbase: {preset: tiny, steps: 2, warmup: 1, micro_batch: 1}\naxes: {stage: [0, 1]}\n")
    assert main(["sweep", str(p), "--check", "--only", "dp=1"]) == 0
    assert "2 of 2 runs (selected by --only), all valid" in capsys.readouterr().out
    assert main(["sweep", str(p), "--check", "--only", "dpp=1"]) == 2
    assert "no run matches dpp=1: a run has no key 'dpp' (its keys are " in _one_line(capsys)


def test_the_ab_gate_refuses_only_on_a_key_a_run_takes_from_the_default(tmp_path, capsys, monkeypatch):
    """The baseline side sweeps with its own zerobench, which may match only the values a suite spells out: the
    sides would run different runs. Refused before either side starts."""
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a side was started"))
    p = tmp_path / "ab.yaml"
    p.write_text("name: ab\nbase: {preset: tiny, steps: 2, warmup: 1}\nruns:\n- {label: a}\n- {label: b, dp: 1}\n")
    code = main(["regress", "--ab", str(p), "--baseline-tree", ".", "--only", "dp=1", "--out", str(tmp_path / "o")])
    assert code == 2 and "--ab --only dp: run 'a' takes dp from the default" in _one_line(capsys)
