"""tqdm progress bars per stage, or nothing when disabled (tests, benchmarks), and the bounded window of
in-flight calls whose completions advance them."""

from __future__ import annotations

import sys
from collections import deque

import ray
from tqdm import tqdm


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def bar(self, description: str, total: int) -> tqdm | _Silent:
        if not self.enabled:
            return _Silent()
        return tqdm(total=total, desc=description, unit="batch", file=sys.stderr, mininterval=0.5, leave=True,
                    dynamic_ncols=True)

    def note(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message, file=sys.stderr)


class InFlight:
    """Backpressure: at most `limit` submitted calls outstanding; waiting on the oldest advances `bar`."""

    def __init__(self, limit: int, bar: tqdm | _Silent):
        self.limit, self.bar = limit, bar
        self.pending: deque[ray.ObjectRef] = deque()

    def add(self, ref: ray.ObjectRef) -> None:
        self.pending.append(ref)
        if len(self.pending) > self.limit:
            ray.get(self.pending.popleft())
            self.bar.update(1)

    def drain(self) -> None:
        """Wait for every outstanding call, then close the bar."""
        ray.get(list(self.pending))
        self.bar.update(len(self.pending))
        self.pending.clear()
        self.bar.close()

