"""The sweep's progress bar (rich): runs done / failed / skipped / remaining and the current run's step,
read from the tail of its log."""

from __future__ import annotations

import re
from pathlib import Path

_STEP = re.compile(rb"step\s+(\d+)/(\d+)")


class Progress:
    """A rich progress bar: runs done / failed / remaining, and the current run's step."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.done = self.failed = self.skipped = 0
        self.log: Path | None = None
        self.label = ""
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}", markup=False),  # a suite's labels are text, not rich markup
                TimeElapsedColumn(),
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("sweep", total=self.total, status="")
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def _update(self, step: str = "") -> None:
        if self._progress is None:
            return
        remaining = self.total - self.done - self.failed - self.skipped
        status = f"ok {self.done}  failed {self.failed}  skipped {self.skipped}  remaining {remaining}" + (
            f"  | {self.label} {step}" if self.label else ""
        )
        self._progress.update(self._task, completed=self.done + self.failed + self.skipped, status=status)

    def start(self, label: str, log: Path) -> None:
        self.label, self.log = label, log
        self._update("starting")

    def poll(self) -> None:
        if self.log is None or self._progress is None or not self.log.exists():
            return
        steps = _STEP.findall(self.log.read_bytes()[-4096:])
        if steps:
            self._update(f"step {int(steps[-1][0])}/{int(steps[-1][1])}")

    def advance(self, label: str, failed: bool = False, skipped: bool = False) -> None:
        if skipped:
            self.skipped += 1
        elif failed:
            self.failed += 1
        else:
            self.done += 1
        self.label, self.log = "", None
        self._update()
