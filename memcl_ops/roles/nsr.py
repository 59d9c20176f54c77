"""The flow of an "nsr" method (NSR and its memoryless allocations, docs/methods.md), written once: the in-process
learner (memcl_ops/learners/nsr.py) runs it over roles in this process, `memcl run` over actors (pipeline/nsr.py).

Per visit of a task:
    the first batches, until their rows make the probe -> adapter_trainer.key (LoRA off) -> bank.arrive
        (allocation "bank": restore / warm start / fresh from the bank; the memoryless rules: fresh or keep)
    -> adapter_trainer.begin_task(plan) -> adapter_trainer.train(batch) for every batch, the probe's first
    -> adapter_trainer.end_task -> bank.store_task(the compressed snapshot)              (allocation "bank")
Evaluation of a task: through its bank entry (the active capacity for the memoryless rules and an evicted task).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memcl_ops.nsr.adapter import ArrivalPlan, NSRConfig
from memcl_ops.nsr.store import BankStore
from memcl_ops.roles.executor import Executor, store_call
from memcl_ops.roles.memory_manager import StoreSpec


def nsr_stores(config: NSRConfig) -> dict[str, StoreSpec]:
    """The memory manager's stores: the bank (none for the memoryless rules, which keep no memory manager)."""
    return {"bank": StoreSpec(BankStore, (config.bank,))} if config.allocation == "bank" else {}


class NSRFlow:
    def __init__(self, executor: Executor, config: NSRConfig):
        self.x, self.config = executor, config
        self.banks = config.allocation == "bank"  # the memoryless rules keep nothing beyond the active capacity

    def arrive(self, probe: Sequence[Any], classes: list[int], previous_best: float | None = None,
               tests: Sequence[Any] = ()) -> tuple[Any, Any]:
        """Take the task key from the probe batches, plan the arrival and begin the visit (`previous_best` and
        `tests`: track a returning task's recovery on its test batches). Returns (the key, the plan); the probe
        batches are trained on next, by the caller, like every other batch."""
        x, key = self.x, None
        if self.banks:
            key = x.call("adapter_trainer", "key", *probe)
            plan = store_call(x, "bank", "arrive", key, self.config.lora.rank)
        else:
            plan = ArrivalPlan("fresh" if self.config.allocation == "fresh" else "keep")
        x.get(x.call("adapter_trainer", "begin_task", classes, plan, previous_best, *tests))
        return key, plan

    def train(self, batch: Any) -> Any:
        return self.x.call("adapter_trainer", "train", batch)

    def end_visit(self, task: int, key: Any, tests: Sequence[Any] = (),
                  wait: Callable[[Any], Any] | None = None) -> dict:
        """The visit's report (accuracy on `tests` live and, with a bank, compressed); with a bank the compressed
        adapter is stored under the task (`evicted`: the tasks the bank's cap pushed out)."""
        x, wait = self.x, wait or self.x.get
        ended = dict(wait(x.call("adapter_trainer", "end_task", self.banks, *tests)))
        if self.banks:
            snapshot = x.call("adapter_trainer", "snapshot")
            ended["evicted"] = x.get(store_call(x, "bank", "store_task", task, key, snapshot, ended["acc_stored"]))
        return ended

    def entry(self, task: int) -> Any:
        """The bank entry a task is answered through (None: the active capacity)."""
        return store_call(self.x, "bank", "entry", task) if self.banks else None

    def evaluate(self, task: int, classes: list[int], tests: Sequence[Any]) -> Any:
        """Accuracy of a task on its test batches."""
        return self.x.call("adapter_trainer", "evaluate_entry", self.entry(task), classes, *tests)
