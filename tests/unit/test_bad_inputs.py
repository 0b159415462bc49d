"""Bad input is one line on stderr and exit code 2: never a traceback, never silently replaced."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from zerobench.cli import main
from zerobench.config import ConfigError, parse_bytes

REPO = Path(__file__).resolve().parents[2]

CPU_PROFILE = Path(__file__).resolve().parents[2] / "results/reference/sim-validation-cpu-2core-xeon-5/profile"


def run(argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, needle: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("zerobench: warning")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("zerobench") and needle in lines[0], lines[0]


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    return f


CASES = [
    (["train", "--memory-budget", "1.2.3GB"], "cannot read memory size '1.2.3GB'"),
    (["train", "--memory-budget", "0GB"], "must be positive"),
    (["train", "--seed", str(2**70)], "--seed: must be at most 2**40-1"),
    (["train", "--seed", str(10**14)], "--seed: must be at most 2**40-1"),  # was a traceback from manual_seed
    (["train", "--hidden", "0"], "--hidden: must be >= 1, got 0"),
    (["train", "--layers", "-3"], "--layers: must be >= 1, got -3"),
    (["train", "--tp", "0"], "--tp: must be >= 1"),
    (["train", "--dp", "0"], "--dp: must be >= 1"),
    (["train", "--steps", "0"], "--steps: must be >= 1"),
    (["train", "--timeout", "nan"], "--timeout: must be a finite number"),
    (["train", "--lr", "nan"], "--lr: must be a finite number"),
    (["train", "--lr", "0"], "--lr: must be > 0"),
    (["train", "--clip", "-1"], "--clip: must be > 0"),
    (["train", "--collective-timeout", "inf"], "must be a finite number"),
    (["train", "--collective-timeout", "1e308"], "collective_timeout must be at most 1e+09 seconds"),
    (["train", "--run-id", "../../escaped"], "--run-id '../../escaped' is a path"),
    (["train", "--run-id", ".."], "--run-id '..' starts with '.'"),
    (["train", "--stage", "x"], "--stage: invalid int value"),
    (["train", "--stage", "5"], "unknown ZeRO stage 5"),
    (["train", "--heads", "5"], "not divisible by heads 5"),
    (["train", "--no-such-flag"], "unrecognized arguments"),
    (["maxsize", "--budget", "1.2.3GB"], "cannot read memory size"),
    (["maxsize", "--budget", "8MiB", "--dp", "0"], "--dp: must be >= 1"),
    (["maxsize", "--budget", "8MiB", "--max-layers", "-3"], "--max-layers: must be >= 1"),
    (["maxsize"], "the following arguments are required: --budget"),
    (["maxsize", "--budget", "8MiB", "--start-layers", "0"], "--start-layers: must be >= 1"),
    (
        ["profile", "--suite", "gpu/sim_validation", "--out", "/nonexistent/p", "--device", "cuda"],
        "this machine has no CUDA device",
    ),
    (["profile", "--suite", "cpu/sim_validation", "--out", "/nonexistent/p", "--device", "tpu"], "invalid choice"),
    (
        ["profile", "--suite", "cpu/sim_validation", "--out", "/nonexistent/p", "--time-limit", "nan"],
        "--time-limit nan: give finite",
    ),
    (
        ["profile", "--suite", "cpu/sim_validation", "--out", "/nonexistent/p", "--time-limit", "inf"],
        "--time-limit inf: give finite",
    ),
    (["plan", "--max-size", "--profile", str(CPU_PROFILE), "--gpus", "1"], "the profile has no memory entries"),
    (["plan", "--gpu-mem", "1.2.3GB"], "cannot read memory size"),
    (["plan", "--params", "0"], "--params: must be > 0"),
    (["plan", "--params", "nan"], "must be a finite number"),
    (["plan", "--efficiency", "0.5"], "unrecognized arguments: --efficiency"),
    (["plan", "--dry-run", "--rank", "-1"], "--rank: must be >= 0"),
    (["plan", "--gpus", "0"], "--gpus: must be >= 1"),
    (["plan", "--model", "100B", "--gpus", "400", "--gpus-per-node", "7"], "gpus 400 is not a whole number of nodes"),
    (["plan", "--max-size", "--hidden", "64", "--heads", "4", "--gpus", "20"], "of gpus_per_node 16: give a multiple"),
    (["plan", "--dry-run", "--suite", "cpu/c1_c5"], "cpu/c1_c5 has no zerobench row with layers to build"),
    (["plan", "--dry-run", "--suite", "cpu/c1_c5", "--rank", "5"], "has no zerobench row with layers to build"),
    (["plan", "--model", "100B", "--mp", "16"], "--mp is now spelled --tp: use --tp 16"),
    (["plan", "--model", "100B", "--cb-size", "5"], "--cb-size is now spelled --bucket-size"),
    (["peers", "--dp", "0"], "--dp: must be >= 1"),
    (["regress", "--timing-tolerance", "0"], "--timing-tolerance: must be > 0"),
    (["regress", "--false-alarm", "1e-17", "--candidate", "x"], "--false-alarm is a probability from 1e-12"),
    # flags that were silently ignored (a helper's CLI fuzz): refused, saying which goes with what
    (["plan", "--model", "100B", "--params", "5e9"], "give the model once: --model NAME or --params N"),
    (["plan", "--params", "5e9", "--layers", "4"], "--params solves for the layers"),
    (["plan", "--model", "100B", "--layers", "2", "--hidden", "64", "--heads", "4"], "replace all of --model 100B"),
    (["plan", "--model", "100B", "--rank", "2"], "--rank is for --dry-run"),
    (["plan", "--table", "1", "--model", "100B"], "--table 1 is the paper's own models: drop --model"),
    (["plan", "--table", "2", "--layers", "4"], "--table 2 is the paper's own models: drop --layers"),
    (
        ["plan", "--table", "2", "--gpus", "64"],
        "--table 2 is the paper's table for its own runs and does not read --gpus",
    ),
    (["plan", "--table", "2", "--stage", "3"], "does not read --stage (it reads --gpu-mem): drop --stage"),
    (
        ["plan", "--table", "1", "--gpu-mem", "80GB"],
        "--table 1 is the paper's table for its own runs and does not read --gpu-mem",
    ),
    (["plan", "--table", "1", "--checkpoint-activations"], "does not read --checkpoint-activations"),
    (["plan", "--model", "100B", "--suite", "paper/fig2"], "--suite is for --dry-run"),
    (["simulate", "--profile", "v100-dgx2", "--suite", "paper/fig3", "--out", "x"], "--out is for --validate"),
    (["simulate", "--profile", "v100-dgx2", "--suite", "paper/fig3", "--fit"], "--fit is for --validate"),
    (["bench-kernels", "--compile"], "--compile is for --ops"),
    (["bench-kernels", "--hidden", "100"], "--hidden is for --ops"),
    (["train", "--run-id", ""], "--run-id must be a non-empty name"),
    (["regress", "--history", "a", "b", "--candidate", "c"], "--candidate is for the gate; --history does not"),
    # --ab's, --history's and the gate's own flags were dropped without a word in the other modes
    (["regress", "--candidate", "c", "--baseline", "b", "--rounds", "4"], "--rounds is for --ab; the gate does not"),
    (["regress", "--candidate", "c", "--baseline", "b", "--concurrent"], "--concurrent is for --ab; the gate does"),
    (["regress", "--candidate", "c", "--baseline", "b", "--cpus", "1"], "--cpus is for --ab; the gate does not"),
    (["regress", "--candidate", "c", "--baseline", "b", "--only", "stage=1"], "--only is for --ab; the gate"),
    (["regress", "--candidate", "c", "--baseline", "b", "--baseline-tree", "."], "--baseline-tree is for --ab;"),
    (["regress", "--candidate", "c", "--baseline", "b", "--ab-metric", "step_cpu_s"], "--ab-metric is for --ab;"),
    (["regress", "--candidate", "c", "--baseline", "b", "--metrics", "x"], "--metrics is for --history; the gate"),
    (["regress", "--ab", "cpu/quick", "--baseline-tree", ".", "--baseline", "b"], "--baseline is for the gate and"),
    (["regress", "--ab", "cpu/quick", "--baseline-tree", ".", "--strict"], "--strict is for the gate; --ab does"),
    (["regress", "--history", "a", "--out", "h", "--timing-tolerance", "0.2"], "--timing-tolerance is for the gate"),
    (["regress", "--ab", "cpu/quick", "--history", "a"], "choose one of --ab SUITE"),
    (["regress", "--ab", "cpu/quick", "--baseline-tree", ".", "--max-rounds", "20"], "--max-rounds 20 is below"),
    (["regress", "--ab", "no/such", "--baseline-tree", "."], "suite 'no/such' not found"),
    (
        ["regress", "--ab", "cpu/quick", "--baseline-tree", ".", "--only", "no=1"],
        "no run matches no=1: a run has no key 'no'",
    ),
    # messages that named no fix, or a wrong one
    (["simulate", "--profile", "bogus-device", "--suite", "cpu/quick"], "nor a stated device (v100-dgx2, "),
    (["simulate", "--validate-published", "no/such.csv"], "cannot read it: No such file or directory: give a"),
    (["sweep", "--check", "paper/c1_c5"], "or plan it (zerobench plan --dry-run --suite "),
    (["train", "--system", "megatron", "--clip", "1.0"], "the megatron baseline does not clip gradients: drop --clip"),
    (["plan", "--model", "100B", "--stage", "3", "--offload-param"], "optimizer offload (--offload-optimizer cpu"),
]


EMPTY_PATHS = [  # an empty path (an unset shell variable) was taken as the flag not given, or as the current directory
    ["train", "--out", ""],
    ["train", "--out", "o", "--tensorboard", ""],
    ["train", "--out", "o", "--profile", ""],
    ["train", "--out", "o", "--offload-optimizer", "nvme", "--nvme-path", ""],
    ["demo", "--out", ""],
    ["maxsize", "--budget", "8MiB", "--out", ""],
    ["maxsize", "--budget", "8MiB", "--probes", ""],
    ["sweep", ""],
    ["sweep", "cpu/quick", "--check", "--out", ""],
    ["sweep", "cpu/quick", "--tensorboard", ""],
    ["peers", "--out", ""],
    ["peers", "--summarize", ""],
    ["peers", "--profile", ""],
    ["bench-kernels", "--out", ""],
    ["report", "--out", "", "r"],
    ["report", "--out", "r", ""],
    ["results", "show", ""],
    ["regress", "--candidate", ""],
    ["regress", "--candidate", "c", "--baseline", ""],
    ["regress", "--candidate", "c", "--baseline", "b", "--out", ""],
    ["regress", "--candidate", "c", "--baseline", "b", "--propose", ""],
    ["regress", "--candidate", "c", "--write-baseline", ""],
    ["regress", "--history", "", "--out", "h"],
    ["regress", "--ab", ""],
    ["regress", "--ab", "cpu/quick", "--baseline-tree", ""],
    ["plan", "--dry-run", "--suite", ""],
    ["plan", "--max-size", "--profile", "", "--gpus", "1"],
    ["profile", "--suite", "cpu/sim_validation", "--out", ""],
    ["simulate", "--profile", ""],
    ["simulate", "--profile", "v100-dgx2", "--suite", ""],
    ["simulate", "--validate-published", ""],
    ["simulate", "--profile", "v100-dgx2", "--suite", "paper/fig3", "--validate", ""],
    ["simulate", "--paper", "--out", ""],
    ["zero-to-fp32", "", "o"],
    ["zero-to-fp32", "c", ""],
]


@pytest.mark.parametrize("argv", EMPTY_PATHS, ids=[" ".join(a or "''" for a in c) for c in EMPTY_PATHS])
def test_an_empty_path_is_refused(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # were it taken as the current directory or the default, nothing lands in the repo
    assert_one_line(*run(argv, capsys), ": an empty path: give a path")
    assert not any(tmp_path.iterdir())


def test_every_path_argument_refuses_an_empty_path():
    """Every ``--out`` of every command, and each of the other path arguments, is parsed by ``types.path``."""
    import argparse

    from zerobench.cli import build_parser
    from zerobench.cli.types import path

    def parsers(p):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    yield name, sp
                    yield from parsers(sp)

    paths = {"--out", "--tensorboard", "--summarize", "--probes", "--nvme-path", "--baseline", "--candidate"}
    paths |= {"--propose", "--write-baseline", "--history", "--baseline-tree", "--suite", "--validate"}
    checked = 0
    for name, sp in parsers(build_parser()):
        for a in sp._actions:
            positional = not a.option_strings and not isinstance(a, argparse._SubParsersAction)
            if positional or paths & set(a.option_strings):
                assert a.type is path, f"{name} {a.option_strings or a.dest} takes an empty path"
                checked += 1
    assert checked >= 25


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_cli_input(argv, needle, capsys, tmp_path):
    if argv[0] == "train":
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert_one_line(*run(argv, capsys), needle)


def test_out_that_is_a_file_or_unwritable_is_refused_before_training(a_file, capsys):
    assert_one_line(*run(["train", "--out", str(a_file)], capsys), "is a file")
    assert_one_line(*run(["train", "--out", str(a_file / "sub")], capsys), "cannot write results")


SUITES = [
    ("memory_budget: 1.2.3GB", "cannot read memory size"),
    ("tp: 0", "tp must be a positive integer, got 0"),
    ("gpus: 0", "gpus must be a positive integer, got 0"),
    ("dp: -2", "dp must be a positive integer"),
    ("hidden: 0", "model hidden must be positive, got 0"),
    ("lr: .nan", "lr must be a positive finite number"),
    ("timeout: -1", "timeout must be a positive finite number"),
    ("bucket_size: 0", "bucket_size must be a positive integer"),
    ("cb_size: 5", "key 'cb_size' is now spelled 'bucket_size': rename it"),  # renamed keys name the new one
    ("mp: 2", "key 'mp' is now spelled 'tp': rename it"),
    ("collective_timeout: 1.0e+308", "collective_timeout must be at most 1e+09 seconds"),
    ("timeout: 1.0e+308", "timeout must be at most 1e+09 seconds"),
]


@pytest.mark.parametrize(("key", "needle"), SUITES, ids=[s[0] for s in SUITES])
def test_bad_suite_value_fails_sweep_check(key, needle, tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text(f"name: s\nbase: {{preset: tiny, {key}}}\n")
    code, err = run(["sweep", str(suite), "--check"], capsys)
    assert code == 2 and "Traceback" not in err and needle in err, err


AXES = ("layers", "hidden", "heads", "seq", "steps", "seed", "micro_batch", "grad_accum")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: s\nbase: {preset: tiny}\nbase: {preset: mini}\n", "line 3: key 'base' is given twice"),
        ("base: {preset: tiny, steps: 2, steps: 3}\n", "line 1: key 'steps' is given twice"),
        ("base: {layers: " + "[" * 100_000 + "]" * 100_000 + "}\n", "nested more than 32 levels deep"),
        ("base: {steps: 1" + "0" * 400 + "}\n", "is out of range (at most 2**63-1)"),
        ("base: {lr: 1" + "0" * 400 + "}\n", "is out of range (at most 2**63-1)"),
        ("base: {lr: 1.0e+400}\n", "the number 1.0e+400 is beyond the largest float"),
        ("name: ../../X\nbase: {preset: tiny}\n", "suite name '../../X' is a path"),
        (
            "base: {preset: tiny}\naxes: {"
            + ", ".join(f"{k}: [{', '.join(map(str, range(1, 11)))}]" for k in AXES)
            + "}\n",
            "expands to 100,000,000 runs",
        ),
    ],
    ids=[
        "duplicate-top-key",
        "duplicate-run-key",
        "100k-deep",
        "10**400",
        "10**400-as-float",
        "1e400",
        "escaping-name",
        "10**8-runs",
    ],
)
def test_bad_suite_files_are_one_line(text, needle, tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text(text)
    assert_one_line(*run(["sweep", str(suite), "--check"], capsys), needle)


@pytest.mark.parametrize("line", ["[1, 2]", '{"a": 1}', '"text"', "3"])
def test_json_lines_that_are_not_rows(line, tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text(line + "\n")
    for argv in (
        ["results", "show", str(tmp_path)],
        ["report", str(tmp_path), "--out", str(tmp_path / "r")],
        ["regress", "--baseline", str(tmp_path / "rows.jsonl"), "--candidate", str(tmp_path)],
    ):
        assert_one_line(*run(argv, capsys), "not a zerobench result row")


@pytest.mark.parametrize("missing", ["status", "value"])
def test_a_row_without_a_field_every_reader_takes_as_given_is_refused_by_all(missing, tmp_path, capsys):
    """A row without ``status`` (``{"run_id", "metric", "value"}``) was shown by ``results show`` and ended ``report``
    in a KeyError; one without ``value`` ended both in one. Such a row is not whole: every reader refuses it in one
    line naming its file and line, the gate's included."""
    row = {"run_id": "r1", "metric": "step_time_s", "value": 1, "status": "ok", "unit": "s", "config_hash": "h"}
    del row[missing]
    f = tmp_path / "in" / "rows.jsonl"
    f.parent.mkdir()
    whole = dict(row, **{missing: "ok" if missing == "status" else 2.0}, metric="loss")
    f.write_text(json.dumps(whole) + "\n" + json.dumps(row) + "\n")
    for argv in (
        ["results", "show", str(f.parent)],
        ["report", str(f.parent), "--out", str(tmp_path / "r")],
        ["regress", "--baseline", str(f), "--candidate", str(f.parent), "--propose", str(tmp_path / "p.jsonl")],
        ["regress", "--candidate", str(f.parent), "--write-baseline", str(tmp_path / "b.jsonl")],
    ):
        assert_one_line(*run(argv, capsys), f"{f}:2: not a whole result row: it has no {missing!r}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_torn_last_row_is_skipped_with_a_warning(tmp_path, capsys):
    from zerobench.results.rows import RowWriter, read_rows

    RowWriter(tmp_path, "r1", {"a": 1}).write("loss", 1.0, "nats")
    with open(tmp_path / "rows.jsonl", "a") as f:
        f.write('{"metric": "loss", "val')  # a writer killed mid-row
    assert [r["metric"] for r in read_rows(tmp_path)] == ["loss"]
    assert "skipped a torn last row" in capsys.readouterr().err
    with open(tmp_path / "rows.jsonl", "a") as f:
        f.write("\n")  # no longer the last line: a damaged file, refused
    with pytest.raises(ConfigError, match="not a JSON row"):
        read_rows(tmp_path)


def test_a_row_appended_after_a_torn_one_is_whole_and_the_file_reads(tmp_path, capsys):
    """A rank killed mid-row, then its launcher's status row: the fragment is cut before the append (with a
    warning), so the file reads, with every whole row, instead of one line glued from both."""
    from zerobench.results.rows import RowWriter, read_rows

    w = RowWriter(tmp_path, "r1", {"a": 1})
    w.write("loss", 1.0, "nats")
    torn = '{"metric": "step_time_s", "val' + "x" * 70_000  # longer than one read-back chunk
    with open(tmp_path / "rows.jsonl", "a") as f:
        f.write(torn)
    w.write("run_status", None, "", status="failed", reason="rank 0 was killed")
    assert f"cut {len(torn)} byte(s) of a torn last row" in capsys.readouterr().err
    rows = read_rows(tmp_path)
    assert [(r["metric"], r["status"]) for r in rows] == [("loss", "ok"), ("run_status", "failed")]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rows.jsonl").write_bytes(b"torn, no line before it")
    RowWriter(tmp_path / "b", "r2", {"a": 1}).write("loss", 2.0, "nats")
    assert [r["value"] for r in read_rows(tmp_path / "b")] == [2.0]


def test_a_row_another_node_is_writing_is_waited_for_not_cut(tmp_path, monkeypatch, capsys):
    """On a shared file system the lock may not reach another node (NFS ``nolock``, Lustre ``localflock``; here
    ``flock`` does nothing), so a torn tail can be a row a live rank is still writing. The appender waits for it to
    settle: the row completes and both are whole, where cutting it at once lost it."""
    import threading

    from zerobench.results import rows as R

    monkeypatch.setattr(R.fcntl, "flock", lambda fd, op: None)
    monkeypatch.setattr(R, "TORN_SETTLE_S", 20.0)  # however late a loaded machine runs the other writer
    w = R.RowWriter(tmp_path, "r1", {"a": 1})
    w.write("loss", 1.0, "nats")
    line = json.dumps({**w.base, "metric": "oom", "value": 0, "unit": "bool", "status": "oom"}) + "\n"
    fd = os.open(w.path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, line[:40].encode())  # the other rank's row, part way

    def finish():
        time.sleep(0.3)
        os.write(fd, line[40:].encode())
        os.close(fd)

    other = threading.Thread(target=finish)
    other.start()
    w.write("run_status", 0, "bool", status="oom")
    other.join()
    assert [r["metric"] for r in R.read_rows(tmp_path)] == ["loss", "oom", "run_status"]
    assert "torn" not in capsys.readouterr().err


def test_without_a_lock_a_failed_write_leaves_later_rows_alone(tmp_path, monkeypatch, capsys):
    """With no lock on the file system, a write that fails part way is not truncated back (another writer's rows may
    follow it): the fragment stays a torn last line that readers skip, and the next appender cuts it once settled."""
    from zerobench.results import rows as R

    def no_locks(fd, op):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(R.fcntl, "flock", no_locks)
    monkeypatch.setattr(R, "TORN_SETTLE_S", 0.1)
    w = R.RowWriter(tmp_path, "r1", {"a": 1})
    w.write("loss", 1.0, "nats")
    real_write, truncated = os.write, []

    def full_disk(fd, data):
        real_write(fd, bytes(data[:25]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(R.os, "write", full_disk)
    monkeypatch.setattr(R.os, "ftruncate", lambda fd, n: truncated.append(n))
    with pytest.raises(R.RowWriteError, match="No space left on device"):
        w.write("step_time_s", 0.5, "s")
    assert truncated == []
    assert [r["metric"] for r in R.read_rows(tmp_path)] == ["loss"]
    monkeypatch.undo()
    monkeypatch.setattr(R.fcntl, "flock", no_locks)
    monkeypatch.setattr(R, "TORN_SETTLE_S", 0.1)
    w.write("run_status", 0, "bool", status="failed")
    assert [r["metric"] for r in R.read_rows(tmp_path)] == ["loss", "run_status"]
    assert "cut 25 byte(s) of a torn last row" in capsys.readouterr().err


def test_a_profile_cut_short_while_written_is_never_read_as_whole(tmp_path):
    """``zerobench profile`` writes its rows as one unit: a writer that stops part way (here a full disk at the
    234th row, where a kill would do the same) leaves no ``rows.jsonl``, and ``simulate --profile`` says so in one
    line, instead of replaying a profile whose last rows (the sync penalties, a curve's last points) are gone."""
    from zerobench.results.rows import ROWS_FILE, RowWriteError, RowWriter, read_rows, written_whole
    from zerobench.sim.command import _load_profile

    ref = read_rows(REPO / "results/reference/sim-validation-cpu-2core/profile/round-1")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for out, stop in ((whole, None), (cut, 233)):
        w = RowWriter(out, "profile", {})
        with pytest.raises(RowWriteError) if stop else contextlib.nullcontext(), written_whole(w):
            for n, row in enumerate(ref):
                if n == stop:
                    raise RowWriteError(f"cannot write results to {w.path}: No space left on device")
                extra = {k: v for k, v in row.items() if k not in ("metric", "value", "unit", "status")}
                w.write(
                    row["metric"], row["value"], row["unit"], **{k: extra[k] for k in ("key", "bytes") if k in extra}
                )
    assert _load_profile(str(whole)).ops  # the whole one loads
    assert not (cut / ROWS_FILE).exists()
    with pytest.raises(ConfigError, match=r"the profile stopped while its rows were written .* run `zerobench prof"):
        _load_profile(str(cut))
    with pytest.raises(ConfigError, match="already holds rows"), written_whole(RowWriter(whole, "profile", {})):
        pass


@pytest.mark.parametrize("writer", ["baseline", "16-bit model"])
def test_a_file_replaced_by_a_writer_that_stops_is_the_old_one_whole(tmp_path, monkeypatch, writer):
    """The regression gate's baselines (and the recordings ``trim`` rewrites) and ``save_16bit_model``'s file are
    replaced through a temporary file of their own: a writer stopped before the rename leaves the old file whole
    and nothing beside it (``write_text`` emptied the old baseline first)."""
    import os

    import torch

    from zerobench.files import replace_file
    from zerobench.zero.state.export import save_whole

    path = tmp_path / ("baseline.jsonl" if writer == "baseline" else "pytorch_model.bin")
    old, new = ('{"metric": "a"}\n', '{"metric": "b"}\n') if writer == "baseline" else ({"w": torch.ones(3)}, {})

    def write(v):
        return replace_file(path, v) if writer == "baseline" else save_whole(v, path)

    def read():
        return path.read_text() if writer == "baseline" else torch.load(path, weights_only=True)

    write(old)

    def stopped(*a):
        raise KeyboardInterrupt  # as a kill between the write and the rename

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        write(new)
    monkeypatch.undo()
    got = read()
    assert got == old if writer == "baseline" else torch.equal(got["w"], old["w"])
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    write(new)
    assert read() == new


@pytest.mark.parametrize("text", ["1.2.3GB", "GB", "-1GB", "0", "nan", "1e400", ".GB", True])
def test_parse_bytes_refuses(text):
    with pytest.raises(ConfigError):
        parse_bytes(text)


def test_parse_bytes_reads():
    assert parse_bytes("32GB") == 32e9 and parse_bytes("1.5GiB") == 1.5 * 2**30 and parse_bytes(".5KB") == 500


def test_train_and_suites_resolve_through_one_resolver():
    """``zerobench train``'s flags and a suite row become the same RunSpec and the same TrainConfig: P_a
    implies checkpointing, the warm-up is clamped below the step count, a vocabulary TP does not divide is
    padded (Megatron's rule), bucket_size null is no C_B."""
    from zerobench.bench.spec import NO_BUCKET_LIMIT, RunSpec, to_train_config

    cfg = to_train_config(RunSpec(vocab=129, tp=2, dp=1, pa=True, steps=3, warmup=5))
    assert cfg.activation.checkpoint and cfg.activation.partition
    assert cfg.warmup_steps == 2 and cfg.model.vocab == 256
    assert to_train_config(RunSpec(bucket_size=None)).zero.bucket_numel == NO_BUCKET_LIMIT


def test_the_train_command_builds_its_config_with_the_suite_resolver(monkeypatch, tmp_path, capsys):
    """The CLI path itself: its TrainConfig equals to_train_config of the equivalent RunSpec."""
    import zerobench.bench.spec as spec_mod
    from zerobench.bench.spec import RunSpec, to_train_config

    seen = []
    real = spec_mod.to_train_config

    def spy(spec, world_size=None):
        seen.append(spec)
        return real(spec, world_size)

    monkeypatch.setattr(spec_mod, "to_train_config", spy)
    code, err = run(
        [
            "train",
            "--pa",
            "--tp",
            "2",
            "--dp",
            "1",
            "--steps",
            "1",
            "--sp",
            "--seq",
            "33",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert code == 2 and "sequence length 33 is not divisible by TP degree 2" in err  # resolved, then refused
    assert len(seen) == 1 and seen[0].pa and seen[0].tp == 2
    assert to_train_config(RunSpec(pa=True)).activation.checkpoint


def test_a_maxsize_search_that_stopped_between_its_answer_rows_is_left_out(tmp_path, capsys):
    """A search's answer is two rows; one stopped between them has only ``max_layers``: the report's table
    leaves that search out with a warning naming it (it indexed the missing row and failed), and keeps the
    whole ones."""
    import shutil

    from zerobench.report.maxsize import maxsize_table
    from zerobench.results import load

    ref = REPO / "results/reference/maxsize-cpu-2core"
    shutil.copytree(ref, tmp_path / "ref")
    whole = len(maxsize_table(load(tmp_path / "ref")))
    from zerobench.results.rows import RowWriter

    RowWriter(tmp_path / "ref" / "cut", "maxsize-stage9", {"stage": 2, "budget": "1GB"}).write(
        "max_layers", 3, "layers"
    )
    table = maxsize_table(load(tmp_path / "ref"))
    assert len(table) == whole and "maxsize-stage9" not in set(table["run_id"])
    assert "maxsize search maxsize-stage9 lacks its max_params row" in capsys.readouterr().err


def test_a_torn_search_is_not_completed_by_another_directorys(tmp_path, capsys):
    """The same search run into two directories is two searches (one record, its repeats counted): one stopped
    before its ``max_params`` row is left out with its warning, not completed by the other directory's row (before,
    they were merged by run id and config hash, and the table showed one search with the other's answer)."""
    import shutil

    from zerobench.report.maxsize import maxsize_table
    from zerobench.results import load
    from zerobench.results.rows import read_rows

    ref = REPO / "results/reference/maxsize-cpu-2core"
    shutil.copytree(ref, tmp_path / "a")
    shutil.copytree(ref, tmp_path / "b")
    torn = tmp_path / "b" / "rows.jsonl"
    rows = read_rows(torn)
    first = next(i for i, r in enumerate(rows) if r["metric"] == "max_params")
    gone = rows[first]["run_id"]
    torn.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(rows) if i != first))
    import pandas as pd

    whole = maxsize_table(load(tmp_path / "a"))
    table = maxsize_table(pd.concat([load(tmp_path / "a"), load(tmp_path / "b")], ignore_index=True))
    assert len(table) == len(whole) and (whole["repeats"] == 1).all()
    assert sorted(table["repeats"]) == [1] + [2] * (len(whole) - 1)
    assert table[table["repeats"] == 1]["run_id"].tolist() == [gone]
    assert f"maxsize search {gone} lacks its max_params row" in capsys.readouterr().err


def test_a_suite_that_is_not_text_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(bytes(range(128, 256)))
    for argv in (["sweep", "--check", str(bad)], ["plan", "--dry-run", "--suite", str(bad)]):
        assert_one_line(main(argv), capsys.readouterr().err, "not a YAML suite (not UTF-8 text: byte 0 is 0x80)")


@pytest.mark.parametrize("config", [None, {}, "two"], ids=["no-config", "empty-config", "stage-not-a-number"])
def test_report_rows_without_a_training_config_are_one_line(tmp_path, capsys, config):
    """Rows with training metrics but no usable ``config`` (edited, or not a zerobench run's): one line naming
    the run, where the report's figures failed on ``int(None)``."""
    import json

    from zerobench.results.rows import read_rows

    rows = read_rows(REPO / "results/reference/quick-cpu-2core")
    out = []
    for row in rows:
        r = dict(row)
        if config is None:
            r.pop("config")
        elif config == "two":
            r["config"] = {**r["config"], "zero": {**r["config"]["zero"], "stage": "two"}}
        else:
            r["config"] = config
        out.append(json.dumps(r) + "\n")
    (tmp_path / "rows.jsonl").write_text("".join(out))
    code = main(["report", str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "r")])
    assert_one_line(code, capsys.readouterr().err, ": its rows carry training metrics, but their config")


def test_the_demo_table_names_a_stage_whose_run_failed(tmp_path, capsys):
    """A stage's run that failed has no figures: the demo's table says so (it indexed the run's missing loss and
    failed with a traceback before the failed runs were listed)."""
    import json
    import shutil

    from zerobench.demo import print_stage_table
    from zerobench.results.rows import read_rows

    shutil.copytree(REPO / "results/reference/quick-cpu-2core", tmp_path / "q")
    rows = read_rows(tmp_path / "q")
    dp = max(r["config"]["dp"] for r in rows)
    victim = next(r["run_id"] for r in rows if r["config"]["dp"] == dp and r["config"]["zero"]["stage"] == 2)
    kept = [r for r in rows if r["run_id"] != victim or r["metric"] == "run_status"]
    for r in kept:
        if r["run_id"] == victim:
            r.update(status="failed", reason="rank 1 was killed")
    for f in (tmp_path / "q").rglob("rows.jsonl"):
        f.unlink()
    (tmp_path / "q" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    print_stage_table(tmp_path / "q")
    out = capsys.readouterr().out
    assert "      2  did not complete (its status is above)" in out
    assert sum(line.strip().startswith(("0 ", "1 ", "3 ")) for line in out.splitlines()) == 3, out


def test_a_refused_command_leaves_no_directory_behind(tmp_path, capsys):
    """Output directories are proved writable (so created) before the rest of the input is checked: a refusal
    found after that removes what it created, if still empty, and nothing that was there before."""
    (tmp_path / "kept").mkdir()
    garbage = tmp_path / "kept" / "rows.jsonl"
    garbage.write_text("not json\n")
    cases = [
        ["report", str(garbage), "--out", str(tmp_path / "r" / "deep")],
        ["sweep", "cpu/quick", "--only", "nokey=1", "--out", str(tmp_path / "s")],
        ["zero-to-fp32", str(tmp_path / "kept"), str(tmp_path / "z"), "--tag", "nope"],
        ["report", str(garbage), "--out", str(tmp_path / "kept")],  # there before: stays
    ]
    for argv in cases:
        code, err = run(argv, capsys)
        assert code == 2 and err.count("\n") == 1, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["rows.jsonl"]


@pytest.mark.parametrize("flag", ["--pa", "--pa-cpu"])
def test_partitioned_activations_with_sequence_parallelism_are_refused(flag, tmp_path, capsys):
    """Under SP each TP rank's block input is its own slice of the sequence; P_a gathered the slices of different
    tensors into the recompute's input, and training went on with gradients 1.8x off (relative) without a word.
    Megatron-LM refuses the pair too."""
    argv = ["train", "--tp", "2", "--dp", "1", "--steps", "1", "--sp", "--checkpoint-activations", flag]
    code, err = run([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "P_a (--pa, --pa-cpu, --paper-config C2/C4/C5) with sequence parallelism (--sp)" in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("ref", ["-q", "--orphan=x", ""])
def test_a_baseline_ref_git_would_read_as_an_option_is_refused(ref, tmp_path):
    """``--baseline-ref=-q`` reached ``git worktree add --detach TREE -q``, which checked out HEAD as the baseline."""
    from zerobench.bench.ab_sources import worktree
    from zerobench.config import ConfigError

    with pytest.raises(ConfigError, match="a ref never starts with '-'"), worktree(ref, tmp_path):
        pass


def test_profile_advice_names_steps_that_then_run(capsys):
    """With the warm-up clamped to steps - 1, --steps 4 --warmup 5 --profile said 'give --steps 6', and --steps 6
    then said 'give --steps 8': the advice is now from the warm-up asked for."""
    from zerobench.cli import main

    code = main(["train", "--steps", "4", "--warmup", "5", "--profile", "/nonexistent/p", "--dp", "1"])
    assert code == 2 and "give --steps 8 or more" in capsys.readouterr().err


def test_maxsize_checks_every_stage_before_its_first_probe(capsys, monkeypatch):
    """A bad stage later in --stage was found only when its turn came, after the earlier stages' whole searches."""
    from zerobench.bench import maxsize
    from zerobench.cli import main

    monkeypatch.setattr(
        maxsize, "launch_local", lambda *a, **k: pytest.fail("a probe ran before every stage was checked")
    )
    assert main(["maxsize", "--budget", "1KiB", "--dp", "1", "--stage", "0", "5"]) == 2
    assert "unknown ZeRO stage 5" in capsys.readouterr().err


def test_a_dry_run_rank_outside_any_rows_world_is_refused_before_a_row_is_built(tmp_path, capsys, monkeypatch):
    """``plan --dry-run --suite S --rank 5`` built and printed the rows of 8 GPUs, then stopped at the 1-GPU row; a
    suite with no row to build took any --rank and exited 0 having built nothing."""
    import zerobench.plan.dry_run

    def unreached(*args, **kwargs):
        raise AssertionError("a row was built before --rank was checked against every row")

    monkeypatch.setattr(zerobench.plan.dry_run, "dry_run", unreached)
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: s\nbase: {seq: 32, vocab: 128, precision: bf16, layers: 2, hidden: 64, heads: 4}\nruns:\n"
        "  - {label: a, gpus: 8}\n  - {label: b, gpus: 1}\n  - {label: c, gpus: 8, system: megatron}\n"
    )
    code, err = run(["plan", "--dry-run", "--suite", str(suite), "--rank", "5"], capsys)
    assert_one_line(code, err, "--rank 5 is outside the 1-GPU world of row b: give a rank below 1")
