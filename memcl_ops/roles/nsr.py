"""The flow of an "nsr" method (NSR, the other rules on its bank and the memoryless allocations, docs/methods.md),
written once: the in-process learner (memcl_ops/learners/nsr.py) runs it over roles in this process, `memcl run` over
actors (pipeline/nsr.py).

Per visit of a task:
    the first batches, until their rows make the probe -> adapter_trainer.key (LoRA off)
        -> [learned rule: adapter_trainer.probe_losses of the bank's top-m candidates] -> bank.arrive
        (the bank's rules: similarity / round-robin / learned; the memoryless rules: fresh or keep, with
        task_heads the task's own head from the head store)
    -> [learned rule, learning: adapter_trainer.start_accuracies of every action -> bank.reward]
    -> adapter_trainer.begin_task(plan) -> adapter_trainer.train(batch) for every batch, the probe's first
    -> adapter_trainer.end_task -> bank.store_task(the compressed snapshot)        (the bank's rules)
                                -> heads.store_head(the head)                     (memoryless with task_heads)
Evaluation of a task: through its bank entry (the active capacity for the memoryless rules and an evicted task; with
task_heads the active adapter and the task's own head). Without a task id (`predict_agnostic`): each batch through
the bank entry nearest its key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memcl_ops.nsr.adapter import ArrivalPlan, NSRConfig
from memcl_ops.nsr.store import BankStore, HeadStore
from memcl_ops.roles.executor import Executor, store_call
from memcl_ops.roles.memory_manager import StoreSpec


def nsr_stores(config: NSRConfig) -> dict[str, StoreSpec]:
    """The memory manager's stores: the bank (the bank's rules), the heads (memoryless with task_heads), or none
    (the memoryless rules keep no memory manager)."""
    if config.banked:
        return {"bank": StoreSpec(BankStore, (config,))}
    return {"heads": StoreSpec(HeadStore)} if config.task_heads else {}


class NSRFlow:
    def __init__(self, executor: Executor, config: NSRConfig):
        self.x, self.config = executor, config
        self.banks = config.banked  # the memoryless rules keep nothing beyond the active capacity (and heads)
        self.heads = config.task_heads

    def arrive(self, probe: Sequence[Any], classes: list[int], task: int | None = None,
               previous_best: float | None = None, tests: Sequence[Any] = ()) -> tuple[Any, Any]:
        """Take the task key from the probe batches, plan the arrival and begin the visit of `task` (`previous_best`
        and `tests`: track a returning task's recovery on its test batches; a learning policy is rewarded on them).
        Returns (the key, the plan); the probe batches are trained on next, by the caller, like every other batch."""
        x, cfg, key = self.x, self.config, None
        if self.banks:
            key = x.call("adapter_trainer", "key", *probe)
            losses = None
            if cfg.allocation == "learned":
                candidates = store_call(x, "bank", "candidates", key)
                losses = x.call("adapter_trainer", "probe_losses", candidates, classes, *probe)
            plan = store_call(x, "bank", "arrive", key, cfg.lora.rank, task, losses)
            if cfg.allocation == "learned" and cfg.policy.learn:
                if not tests:
                    raise ValueError("nsr.policy.learn rewards each arrival on the task's test rows; none given")
                plans = store_call(x, "bank", "action_plans")
                rewards = x.call("adapter_trainer", "start_accuracies", plans, classes, *tests)
                x.get(store_call(x, "bank", "reward", rewards))
        else:
            head = store_call(x, "heads", "head", task) if self.heads else None
            plan = ArrivalPlan("fresh" if cfg.allocation == "fresh" else "keep", head=x.get(head) if self.heads
                               else None)
        x.get(x.call("adapter_trainer", "begin_task", classes, plan, previous_best, *tests))
        return key, plan

    def train(self, batch: Any) -> Any:
        return self.x.call("adapter_trainer", "train", batch)

    def end_visit(self, task: int, key: Any, tests: Sequence[Any] = (),
                  wait: Callable[[Any], Any] | None = None) -> dict:
        """The visit's report (accuracy on `tests` live and, with a bank, compressed); with a bank the compressed
        adapter is stored under the task (`evicted`: the tasks the bank's cap pushed out); with task_heads the
        head is kept."""
        x, wait = self.x, wait or self.x.get
        ended = dict(wait(x.call("adapter_trainer", "end_task", self.banks, *tests)))
        if self.banks:
            snapshot = x.call("adapter_trainer", "snapshot")
            ended["evicted"] = x.get(store_call(x, "bank", "store_task", task, key, snapshot, ended["acc_stored"]))
        elif self.heads:
            x.get(store_call(x, "heads", "store_head", task, x.call("adapter_trainer", "head_state")))
        return ended

    def entry(self, task: int) -> Any:
        """What a task is answered through: its bank entry, its kept head (with the active adapter), or None (the
        active capacity)."""
        if self.banks:
            return store_call(self.x, "bank", "entry", task)
        return store_call(self.x, "heads", "entry", task) if self.heads else None

    def evaluate(self, task: int, classes: list[int], tests: Sequence[Any]) -> Any:
        """Accuracy of a task on its test batches."""
        return self.x.call("adapter_trainer", "evaluate_entry", self.entry(task), classes, *tests)

    def predict_agnostic(self, batch: Any, task_classes: dict[int, list[int]]) -> Any:
        """A batch without its task id, answered through the bank entry nearest the batch's key: (the global class of
        every row, the task of the entry it went through; -1 for an empty bank)."""
        if not self.banks:
            raise ValueError(f"nsr.allocation={self.config.allocation} keeps no keys: it needs each row's task id")
        entry = store_call(self.x, "bank", "route", self.x.call("adapter_trainer", "key", batch))
        return self.x.call("adapter_trainer", "answer_routed", entry, task_classes, batch)
