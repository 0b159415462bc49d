"""A discrete-event replay of one rank's step: tasks on streams, in the order the program issues them.

A task starts when its stream has finished the task issued before it on that stream and every task it
depends on has finished (a stream is a compute stream, a communication stream per process group, ...).
Because tasks are added in program order, one pass schedules them (list scheduling). The step time is
the last end; the *critical path* is found by walking back from the last task through whatever made
each task wait (its stream predecessor or a dependency), and its tasks' seconds, summed by category,
break the step time down exactly (there are no gaps: every start is some task's end, or zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    name: str
    stream: str
    seconds: float
    category: str
    """compute, mp_comm, dp_comm, copy, optimizer, offload or wait."""
    start: float
    end: float
    cause: int | None
    """The task whose end this one started at (None: it started at zero)."""


@dataclass
class Timeline:
    tasks: list[Task] = field(default_factory=list)
    last: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, stream: str, seconds: float, category: str, deps: tuple[int | None, ...] = ()) -> int:
        """Issue a task; returns its id (dependencies that are None are ignored)."""
        prev = self.last.get(stream)
        start, cause = (self.tasks[prev].end, prev) if prev is not None else (0.0, None)
        for d in deps:
            if d is not None and self.tasks[d].end > start:
                start, cause = self.tasks[d].end, d
        self.tasks.append(Task(name, stream, seconds, category, start, start + seconds, cause))
        idx = len(self.tasks) - 1
        self.last[stream] = idx
        return idx

    def wait(self, stream: str, deps: tuple[int | None, ...]) -> int:
        """``stream`` waits for ``deps`` (a zero-length task)."""
        return self.add("wait", stream, 0.0, "wait", deps)

    def now(self, stream: str) -> int | None:
        """The last task issued on ``stream`` (a dependency on 'everything so far there')."""
        return self.last.get(stream)

    @property
    def makespan(self) -> float:
        return max((t.end for t in self.tasks), default=0.0)

    def critical_path(self) -> list[Task]:
        if not self.tasks:
            return []
        i: int | None = max(range(len(self.tasks)), key=lambda k: self.tasks[k].end)
        path = []
        while i is not None:
            path.append(self.tasks[i])
            i = self.tasks[i].cause
        return path[::-1]

    def breakdown(self) -> dict[str, float]:
        """Seconds of the critical path by category (they sum to ``makespan``)."""
        out: dict[str, float] = {}
        for t in self.critical_path():
            if t.seconds:
                out[t.category] = out.get(t.category, 0.0) + t.seconds
        return out

    def busy(self, stream: str) -> float:
        return sum(t.seconds for t in self.tasks if t.stream == stream)
