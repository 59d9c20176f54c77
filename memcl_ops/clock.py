"""Busy-time accounting shared by the roles (what the per-stage time breakdown reports), and how much of one busy
time fell inside another's windows (a stage overlapping another)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


class StageClock:
    """Seconds and calls per stage; the stages named in `intervals` also keep the wall-clock (start, end) of each
    call until they are taken (`take_intervals`), so a reader can tell when the stage was busy."""

    def __init__(self, intervals: Sequence[str] = ()) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.kept = set(intervals)
        self.intervals: list[tuple[float, float]] = []

    @contextmanager
    def time(self, stage: str) -> Iterator[None]:
        start, wall = time.perf_counter(), time.time()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start
            self.calls[stage] += 1
            if stage in self.kept:
                self.intervals.append((wall, time.time()))

    def take_intervals(self) -> list[tuple[float, float]]:
        """The (start, end) wall times of the kept stages' calls since the last take."""
        taken, self.intervals = self.intervals, []
        return taken

    def report(self) -> dict[str, dict[str, float]]:
        return {k: {"seconds": self.seconds[k], "calls": self.calls[k]} for k in self.seconds}


def overlap_seconds(busy: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]) -> float:
    """Seconds of the `busy` intervals that lie inside any of the `windows` (each second counted once)."""
    merged: list[list[float]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(max(0.0, min(end, w_end) - max(start, w_start)) for start, end in busy for w_start, w_end in merged)
