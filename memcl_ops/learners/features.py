"""`FeatureLearner`: a "features" method (memcl_ops/methods.py) as one in-process `StreamLearner`. It runs the
family's one flow (memcl_ops/roles/features.py) over the same roles the pipeline hosts in actors, held here as plain
objects, with a stream that waits for each consolidation:

* `observe`: the batch is routed through the slot memory and judged by SGSE (expansions grow the memory before the
  next batch is routed), then predicted by the served model and learned by the method's per-batch step, and its
  labelled rows join the consolidation buffer;
* `consolidate`: the round's rows consolidated (DCDA stage 1, the trained head and its task-end snapshot) and
  published; the report holds the round's predictions as "prequential".

`near_future`: the k of near-future accuracy (memcl_ops/prequential.py). `device`: where the slot memory routes,
SGSE measures, DCDA stage 1 trains and stage 2's epochs run (an analytic head: where it sums its statistics); the
head is kept and predicts on the CPU.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memcl_ops.buffer import BufferConfig
from memcl_ops.learner import Round
from memcl_ops.method_config import MethodConfig
from memcl_ops.prequential import PrequentialConfig
from memcl_ops.realtime import StreamClock
from memcl_ops.roles.executor import InProcess
from memcl_ops.roles.features import FeatureFlow, role_plan
from memcl_ops.spec import MethodSpec
from memcl_ops.tensors import array_bytes, prefixed, state_part


class FeatureLearner:
    def __init__(self, spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int = 0, device: str = "cpu",
                 near_future: int = PrequentialConfig.near_future, buffer: BufferConfig = BufferConfig()):
        self.tags = spec.tags
        self.roles = {name: cls(*args) for name, (cls, args) in
                      role_plan(spec, config, feature_dim, seed, device=device, near_future=near_future,
                                buffer=buffer).items()}
        self.flow = FeatureFlow(InProcess(self.roles), spec, config)
        self.clock = StreamClock()  # the stream waits: a consolidation is published when the round ends
        self.predictions: list[pa.Table] = []  # the round's test-then-train predictions

    def begin_round(self, round: Round) -> None:
        del round  # the roles need no boundary: a round is whatever lies between two consolidations

    def observe(self, batch: pa.RecordBatch) -> None:
        self.flow.route(batch)
        self.predictions.append(self.flow.step(batch))

    def consolidate(self) -> dict[str, object]:
        self.flow.end_round(self.clock)
        (published,) = self.flow.advance(self.clock, 0.0)
        predictions, self.predictions = self.predictions, []
        report = {k: v for k, v in published.report.items() if k != "installed_at"}
        return {**report, "prequential": pa.concat_tables(predictions) if predictions
                else self.roles["predictor"].step()}

    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        return self.roles["predictor"].predict(batch)

    def state(self) -> dict[str, np.ndarray]:
        """Between rounds (the runner checkpoints there): every role's state, as the pipeline checkpoints them."""
        if self.predictions:
            raise RuntimeError("state() is taken between rounds, after consolidate")
        return {k: v for name, role in self.roles.items() for k, v in prefixed(name, role.state()).items()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.predictions, self.flow.expansions = [], None
        for name, role in self.roles.items():
            # a trainer's head between consolidations is the predictor's published snapshot
            role.restore(state_part(state, "predictor" if name == "stage2" else name))
        # the stream waited: every consolidation so far was published (its count seeds the next)
        self.clock = StreamClock(published=self.roles["predictor"].version)

    def memory_bytes(self) -> dict[str, int]:
        """The pipeline's memory report (stores, monitor references, the served head's parts, the prototypes and the
        buffer) and what else a checkpoint holds: the slots' history, the monitor's open block and test log, the
        copy of the memory the head reads, the sample ids kept for exactly-once accounting and the earlier models
        kept for near-future accuracy."""
        out = {k: v for k, v in self.flow.memory_report().items() if k != "num_slots"}
        states = {name: role.state() for name, role in self.roles.items()}
        served = states["predictor"]
        out["sample_ids"] = array_bytes(state_part(served, "learned"))
        if "memory" in self.roles:
            out["store_history"] = array_bytes(states["memory"]) - out["slots"]
        if "monitor" in self.roles:
            out["monitor_block"] = array_bytes(states["monitor"]) - out["monitor.rows"] - out["monitor.aggregates"]
        out["trained_memory"] = array_bytes(state_part(served, "memory"))
        out["near_future_models"] = array_bytes(state_part(served, "versions"))
        out["bookkeeping"] = array_bytes({k: v for k, v in served.items() if k == "counters"}) + array_bytes(
            state_part(served, "in_flight")) + array_bytes(state_part(served, "buffer")) - out["buffer"]
        return out
