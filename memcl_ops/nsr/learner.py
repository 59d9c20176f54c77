"""`NSRLearner`: an "nsr" method (NSR and its memoryless allocations, docs/methods.md, "NSR") as one in-process
`StreamLearner`, driven the way pipeline/nsr.py drives the AdapterTrainer and the MemoryManager's bank.

A round is a visit of one task. Its first batches are held until `probe_size` rows have arrived (or the round
ends): their LoRA-off mean feature is the task key, the allocation rule plans the arrival (bank retrieval, or
fresh / keep), and from then on every batch is trained on as it comes. `consolidate` compresses the active
adapter and stores it in the bank under the task. `predict` reads each row's task from the task column and answers
through that task's bank entry (the active capacity for the memoryless rules and for an evicted task), with the
task's global class ids (-1 for a head output beyond the task's classes).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round
from memcl_ops.methods import MethodConfig, MethodSpec
from memcl_ops.models.encoders import EncoderSpec, build_encoder
from memcl_ops.nsr.adapter import AdapterLearner, ArrivalPlan, plan_arrival
from memcl_ops.nsr.task_bank import TaskKnowledgeBank
from memcl_ops.tensors import parameter_bytes, prefixed, state_part


class NSRLearner:
    def __init__(self, spec: MethodSpec, config: MethodConfig, encoder: EncoderSpec, payload: str, n_way: int,
                 seed: int = 0):
        self.tags = spec.tags
        self.config = spec.resolve(config).nsr
        self.learner = AdapterLearner(build_encoder(encoder, payload), self.config, n_way, seed)
        self.bank = TaskKnowledgeBank(self.config.bank) if self.config.allocation == "bank" else None
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
            self.learner.train_batch(batch)
            return
        self.probe.append(batch)
        if sum(b.num_rows for b in self.probe) >= self.config.probe_size:
            self._arrive()

    def _arrive(self) -> None:
        """Key, arrival plan and start of the visit, then the held batches are trained on in order."""
        if self.bank is not None:
            self.key = self.learner.key(self.probe)
            plan = plan_arrival(self.bank, self.key, self.config.lora.rank)
        else:
            plan = ArrivalPlan("fresh" if self.config.allocation == "fresh" else "keep")
        self.learner.begin_task(self.round.classes, plan)
        self.arrival = plan.kind
        for batch in self.probe:
            self.learner.train_batch(batch)
        self.probe = []

    def consolidate(self) -> dict[str, object]:
        if not self.arrival:
            self._arrive()
        out: dict[str, object] = {"arrival": self.arrival, "steps": self.learner.steps}
        if self.bank is not None:
            out["evicted"] = self.bank.store(self.learner.snapshot().entry(self.round.task, self.key))
        self.arrival = ""
        return out

    @torch.no_grad()
    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        tasks = S.task_ids_to_numpy(batch)
        out = np.full(batch.num_rows, -1, np.int64)
        for task in np.unique(tasks):
            if int(task) not in self.task_classes:
                raise ValueError(f"task {int(task)} has not been streamed; NSR answers a task through what it learned")
            rows = batch.filter(pc.equal(batch.column(S.TASK_ID), int(task)))
            entry = self.bank.entries.get(int(task)) if self.bank is not None else None
            if entry is None:
                logits = self.learner.logits(rows)
            else:
                with self.learner.holding(entry):
                    logits = self.learner.logits(rows)
            classes = np.array([*self.task_classes[int(task)], *[-1] * self.learner.n_way])
            out[tasks == task] = classes[logits.argmax(1).cpu().numpy()]
        return out

    def state(self) -> dict[str, np.ndarray]:
        """Between visits, as the runner checkpoints: the active capacity, the bank and the tasks' classes."""
        if self.probe or self.arrival:
            raise RuntimeError("state() is taken between rounds, after consolidate")
        tasks, n_way = sorted(self.task_classes), self.learner.n_way
        padded = [self.task_classes[t] + [-1] * (n_way - len(self.task_classes[t])) for t in tasks]
        out = {**prefixed("adapter", self.learner.state()), "tasks": np.array(tasks, np.int64),
               "task_classes": np.array(padded, np.int64).reshape(len(tasks), n_way)}
        if self.bank is not None:
            out.update(prefixed("bank", self.bank.state()))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.learner.restore(state_part(state, "adapter"))
        self.task_classes = {int(t): [int(c) for c in row if c >= 0]
                             for t, row in zip(state["tasks"], state["task_classes"])}
        self.round, self.probe, self.key, self.arrival = None, [], None, ""
        if self.bank is not None:
            self.bank.restore(state_part(state, "bank"))

    def memory_bytes(self) -> dict[str, int]:
        """The bank (the pipeline's figure) and the active capacity: the LoRA factors (trained weights, not memory
        of past data, but what a checkpoint holds) and the head; plus the int64 class and task indices."""
        learner, n_way = self.learner, self.learner.n_way
        out = {"adapter": parameter_bytes(learner.adapters.parameters()),
               "head": parameter_bytes(learner.head.parameters()),
               "bookkeeping": 8 * (len(learner.classes) + len(self.task_classes) * (1 + n_way))}
        if self.bank is not None:
            out["bank"] = self.bank.nbytes()
            out["bookkeeping"] += 8 * (len(self.bank.entries) + len(self.bank.evicted))
        return out
