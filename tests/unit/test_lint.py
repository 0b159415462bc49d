"""The tree passes ruff with the rules pinned in pyproject.toml (unused imports, bugbear, blind excepts, ...) and is
formatted by `ruff format`."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]'")
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_tree_is_formatted():
    """``ruff format`` (the version pinned in the test extra) leaves every file as it is: formatting is
    mechanical, never a review question."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]'")
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, "run `ruff format` at the repository root:\n" + r.stdout + r.stderr
