"""Suite expansion and validation: good files expand as written, bad ones fail with one line."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from zerobench.bench import suite as suites
from zerobench.config import ConfigError


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_quick_and_ci_suites_expand():
    q = suites.load("cpu/quick")
    assert len(q.runs) == 12 and all(r.config is not None for r in q.runs)
    assert {(r.config.zero.stage, r.config.dp) for r in q.runs} == {(s, d) for s in range(4) for d in (1, 2, 4)}
    assert len({r.run_id for r in q.runs}) == 12
    ci = suites.load("cpu/ci")
    assert all(r.error is None for r in ci.runs)


def test_product_zip_and_runs(tmp_path):
    p = write(
        tmp_path,
        """
base: {preset: tiny, steps: 2}
axes: {stage: [0, 3]}
zip: {hidden: [32, 64], heads: [2, 4]}
runs: [{dp: 1}, {dp: 2, label: two}]
""",
    )
    s = suites.load(p)
    assert len(s.runs) == 2 * 2 * 2
    combos = {(r.spec.stage, r.spec.hidden, r.spec.heads, r.spec.dp) for r in s.runs}
    assert (3, 64, 4, 2) in combos and (0, 32, 2, 1) in combos and (0, 32, 4, 1) not in combos
    assert any(r.label.startswith("two,") for r in s.runs)


def test_paper_suites_resolve_at_cluster_scale():
    s = suites.load("paper/fig2")
    zero = [r for r in s.runs if r.spec.system == "zerobench"]
    assert len(zero) == 10 and all(r.config.world_size == 400 for r in zero)
    assert all(r.config.model.vocab % r.config.tp == 0 for r in zero)  # padded like Megatron


@pytest.mark.parametrize(
    "text,msg",
    [
        ("base: {stagee: 1}", "unknown key 'stagee' (did you mean 'stage'?)"),
        ("base: {dp: two}", "run 0.dp: expected int, got 'two'"),
        ("axes: {stage: 3}", "axis 'stage' must be a non-empty list"),
        ("zip: {hidden: [1, 2], heads: [1]}", "zip lists must have equal lengths"),
        ("base: [1, 2]", "'base' must be a mapping"),
        ("base: {dp: 1\n", "not valid YAML"),
        ("bases: {}", "unknown top-level key 'bases'"),
    ],
)
def test_bad_suites_fail_with_one_line(tmp_path, text, msg):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        suites.load(p)
    assert msg in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "run,msg",
    [
        ("{tp: 3}", "heads 4 is not divisible by TP degree 3"),
        ("{hidden: 60, heads: 7}", "not divisible by heads"),
        ("{gpus: 6, tp: 4}", "gpus 6 is not divisible by tp 4"),
        ("{stage: 7}", "unknown ZeRO stage 7"),
        ("{precision: fp8}", "unknown precision 'fp8': choose fp32, bf16 or fp16"),
    ],
)
def test_invalid_runs_are_kept_with_a_reason(tmp_path, run, msg):
    s = suites.load(write(tmp_path, f"base: {{preset: tiny}}\nruns: [{run}]"))
    assert s.runs[0].config is None and msg in s.runs[0].error


def test_missing_suite():
    with pytest.raises(ConfigError, match="not found"):
        suites.load("cpu/does-not-exist")


@pytest.mark.parametrize(
    "text,line,key",
    [
        ("base: {preset: tiny, steps: 2}\nbase: {preset: tiny, steps: 3}\n", 2, "'base'"),
        ("base:\n  steps: 2\n  stage: 1\n  steps: 3\n", 4, "'steps'"),
        ("runs:\n  - {label: a, stage: 1, stage: 2}\n", 2, "'stage'"),
    ],
    ids=["top-level", "block-mapping", "run-entry"],
)
def test_duplicate_keys_are_refused_naming_the_key_and_line(tmp_path, text, line, key):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        suites.load(p)
    msg = str(e.value)
    assert f"line {line}: key {key} is given twice" in msg and str(p) in msg and "\n" not in msg, msg


def test_merge_keys_may_be_overridden(tmp_path):
    s = suites.load(write(tmp_path, "base: &b {preset: tiny, steps: 2}\nruns:\n  - {<<: *b, steps: 3}\n"))
    assert [r.spec.steps for r in s.runs] == [3]


@pytest.mark.parametrize(
    "text,msg",
    [
        ("base: {layers: " + "[" * 100_000 + "]" * 100_000 + "}\n", "line 1: nested more than 32 levels deep"),
        ("base: {steps: 1" + "0" * 400 + "}\n", "line 1: the integer 1000"),
        ("base: {lr: 1" + "0" * 400 + "}\n", "is out of range (at most 2**63-1)"),
        ("base: {lr: 1.0e+400}\n", "line 1: the number 1.0e+400 is beyond the largest float"),
        ("base:\n  seed: -1" + "0" * 30 + "\n", "line 2: the integer -1000"),
    ],
    ids=["100k-deep", "10**400", "10**400-as-float", "1e400", "-10**30"],
)
def test_deep_nesting_and_huge_numbers_are_one_line(tmp_path, text, msg):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        suites.load(p)
    assert msg in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_python_tags_stay_refused(tmp_path):
    with pytest.raises(ConfigError, match="could not determine a constructor"):
        suites.load(write(tmp_path, "base: !!python/object/apply:os.system ['true']\n"))


LAUGHS = "cluster:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    "text,msg",
    [
        (LAUGHS, "its aliases (*name) expand to more than 1,000,000 values"),  # 9**9 values from 10 lines
        (LAUGHS + "base: {preset: tiny, label: *i}\n", "expand to more than 1,000,000 values"),
        ("cluster: &c {self: *c}\n", "line 1: an alias refers to a collection that holds it"),
        (
            "cluster:\n  a0: &a0 [x]\n" + "".join(f"  a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 40)),
            "its aliases (*name) nest more than 32 levels deep",
        ),
    ],
    ids=["billion-laughs", "billion-laughs-used", "recursive", "deep-through-aliases"],
)
def test_aliases_are_never_expanded_beyond_bounds(tmp_path, text, msg):
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        suites.load(write(tmp_path, text))
    assert msg in str(e.value) and "\n" not in str(e.value) and time.monotonic() - t0 < 5, str(e.value)


@pytest.mark.parametrize(
    "name,why",
    [
        ("'../../X'", "is a path"),
        ("/abs/path", "is a path"),
        ("'..'", "starts with '.'"),
        (".hidden", "starts with '.'"),
        ("a b", "holds ' '"),
        ("3", "must be a non-empty name, got 3"),
        ("'x/'", "is a path"),
    ],
)
def test_suite_names_stay_one_directory_inside_runs(tmp_path, name, why):
    p = write(tmp_path, f"name: {name}\nbase: {{preset: tiny}}\n")
    with pytest.raises(ConfigError) as e:
        suites.load(p)
    assert f"{p}: suite name" in str(e.value) and why in str(e.value), str(e.value)
    assert "set the suite's 'name:'" in str(e.value) and "\n" not in str(e.value)


def test_a_suite_file_name_is_checked_as_its_name(tmp_path):
    with pytest.raises(ConfigError, match=r"suite name '\.hidden' starts with '\.'"):
        suites.load(write(tmp_path, "base: {preset: tiny}\n", name=".hidden.yaml"))
    assert suites.load(write(tmp_path, "base: {preset: tiny}\n", name="my_suite-2.yaml")).name == "my_suite-2"


def test_equal_labels_are_numbered_and_never_collide(tmp_path):
    s = suites.load(
        write(
            tmp_path,
            "base: {preset: tiny}\nruns:\n  - {label: 'a #2'}\n  - {label: a}\n  - {label: a}\n  - {label: a}\n",
        )
    )
    labels = [r.label for r in s.runs]
    assert labels == ["a #2", "a", "a #3", "a #4"] and len(set(labels)) == len(labels)


def test_runs_are_generated_lazily_and_identically_on_each_pass(tmp_path, monkeypatch):
    from zerobench.bench import expand

    built = []
    real = expand.to_train_config
    monkeypatch.setattr(expand, "to_train_config", lambda spec: built.append(spec) or real(spec))
    axes = "{stage: [0, 1, 2, 3], seed: [" + ", ".join(map(str, range(2500))) + "]}"
    s = suites.load(write(tmp_path, f"base: {{preset: tiny, steps: 1}}\naxes: {axes}\n"))
    assert len(s.runs) == expand.MAX_RUNS == 10_000 and built == []  # counted, not built
    first = next(iter(s.runs))
    assert len(built) == 1 and first.label == "stage=0,seed=0" and s.runs[5].label == "stage=0,seed=5"
    small = suites.load(
        write(tmp_path, "base: {preset: tiny}\naxes: {stage: [0, 1], dp: [1, 2]}\nruns: [{label: a}, {label: a}]\n")
    )
    passes = [[(r.index, r.label, r.run_id) for r in small.runs] for _ in range(2)]
    assert passes[0] == passes[1] and len(passes[0]) == len(small.runs) == 8
    assert passes[0][4] == (4, "a,stage=0,dp=1 #2", "004-a-stage-0-dp-1--2")


def test_a_huge_axis_product_is_refused_at_once_with_its_count(tmp_path):
    axes = ", ".join(
        f"{k}: [{', '.join(str(v) for v in range(1, 11))}]"
        for k in ("layers", "hidden", "heads", "seq", "micro_batch", "steps", "seed", "grad_accum")
    )
    p = write(tmp_path, f"name: huge\nbase: {{preset: tiny}}\naxes: {{{axes}}}\n")
    # In a child under a 1 GiB address-space cap: building the runs (10**8 of them) ran out of memory.
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))\n"
        "from zerobench.cli import main\nsys.exit(main(['sweep', sys.argv[1], '--check']))\n"
    )
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "expands to 100,000,000 runs (1 runs x 10 layers x 10 hidden" in r.stderr, r.stderr
    assert "more than the 10,000 one suite may hold" in r.stderr and time.monotonic() - t0 < 60
