"""`NSRLearner`: an "nsr" method (NSR and its memoryless allocations, docs/methods.md, "NSR") as one in-process
`StreamLearner`. It runs the family's one flow (memcl_ops/roles/nsr.py) over the same roles the pipeline hosts in
actors (the adapter trainer; the memory manager's bank), held here as plain objects.

A round is a visit of one task. Its first batches are held until their rows make the probe (`probe_full`; or the
round ends): the task key, the arrival plan, and from then on every batch is trained on as it comes. `consolidate`
ends the visit (with a bank: the compressed adapter stored under the task) and reports the visit's training batches as
predicted before they were learned ("prequential"). `predict` reads each row's task from the
task column and answers through that task's bank entry (the active capacity for the memoryless rules and for an
evicted task; with task_heads the task's own head), with the task's global class ids (-1 for a head output beyond
the task's classes). Rows without a task id (a bank's rules only) are answered as one batch through the entry
nearest their key (task-agnostic inference).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round
from memcl_ops.method_config import MethodConfig
from memcl_ops.models.encoders import EncoderSpec
from memcl_ops.nsr.adapter import probe_full
from memcl_ops.prequential import PrequentialConfig
from memcl_ops.roles.adapter_trainer import AdapterTrainer
from memcl_ops.roles.executor import InProcess
from memcl_ops.roles.memory_manager import MemoryManager
from memcl_ops.roles.nsr import NSRFlow, nsr_stores
from memcl_ops.spec import MethodSpec
from memcl_ops.tensors import array_bytes, parameter_bytes, prefixed, state_part


class NSRLearner:
    def __init__(self, spec: MethodSpec, config: MethodConfig, encoder: EncoderSpec, payload: str, n_way: int,
                 seed: int = 0, near_future: int = PrequentialConfig.near_future):
        self.tags = spec.tags
        self.config = spec.resolve(config).nsr
        self.trainer = AdapterTrainer(encoder, payload, self.config, n_way, seed, near_future=near_future)
        self.roles: dict[str, object] = {"adapter_trainer": self.trainer}
        if stores := nsr_stores(self.config):
            self.roles["memory"] = MemoryManager(stores)
        self.flow = NSRFlow(InProcess(self.roles), self.config)
        self.task_classes: dict[int, list[int]] = {}  # every task seen, for predict
        self.round: Round | None = None
        self.probe: list[pa.RecordBatch] = []  # the visit's first batches, until the key is taken
        self.key: np.ndarray | None = None
        self.arrival = ""

    def begin_round(self, round: Round) -> None:
        if round.task is None or not round.classes:
            raise ValueError("NSR is task-aware: every round is a visit of one task with its classes")
        self.round, self.probe, self.key = round, [], None
        self.task_classes[round.task] = list(round.classes)

    def observe(self, batch: pa.RecordBatch) -> None:
        if self.arrival:
            self.flow.train(batch)
            return
        self.probe.append(batch)
        if probe_full(sum(b.num_rows for b in self.probe), self.config.probe_size):
            self._arrive()

    def _arrive(self) -> None:
        """Key, arrival plan and start of the visit, then the held batches are trained on in order."""
        self.key, plan = self.flow.arrive(self.probe, list(self.round.classes), self.round.task)
        self.arrival = plan.kind
        for batch in self.probe:
            self.flow.train(batch)
        self.probe = []

    def consolidate(self) -> dict[str, object]:
        if not self.arrival:
            self._arrive()
        ended = self.flow.end_visit(self.round.task, self.key)
        out: dict[str, object] = {"arrival": self.arrival, "steps": ended["steps"],
                                  "prequential": ended["prequential"]}
        if "evicted" in ended:
            out["evicted"] = ended["evicted"]
        self.arrival = ""
        return out

    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        out = np.full(batch.num_rows, -1, np.int64)
        unknown = batch.column(S.TASK_ID).is_null().to_numpy(zero_copy_only=False)
        if unknown.any():
            out[unknown] = self.flow.predict_agnostic(batch.filter(pa.array(unknown)), self.task_classes)[0]
        if unknown.all():
            return out
        batch = batch.filter(pa.array(~unknown))
        tasks = S.task_ids_to_numpy(batch)
        known = np.full(batch.num_rows, -1, np.int64)
        for task in np.unique(tasks):
            if int(task) not in self.task_classes:
                raise ValueError(f"task {int(task)} has not been streamed; NSR answers a task through what it learned")
            rows = batch.filter(pc.equal(batch.column(S.TASK_ID), int(task)))
            known[tasks == task] = self.trainer.predict_with(self.flow.entry(int(task)),
                                                             self.task_classes[int(task)], rows)
        out[~unknown] = known
        return out

    def state(self) -> dict[str, np.ndarray]:
        """Between visits, as the runner checkpoints: the roles' states (the active capacity, the bank) and the
        tasks' classes."""
        if self.probe or self.arrival:
            raise RuntimeError("state() is taken between rounds, after consolidate")
        tasks, n_way = sorted(self.task_classes), self.trainer.learner.n_way
        padded = [self.task_classes[t] + [-1] * (n_way - len(self.task_classes[t])) for t in tasks]
        out = {k: v for name, role in self.roles.items() for k, v in prefixed(name, role.state()).items()}
        out.update(tasks=np.array(tasks, np.int64), task_classes=np.array(padded, np.int64).reshape(len(tasks), n_way))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        for name, role in self.roles.items():
            role.restore(state_part(state, name))
        self.task_classes = {int(t): [int(c) for c in row if c >= 0]
                             for t, row in zip(state["tasks"], state["task_classes"])}
        self.round, self.probe, self.key, self.arrival = None, [], None, ""

    def memory_bytes(self) -> dict[str, int]:
        """The bank (the pipeline's figure) and the active capacity: the LoRA factors (trained weights, not memory
        of past data, but what a checkpoint holds) and the head; plus the int64 class and task indices and the sample
        ids kept for exactly-once accounting."""
        learner, n_way = self.trainer.learner, self.trainer.learner.n_way
        out = {"adapter": parameter_bytes(learner.adapters.parameters()),
               "head": parameter_bytes(learner.head.parameters()),
               "bookkeeping": 8 * (len(learner.classes) + len(self.task_classes) * (1 + n_way)),
               "sample_ids": int(self.trainer.learned.ranges.nbytes),
               "near_future_models": array_bytes(self.trainer.earlier.state(lambda capacity: capacity))}
        stores = self.roles["memory"].stores if "memory" in self.roles else {}
        if "bank" in stores:
            bank = stores["bank"]
            out.update(bank.report())
            out["bookkeeping"] += 8 * (len(bank.entries) + len(bank.evicted))
        if "heads" in stores:
            out.update(stores["heads"].report())
            out["bookkeeping"] += 8 * len(stores["heads"].heads)
        return out
