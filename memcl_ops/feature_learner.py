"""`FeatureLearner`: a "features" method (memcl_ops/methods.py) as one in-process `StreamLearner`, its roles
composed the way pipeline/features.py drives the actors that host them (docs/architecture.md):

* per observed feature batch: route through the slot memory (memcl_ops/mars/slots.py, the store the MemoryManager
  actor holds), which folds it into the anchor statistics; SGSE observes the routing and its expansions add slots
  (up to `sgse.max_slots`) before the next batch is routed;
* at `consolidate`: DCDA stage 1 on the round's labelled rows, then the head learner's fit and end_task on a
  frozen copy of the memory (the copy the head is later evaluated through, as the Stage2Trainer keeps one).

`device`: where the slot memory routes and DCDA stage 1 trains (benchmarks/gpu_check.py). The head learner and the
frozen copy it reads stay on the CPU: stage 2 and the teacher snapshots (memcl_ops/mars/dcda.py) build their
tensors there.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round
from memcl_ops.mars.dcda import train_stage1
from memcl_ops.mars.router import SlotRouter
from memcl_ops.mars.sgse import NoveltyMonitor
from memcl_ops.mars.slots import SlotMemory
from memcl_ops.methods import MethodConfig, MethodSpec, build_head
from memcl_ops.tensors import array_bytes, prefixed, state_part


class FeatureLearner:
    def __init__(self, spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int = 0, device: str = "cpu"):
        self.spec, self.config, self.tags = spec, spec.resolve(config), spec.tags
        self.feature_dim, self.seed, self.device = feature_dim, seed, torch.device(device)
        self.memory = (SlotMemory(feature_dim, self.config.router, self.config.sgse.max_slots, seed).to(self.device)
                       if spec.memory else None)
        self.monitor = NoveltyMonitor(self.config.sgse) if spec.sgse else None
        self.head = build_head(spec, self.config, feature_dim, seed)
        self.trained: SlotRouter | None = None  # the memory as of the last consolidation, what the head reads
        self.block: list[pa.RecordBatch] = []  # the round's batches, learned at `consolidate`
        self.consolidations = 0  # seeds stage 1 (the Stage1Trainer's round counter)

    def begin_round(self, round: Round) -> None:
        del round  # the roles need no boundary: a round is whatever lies between two consolidations

    @torch.no_grad()
    def observe(self, batch: pa.RecordBatch) -> None:
        if self.memory is not None:
            probs = self.memory.route(S.features_to_torch(batch).to(self.device))
            if self.monitor is not None:
                confidence = probs.max(dim=1).values.cpu().numpy()
                self.memory.expand(self.monitor.observe(confidence, S.features_to_numpy(batch)))
        self.block.append(batch)

    def consolidate(self) -> dict[str, object]:
        x, y, _ = S.labelled_block(tuple(self.block))
        self.block = []
        if self.spec.stage1 and len(y):
            train_stage1(self.memory.router, x.to(self.device), y.to(self.device), self.config.stage1,
                         seed=self.seed * 100_003 + self.consolidations)
        self.consolidations += 1
        self._freeze_memory()
        out = self.head.fit(x, y, self.trained) if len(y) else {}
        self.head.end_task(self.trained)
        return out

    def _freeze_memory(self) -> None:
        if self.memory is not None:
            self.trained = SlotRouter.from_state(self.feature_dim, self.config.router, self.memory.router.state())
            self.trained.requires_grad_(False)

    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        return self.head.predict(S.features_to_torch(batch), self.trained)

    def state(self) -> dict[str, np.ndarray]:
        """Between rounds (the runner checkpoints there): the frozen copy then equals the memory."""
        if self.block:
            raise RuntimeError("state() is taken between rounds, after consolidate")
        out = {**prefixed("head", self.head.state()), "consolidations": np.array(self.consolidations)}
        if self.memory is not None:
            out.update(prefixed("memory", self.memory.state()))
        if self.monitor is not None:
            out.update(prefixed("monitor", self.monitor.state()))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.restore(state_part(state, "head"))
        self.consolidations = int(state["consolidations"])
        self.block, self.trained = [], None
        if self.memory is not None:
            self.memory.restore(state_part(state, "memory"))
            self.memory.to(self.device)
            if self.consolidations:
                self._freeze_memory()
        if self.monitor is not None:
            self.monitor.restore(state_part(state, "monitor"))

    def memory_bytes(self) -> dict[str, int]:
        """The head's parts, the slots, and the monitor's whole state: SGSE's own `nbytes` (the pipeline's
        "monitor" figure) counts only its signal, not the open block's feature sums and the test log it carries."""
        out = {f"head.{k}": v for k, v in self.head.memory_bytes().items()}
        if self.memory is not None:
            out["slots"] = self.memory.nbytes()
            out["slot_history"] = array_bytes(self.memory.state()) - self.memory.nbytes()  # and its counters
        if self.monitor is not None:
            out["monitor"] = array_bytes(self.monitor.state())
        return out
