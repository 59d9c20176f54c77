"""`FeatureLearner`: a "features" method (memcl_ops/methods.py) as one in-process `StreamLearner`. It runs the
family's one flow (memcl_ops/roles/features.py) over the same roles the pipeline hosts in actors, held here as plain
objects: what `memcl run` computes, without Ray.

* `observe`: the batch is routed through the slot memory and judged by SGSE (expansions grow the memory before the
  next batch is routed); the batch joins the round's block;
* `consolidate`: the block's batches predicted by the head as it stands (test-then-train, returned as the report's
  "prequential" table), then DCDA stage 1 on the block, then the head and its task-end snapshot.

`near_future`: the k of near-future accuracy (memcl_ops/prequential.py). `device`: where the slot memory routes,
SGSE measures, DCDA stage 1 trains and stage 2's epochs run (an analytic head: where it sums its statistics); the
head is kept and predicts on the CPU, where stage 2 builds its inputs and the teacher snapshots
(memcl_ops/mars/dcda.py) theirs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memcl_ops.learner import Round
from memcl_ops.method_config import MethodConfig
from memcl_ops.prequential import PrequentialConfig
from memcl_ops.roles.executor import InProcess
from memcl_ops.roles.features import FeatureFlow, role_plan
from memcl_ops.spec import MethodSpec
from memcl_ops.tensors import array_bytes, prefixed, state_part


class FeatureLearner:
    def __init__(self, spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int = 0, device: str = "cpu",
                 near_future: int = PrequentialConfig.near_future):
        self.tags = spec.tags
        self.roles = {name: cls(*args) for name, (cls, args) in
                      role_plan(spec, config, feature_dim, seed, device=device, near_future=near_future).items()}
        self.flow = FeatureFlow(InProcess(self.roles), spec, config)
        self.block: list[pa.RecordBatch] = []  # the round's batches, predicted and learned at `consolidate`
        self.learned: list[bool] = []  # per batch of the block: taken (`observe`) or only watched (`watch`)

    def begin_round(self, round: Round) -> None:
        del round  # the roles need no boundary: a round is whatever lies between two consolidations

    def observe(self, batch: pa.RecordBatch) -> None:
        self.flow.learn_batch(batch)
        self.block.append(batch)
        self.learned.append(True)

    def watch(self, batch: pa.RecordBatch) -> None:
        """A batch the learner cannot take (a stream that does not wait): predicted at `consolidate`, not learned."""
        self.block.append(batch)
        self.learned.append(False)

    def consolidate(self) -> dict[str, object]:
        (block, self.block), (learned, self.learned) = (self.block, []), (self.learned, [])
        report, _ = self.flow.consolidate(block, learned=learned)
        return {**report["stage2"], "prequential": report["prequential"]}

    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        return self.roles["stage2"].predict(batch)

    def state(self) -> dict[str, np.ndarray]:
        """Between rounds (the runner checkpoints there): every role's state, as the pipeline checkpoints them."""
        if self.block:
            raise RuntimeError("state() is taken between rounds, after consolidate")
        return {k: v for name, role in self.roles.items() for k, v in prefixed(name, role.state()).items()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.block, self.learned, self.flow.expansions = [], [], None
        for name, role in self.roles.items():
            role.restore(state_part(state, name))

    def memory_bytes(self) -> dict[str, int]:
        """The pipeline's memory report (stores, monitor references, head parts) and what else a checkpoint holds:
        the slots' history, the monitor's open block and test log, the copy of the memory the head reads, and the
        sample ids kept for exactly-once accounting, and the earlier models kept for near-future accuracy."""
        out = {k: v for k, v in self.flow.memory_report().items() if k != "num_slots"}
        states = {name: role.state() for name, role in self.roles.items()}
        ids = sum(array_bytes({"learned": s["learned"]}) for s in states.values() if "learned" in s)
        out["sample_ids"] = ids
        if "memory" in self.roles:
            stores = array_bytes(states["memory"])
            out["store_history"] = stores - sum(v for k, v in out.items() if k in ("slots", "analytic_statistics"))
        if "monitor" in self.roles:
            out["monitor_block"] = array_bytes(states["monitor"]) - out["monitor"]
        out["trained_memory"] = array_bytes(state_part(states["stage2"], "memory"))
        out["near_future_models"] = array_bytes(state_part(states["stage2"], "versions"))
        return out
