"""Busy-time accounting shared by the roles (what the per-stage time breakdown reports)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class StageClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @contextmanager
    def time(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start
            self.calls[stage] += 1

    def report(self) -> dict[str, dict[str, float]]:
        return {k: {"seconds": self.seconds[k], "calls": self.calls[k]} for k in self.seconds}
