"""NoveltyMonitor actor: SGSE over the routing confidences, emitting expansion events."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import ray

from actors.clock import StageClock
from memcl_ops import schema as S
from memcl_ops.sgse import Expansion, SGSEConfig
from memcl_ops.sgse import NoveltyMonitor as SGSE


@ray.remote
class NoveltyMonitor:
    def __init__(self, config: SGSEConfig):
        self.reset(config)

    def reset(self, config: SGSEConfig) -> None:
        self.monitor = SGSE(config)
        self.clock = StageClock()

    def observe(self, routed: pa.RecordBatch | None) -> list[Expansion]:
        """`routed` is MemoryManager.route's output: sample_id, confidence, query (None: nothing to observe)."""
        if routed is None:
            return []
        with self.clock.time("monitor"):
            confidence = routed.column("confidence").to_numpy()
            return self.monitor.observe(confidence, S.column_matrix(routed, "query"))

    def counters(self) -> dict[str, int]:
        m = self.monitor
        return {"steps": m.steps, "tests": m.tests, "expansions": m.expansions}

    def state(self) -> dict[str, np.ndarray]:
        return self.monitor.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.monitor.restore(state)

    def timings(self) -> dict:
        return self.clock.report()
