"""NSR's compressed LoRA bank as a store of the memory manager (memcl_ops/roles/memory_manager.py): arrival plans
from the bank's retrieval, and storage of each visit's compressed adapter."""

from __future__ import annotations

import numpy as np

from memcl_ops.nsr.adapter import ArrivalPlan, Snapshot, plan_arrival
from memcl_ops.nsr.task_bank import BankConfig, BankEntry, TaskKnowledgeBank


class BankStore(TaskKnowledgeBank):
    def __init__(self, config: BankConfig):
        super().__init__(config)

    def arrive(self, key: np.ndarray, rank: int) -> ArrivalPlan:
        """NSR task arrival: the bank's retrieval (restore / warm-start mix of rank `rank` / fresh)."""
        return plan_arrival(self, key, rank)

    def store_task(self, task: int, key: np.ndarray, snapshot: Snapshot, accuracy: float) -> list[int]:
        """Store (or overwrite) a task's compressed adapter; returns the tasks evicted by the top-K cap."""
        return self.store(snapshot.entry(task, key, accuracy))

    def entry(self, task: int) -> BankEntry | None:
        return self.entries.get(task)

    def bank_summary(self) -> dict:
        return {"entries": self.summary(), "evicted": self.evicted, "arrivals": self.clock}

    def report(self) -> dict[str, int]:
        return {"bank": self.nbytes()}
