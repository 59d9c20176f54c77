"""The novelty monitor role: SGSE over the routed batches and the frozen features of the same batch (passed by object
reference in the same call: no extra hop), emitting expansion events; on a GPU where its placement gives it one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.clock import StageClock
from memcl_ops.mars.sgse import Expansion, SGSEConfig
from memcl_ops.mars.sgse import NoveltyMonitor as SGSE
from memcl_ops.tensors import resolve_device


class NoveltyMonitor:
    """`device`: where the reference signal computes its distances ("auto": the GPU Ray assigned, else the CPU)."""

    def __init__(self, config: SGSEConfig, device: str = "cpu"):
        self.reset(config, device)

    def reset(self, config: SGSEConfig, device: str = "cpu") -> None:
        self.device = resolve_device(device)
        self.monitor = SGSE(config, None if self.device.type == "cpu" else self.device)  # numpy is the CPU's path
        self.clock = StageClock()

    def observe(self, routed: pa.RecordBatch | None, features: pa.RecordBatch) -> list[Expansion]:
        """`routed` is MemoryManager.route's output: sample_id, confidence (None: nothing to observe); `features` the
        feature batch it was routed from (row for row)."""
        if routed is None:
            return []
        with self.clock.time("monitor"):
            # SGSE keeps no row of a batch past the call (block sums), except the reference signal's features, which
            # it copies; so a compiled graph's channel buffer (pipeline/compiled_chain.py) is read in place
            confidence = routed.column("confidence").to_numpy()
            return self.monitor.observe(confidence, S.features_to_numpy(features))

    def counters(self) -> dict[str, int]:
        m = self.monitor
        return {"steps": m.steps, "tests": m.tests, "expansions": m.expansions}

    def test_steps(self) -> list[int]:
        """The stream position (samples observed) at which each block test ran."""
        return list(self.monitor.test_steps)

    def memory_bytes(self) -> dict[str, int]:
        """The references' per-sample feature rows ("rows", within `reference_bytes`) and aggregates."""
        return self.monitor.memory_bytes()

    def state(self) -> dict[str, np.ndarray]:
        return self.monitor.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.monitor.restore(state)

    def timings(self) -> dict:
        return self.clock.report()
