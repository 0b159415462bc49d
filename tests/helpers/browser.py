"""Headless Chromium for report tests: installed from Debian's packages when missing (as root, as in CI)."""

from __future__ import annotations

import os
import shutil
import subprocess

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic"]


def chromium() -> tuple[str | None, str]:
    """(path to chromium, reason it is missing)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path, ""
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return None, "chromium is not installed and cannot be installed here (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0:
            return None, f"installing chromium failed: {' '.join(cmd)}: {r.stderr.strip().splitlines()[-1:]}"
    path = shutil.which("chromium")
    return (path, "") if path else (None, "chromium installed but not on PATH")
