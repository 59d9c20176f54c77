"""NoveltyMonitor actor: SGSE over the routed batches (and, for the reference signal, the frozen features of the
same batch, passed by object reference in the same call: no extra hop), emitting expansion events."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import ray

from actors.clock import StageClock
from memcl_ops.arrow import schema as S
from memcl_ops.mars.sgse import Expansion, SGSEConfig
from memcl_ops.mars.sgse import NoveltyMonitor as SGSE


@ray.remote
class NoveltyMonitor:
    def __init__(self, config: SGSEConfig):
        self.reset(config)

    def reset(self, config: SGSEConfig) -> None:
        self.monitor = SGSE(config)
        self.clock = StageClock()

    def observe(self, routed: pa.RecordBatch | None, features: pa.RecordBatch | None = None) -> list[Expansion]:
        """`routed` is MemoryManager.route's output: sample_id, confidence, query (None: nothing to observe);
        `features` the feature batch it was routed from (row for row), for a signal that reads frozen features."""
        if routed is None:
            return []
        with self.clock.time("monitor"):
            # copies: SGSE keeps rows of a block's trials across batches, and a compiled graph's input lives in a
            # channel buffer that must be released for the next batch (pipeline/compiled_chain.py)
            confidence = routed.column("confidence").to_numpy()
            frozen = np.array(S.features_to_numpy(features)) if self.monitor.needs_features else None
            return self.monitor.observe(confidence, np.array(S.column_matrix(routed, "query")), frozen)

    def counters(self) -> dict[str, int]:
        m = self.monitor
        return {"steps": m.steps, "tests": m.tests, "expansions": m.expansions}

    def test_steps(self) -> list[int]:
        """The stream position (samples observed) at which each block test ran."""
        return list(self.monitor.test_steps)

    def nbytes(self) -> int:
        return self.monitor.nbytes()

    def state(self) -> dict[str, np.ndarray]:
        return self.monitor.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.monitor.restore(state)

    def timings(self) -> dict:
        return self.clock.report()
