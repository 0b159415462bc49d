"""Headless Chromium for report tests (installed by tests/setup-tools.sh; without it those tests skip)."""

from __future__ import annotations

import shutil

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


def chromium() -> tuple[str | None, str]:
    """(path to chromium, reason it is missing)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path, ""
    return None, "chromium is not installed: run tests/setup-tools.sh (as root)"
