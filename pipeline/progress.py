"""tqdm progress bars per stage, or nothing when disabled (tests, benchmarks), and the bounded window of
in-flight calls whose completions advance them."""

from __future__ import annotations

import sys
import time
from collections import deque

import ray
from ray.util.queue import Queue
from tqdm import tqdm


class _Silent:
    n = 0

    def update(self, n: int = 1) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def bar(self, description: str, total: int | None, unit: str = "batch") -> tqdm | _Silent:
        if not self.enabled:
            return _Silent()
        return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, mininterval=0.5, leave=True,
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



class Reports:
    """Progress inside one long actor call (DCDA stage 1 / stage 2 epochs): the actor puts (label, done, total,
    loss) on a Ray queue (actors/progress.py) and the driver, while it waits for the call, turns them into one bar
    per label and keeps the losses per epoch (`take_losses`). A call that reports nothing (an analytic solve) gets
    a bar that counts its seconds. Nothing is reported unless bars are shown or `keep_losses`."""

    POLL_S = 0.5

    def __init__(self, progress: Progress, keep_losses: bool = False):
        self.progress = progress
        listen = progress.enabled or keep_losses
        self.queue = Queue(actor_options={"num_cpus": 0}) if listen else None
        self.losses: dict[str, list[float]] = {}

    def take_losses(self) -> dict[str, list[float]]:
        """The losses per epoch reported since the last call, per label."""
        losses, self.losses = self.losses, {}
        return losses

    def get(self, ref: ray.ObjectRef, what: str) -> object:
        """ray.get(ref), showing what the actor reports meanwhile under the name `what`."""
        if self.queue is None:
            return ray.get(ref)
        bars: dict[str, tqdm | _Silent] = {}
        started = time.perf_counter()
        while not ray.wait([ref], timeout=self.POLL_S)[0]:
            self._drain(bars, what)
            if not bars and time.perf_counter() - started > 2:
                bars[""] = self.progress.bar(what, None, unit="s")
            if "" in bars:
                bars[""].n = round(time.perf_counter() - started)
                bars[""].refresh()
        self._drain(bars, what)
        for bar in bars.values():
            bar.close()
        return ray.get(ref)

    def _drain(self, bars: dict, what: str) -> None:
        for label, done, total, loss in self.queue.get_nowait_batch(self.queue.qsize()):
            if label not in bars:
                bars[label] = self.progress.bar(f"{what} {label}", total, unit="epoch")
            bars[label].update(done - bars[label].n)
            self.losses.setdefault(label, []).append(loss)
