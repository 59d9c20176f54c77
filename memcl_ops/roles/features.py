"""The flow of a "features" method (MARS, its ablations, the baselines' heads, the analytic heads), written once.
The in-process learner (memcl_ops/feature_learner.py) runs it over roles in this process, `memcl run` over actors
(pipeline/features.py, by actor calls or a compiled graph); both through an `Executor`
(memcl_ops/roles/executor.py), so both compute the same thing.

Per training batch:   slots.route_batch (applies the previous batch's expansions first) -> monitor.observe
Per round:            slots.expand (the last batch's) -> stage2.prequential (test-then-train: the round's batches
                      predicted by the model as it stands) -> stage1.train -> slots.load_trained
                      -> stage2.train (the head, through the trained memory) -> stage2.end_task
Evaluation:           stage2.evaluate / stage2.predict through the memory the head was trained with.

Only the roles the method has exist (`role_plan`); a method without a slot memory hands its features straight to
the head.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from memcl_ops.analytic.ridge import StatisticsStore
from memcl_ops.mars.router import frozen_router
from memcl_ops.mars.slots import SlotStore
from memcl_ops.method_config import MethodConfig
from memcl_ops.prequential import PrequentialConfig
from memcl_ops.roles.executor import Executor, store_call
from memcl_ops.roles.memory_manager import MemoryManager, StoreSpec
from memcl_ops.roles.novelty_monitor import NoveltyMonitor
from memcl_ops.roles.stage1_trainer import Stage1Trainer
from memcl_ops.roles.stage2_trainer import Stage2Trainer
from memcl_ops.spec import MethodSpec

RolePlan = dict[str, tuple[type, tuple[Any, ...]]]  # role -> (its class, the constructor's arguments)


def role_plan(spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int, *, merges: bool = False,
              threads: int | None = None, device: str = "cpu", devices: Mapping[str, str] | None = None,
              near_future: int = PrequentialConfig.near_future) -> RolePlan:
    """The roles a method has and how each is built. `merges`: the memory manager also merges analytic statistics
    summed elsewhere (by encoder replicas); `threads`: the torch threads of each hosting process (None: leave
    them); `device`: where routing, SGSE's reference distances, stage 1 and stage 2's training compute ("auto": a
    GPU where the hosting process sees one); `devices`: per role ("memory", "monitor", "stage1", "stage2"), instead
    of `device`; `near_future`: the k of near-future accuracy (memcl_ops/prequential.py)."""
    method = spec.resolve(config)
    on = lambda role: (devices or {}).get(role, device)  # noqa: E731
    plan: RolePlan = {}
    stores = {}
    if spec.memory:
        stores["slots"] = StoreSpec(SlotStore, (feature_dim, method.router, method.sgse.max_slots, seed, on("memory")))
    if merges:
        stores["statistics"] = StoreSpec(StatisticsStore)
    if stores:
        # one thread: it routes every batch while encoders run, and a second thread would fight them for the cores
        plan["memory"] = (MemoryManager, (stores, None if threads is None else 1))
    if spec.sgse:
        plan["monitor"] = (NoveltyMonitor, (method.sgse, on("monitor")))
    if spec.stage1:
        plan["stage1"] = (Stage1Trainer, (feature_dim, method.router, method.stage1, seed, threads, on("stage1")))
    memory = partial(frozen_router, feature_dim, method.router) if spec.memory else None
    plan["stage2"] = (Stage2Trainer, (method, feature_dim, seed, threads, memory, near_future, on("stage2")))
    return plan


class FeatureFlow:
    """One run's flow over its roles. Holds only the monitor's verdict on the last batch routed (its expansions,
    applied by the next `route` call or at `consolidate`)."""

    def __init__(self, executor: Executor, spec: MethodSpec, config: MethodConfig):
        self.x, self.spec, self.method = executor, spec, spec.resolve(config)
        self.expansions: Any = None

    def learn_batch(self, features: Any, keep: bool = False) -> Any:
        """Route one feature batch and let the monitor judge it; returns the last call (what a caller bounding the
        calls in flight waits on), or `features` for a method without a slot memory. `keep`: the memory manager
        also keeps the batch for `take_block` (a compiled graph, whose batches never reach the driver)."""
        if not self.spec.memory:
            return features
        routed = store_call(self.x, "slots", "route_batch", features, self.expansions, keep)
        if not self.spec.sgse:
            return routed
        self.expansions = self.x.call("monitor", "observe", routed, features)
        return self.expansions

    def end_stream(self) -> Any:
        """The call that applies the last batch's expansions (None: nothing pending)."""
        expansions, self.expansions = self.expansions, None
        return None if expansions is None else store_call(self.x, "slots", "expand", expansions)

    def consolidate(self, batches: list[Any], *, learned: list[bool] | None = None, partials: list[Any] | None = None,
                    progress: Any = None, wait: Callable[[Any], Any] | None = None) -> tuple[dict, dict[str, float]]:
        """Every batch of the round predicted (test-then-train), then stage 1, the head (stage 2) and its task-end
        snapshot on the block of the batches learned. `learned`: per batch, whether the learner took it (None: all;
        the others, skipped by a stream that did not wait, are only predicted); `partials`: analytic statistics
        summed elsewhere, merged by the memory manager and solved from; `progress`: where the trainers report
        epochs; `wait`: how a trainer's call is waited for (default `get`). Returns ({"stage2": the head's report,
        "prequential": the round's predictions (an Arrow table, memcl_ops/prequential.py)}, seconds of stage 1
        and of stage 2)."""
        x, wait = self.x, wait or self.x.get
        t0 = time.perf_counter()
        pending = self.end_stream()
        if pending is not None:
            x.get(pending)
        # before the memory or the head learns the round
        predictions = x.call("stage2", "prequential", *batches, learned=None if learned is None else tuple(learned))
        block = batches if learned is None else [b for b, took in zip(batches, learned, strict=True) if took]
        if self.spec.stage1:
            trained = x.call("stage1", "train", store_call(x, "slots", "memory_state"), *block, progress=progress)
            wait(trained)
            x.get(store_call(x, "slots", "load_trained", trained))
        t1 = time.perf_counter()
        memory = store_call(x, "slots", "memory_state") if self.spec.memory else None
        if partials is not None:
            merged = store_call(x, "statistics", "merge", *partials, half_life=self.method.analytic.half_life)
            report = wait(x.call("stage2", "train_merged", merged, memory, *block, progress=progress))
        else:
            report = wait(x.call("stage2", "train", memory, *block, progress=progress))
        x.get(x.call("stage2", "end_task"))
        return ({"stage2": report, "prequential": x.get(predictions)},
                {"stage1": t1 - t0, "stage2": time.perf_counter() - t1})

    def evaluate(self, features: Any) -> Any:
        """(correct, total) on one labelled feature batch."""
        return self.x.call("stage2", "evaluate", features)

    def confusion(self, features: Any) -> Any:
        """(label, prediction) pairs of one labelled feature batch, for the class confusion matrix."""
        return self.x.call("stage2", "confusion", features)

    def memory_report(self) -> dict[str, int]:
        """Bytes of all persistent memory: the memory manager's stores (and the slot count), the monitor's
        references and the head's parts (`head.*`)."""
        x = self.x
        report = x.get(x.call("memory", "memory_report")) if x.has("memory") else {}
        if x.has("monitor"):
            report["monitor"] = x.get(x.call("monitor", "nbytes"))
        head = x.get(x.call("stage2", "memory_bytes"))
        return {**report, **{f"head.{k}": v for k, v in head.items()}}
