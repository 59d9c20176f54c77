"""tqdm progress bars per stage, or nothing when disabled (tests, benchmarks), and the bounded window of
in-flight calls whose completions advance them."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable

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


class _LineBar:
    """A bar for a log (stderr is no terminal): a plain line every `EVERY_S` seconds and one at the end, instead of
    tqdm's redraws, which a log keeps as one line each (every bar twice around each note)."""

    EVERY_S = 30.0

    def __init__(self, description: str, total: int | None, unit: str, leave: bool):
        self.description, self.total, self.unit, self.leave, self.n = description, total, unit, leave, 0
        self.started = self.shown = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.shown >= self.EVERY_S:
            self._line()

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if self.leave or time.perf_counter() - self.started >= self.EVERY_S:
            self._line()

    def _line(self) -> None:
        self.shown = time.perf_counter()
        of = f"/{self.total}" if self.total is not None else ""
        print(f"{self.description}: {self.n}{of} {self.unit} ({self.shown - self.started:.0f} s)", file=sys.stderr,
              flush=True)


class Progress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.terminal = sys.stderr.isatty()

    def bar(self, description: str, total: int | None, unit: str = "batch",
            leave: bool = True) -> tqdm | _LineBar | _Silent:
        """`leave=False`: a passing bar, erased when done (a log keeps it only if it ran long)."""
        if not self.enabled:
            return _Silent()
        if not self.terminal:
            return _LineBar(description, total, unit, leave)
        # no rate: a short phase's rate reads like "20262.34epoch/s"; the elapsed and remaining times say enough
        return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, mininterval=0.5, leave=leave,
                    dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}]")

    def note(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message, file=sys.stderr)

    def say(self, message: str) -> None:
        """A line the user needs whether or not bars are shown (where a resumed run continues)."""
        if self.enabled:
            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def wait(self, refs: list[ray.ObjectRef], description: str, unit: str, leave: bool = True) -> list:
        """ray.get(refs), a bar advancing as they complete (in any order); values computed in this process (the
        calls of roles held here) are returned as they are."""
        if not any(isinstance(r, ray.ObjectRef) for r in refs):
            return list(refs)
        bar, pending = self.bar(description, len(refs), unit, leave), list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            bar.update(len(done))
        bar.close()
        return ray.get(refs)


class InFlight:
    """Backpressure: at most `limit` submitted calls outstanding; waiting on the oldest (by `get`: an executor's)
    advances `bar`."""

    def __init__(self, limit: int, bar: tqdm | _Silent, get: Callable[[object], object] = ray.get):
        self.limit, self.bar, self.get = limit, bar, get
        self.pending: deque[ray.ObjectRef] = deque()

    def add(self, ref: ray.ObjectRef) -> None:
        self.pending.append(ref)
        if len(self.pending) > self.limit:
            self.get(self.pending.popleft())
            self.bar.update(1)

    def drain(self) -> None:
        """Wait for every outstanding call, then close the bar."""
        self.get(list(self.pending))
        self.bar.update(len(self.pending))
        self.pending.clear()
        self.bar.close()



class Reports:
    """Progress inside one long actor call (DCDA stage 1 / stage 2 epochs): the actor puts (label, done, total,
    loss) on a Ray queue (actors/progress.py) and the driver, while it waits for the call, turns them into one bar
    per label and keeps the losses per epoch (`take_losses`). A call that reports nothing (an analytic solve) gets
    a bar that counts its seconds. Nothing is reported unless bars are shown or `keep_losses`."""

    POLL_S = 0.5
    QUIET_S = 10.0  # a call silent this long gets the seconds bar (a first epoch may take a few seconds)

    def __init__(self, progress: Progress, keep_losses: bool = False,
                 on_phase: Callable[[str], None] | None = None, local: bool = False):
        """`local`: the roles run in this process, and report on a queue of this process."""
        self.progress, self.on_phase, self.local = progress, on_phase, local
        listen = progress.enabled or keep_losses
        self.queue = (LocalQueue() if local else Queue(actor_options={"num_cpus": 0})) if listen else None
        self.losses: dict[str, list[float]] = {}

    def phase(self, name: str) -> None:
        """A step of the run begins ("start", "evaluate", "commit", "checkpoint", "restore", "report"): the observer
        hears it (fault injection in tests aims there)."""
        if self.on_phase is not None:
            self.on_phase(name)

    def close(self) -> None:
        """End the queue's actor now (Ray ends it anyway once the last handle to it is gone)."""
        if self.queue is not None:
            self.queue.shutdown()
            self.queue = None

    def take_losses(self) -> dict[str, list[float]]:
        """The losses per epoch reported since the last call, per label (what the trainers reported in the
        background included)."""
        if self.queue is not None:
            for label, _, _, loss in self.queue.get_nowait_batch(self.queue.qsize()):
                self.losses.setdefault(label, []).append(loss)
        losses, self.losses = self.losses, {}
        return losses

    def get(self, ref: ray.ObjectRef, what: str) -> object:
        """ray.get(ref), showing what the actor reports meanwhile under the name `what` (roles of this process:
        the value, already computed)."""
        if self.local:
            return ref
        if self.queue is None:
            return ray.get(ref)
        bars: dict[str, tqdm | _LineBar | _Silent] = {}
        started = time.perf_counter()
        while not ray.wait([ref], timeout=self.POLL_S)[0]:
            self._drain(bars, what)
            if len(bars) > 1 and "" in bars:  # the call does report: its own bar replaces the seconds
                bars.pop("").close()
            if not bars and time.perf_counter() - started > self.QUIET_S:
                bars[""] = self.progress.bar(f"{what} consolidate", None, unit="s", leave=False)
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


class LocalQueue:
    """The progress queue of roles held in this process (the part of `ray.util.queue.Queue` that `Reports` uses)."""

    def __init__(self) -> None:
        self.items: deque = deque()

    def put_nowait(self, item: tuple) -> None:
        self.items.append(item)

    def qsize(self) -> int:
        return len(self.items)

    def get_nowait_batch(self, n: int) -> list:
        return [self.items.popleft() for _ in range(min(n, len(self.items)))]

    def shutdown(self) -> None:
        self.items.clear()
