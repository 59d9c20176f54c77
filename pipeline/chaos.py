"""Chaos mode (`runtime.chaos_seconds`): from set-up to the stream's end, kill one actor of the run every SECONDS,
whatever it is doing at that moment (starting, encoding the feature cache, streaming, committing, evaluating, being
restored, reporting), the way preemption, OOM kills and node drains do on a cluster. Set-up starts again
(pipeline/runner.py) and the loop (pipeline/loop.py) restores the last committed state and replays, so a run under
chaos ends with the fault-free run's result. Which role dies at each kill is drawn from the run's
seed; when a kill lands depends on the wall clock, which is what reaches the moments a seeded test does not pick."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import ray

from memcl.pipeline.actor_cache import ActorCache

log = logging.getLogger("memcl")


class Chaos:
    """A background thread that kills a random actor of `roles()` every `seconds` (Ray restarts it, or the loop
    starts a new one). `kills` lists (seconds since start, role)."""

    def __init__(self, actors: ActorCache, roles: Callable[[], list[str]], seconds: float, seed: int):
        self.actors, self.roles, self.seconds = actors, roles, seconds
        self.draw = random.Random(seed)
        self.kills: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memcl-chaos", daemon=True)
        self._start = 0.0

    def __enter__(self) -> Chaos:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            role = self.draw.choice(self.roles())
            try:
                ray.kill(self.actors.handle(role), no_restart=False)
            except (KeyError, ValueError):  # the role was just being replaced: its old handle is gone
                continue
            self.kills.append((time.perf_counter() - self._start, role))
            log.info("chaos: killed the %s actor", role)

    def report(self) -> dict:
        return {"seconds": self.seconds, "kills": len(self.kills), "by_role": dict(Counter(r for _, r in self.kills))}
