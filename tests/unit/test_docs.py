"""The README stays a front page and the docs stay current: the README is at most 250 lines, every relative link
in it and in docs/ resolves, neither holds a commit hash or a date (those belong in the dataset READMEs under
results/reference/, next to the rows they describe), every docs page is linked from the README, the README's
test command is the one CI runs, and the simulator's validation table states what each recording's rows give."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, REPO / "ARCHITECTURE.md", *DOCS]
MAX_README_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])")
"""A 7-40 digit hex word with a digit and a letter (a commit hash), not part of a path or a longer name."""
DATE = re.compile(r"(?<![\w-])(?:19|20)\d\d-[01]\d-[0-3]\d(?![\w-])")
"""An ISO date standing alone; one inside a dataset's name (``gpu-h100-2026-11-26``) is that dataset's name."""


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def test_there_are_docs():
    assert len(DOCS) >= 9, [p.name for p in DOCS]


def test_the_readme_is_a_front_page():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # a URL or an anchor on the page
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            bad.append(target)
    assert not bad, f"{_rel(page)} links to files that do not exist: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_commit_hashes_or_dates(page):
    text = page.read_text()
    found = COMMIT.findall(text) + DATE.findall(text)
    assert not found, (
        f"{_rel(page)} holds {found}: state current behaviour; hashes and dates go in the dataset's "
        "README under results/reference/ or in commit messages"
    )


def test_the_detectors_see_what_they_are_for():
    assert COMMIT.findall("at `b2af6ac` and 745a290, not 6250000 or deadline") == ["b2af6ac", "745a290"]
    assert DATE.findall("on 2026-11-27, in gpu-h200-2026-11-27/") == ["2026-11-27"]
    assert LINK.findall("[a](docs/x.md) and [b](../y/README.md#z)") == ["docs/x.md", "../y/README.md#z"]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.split("#", 1)[0]).resolve() for t in LINK.findall(README.read_text())}
    assert not [p.name for p in DOCS if p.resolve() not in linked]


def _commands(text: str) -> list[str]:
    """The command lines of the README's "Two commands" code block (comments and blank lines left out)."""
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "the README's 'Two commands' section has no bash block"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_readmes_two_commands_are_what_ci_runs():
    commands = _commands(README.read_text())
    assert len(commands) == 2, commands
    install, tests = commands
    assert shlex.split(install)[-2:] == ["zerobench", "demo"], install
    ci = [
        ln.strip()
        for ln in (REPO / ".ci" / "run").read_text().splitlines()
        if ln.strip() and not ln.startswith(("#", "set ", "cd "))
    ]
    assert ci == [tests], f".ci/run runs {ci}, the README says {tests}"


SIM_ROW = re.compile(
    r"\| \[[^\]]+\]\(\.\./results/reference/(sim-validation-[\w-]+)/README\.md\) \| ([\d.]+) \| "
    r"\**([\d.]+)% / ([\d.]+)%\**"
)


def test_the_simulator_validation_table_states_what_the_rows_give():
    """docs/simulator.md's CPU table, row by row, against each recording's validation.json (which
    tests/unit/test_sim_validation.py recomputes from the rows): the fitted factor and the median and worst error."""
    rows = SIM_ROW.findall((REPO / "docs" / "simulator.md").read_text())
    recordings = sorted(
        p.parent.name for p in (REPO / "results" / "reference").glob("sim-validation-cpu-*/validation.json")
    )
    assert sorted(r[0] for r in rows) == recordings
    for name, factor, median, worst in rows:
        table = json.loads((REPO / "results" / "reference" / name / "validation.json").read_text())
        s = table["summary"]
        assert float(factor) == pytest.approx(table["interference"]), name
        assert (median, worst) == (f"{100 * s['median_abs_error']:.1f}", f"{100 * s['worst_abs_error']:.1f}"), name
