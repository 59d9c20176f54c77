"""The flow of a "features" method (MARS, its ablations, the baselines' heads, the analytic heads), written once.
The pipeline (pipeline/features.py) runs it over actors (by actor calls or a compiled graph) or over roles held in
this process, through an `Executor` (memcl_ops/roles/executor.py), so both compute the same thing.

Per training batch:   slots.route_batch (applies the previous batch's expansions first) -> monitor.observe;
                      predictor.step: the batch predicted by the served model, then learned by the per-batch step
                      and buffered (memcl_ops/roles/predictor.py)
At a round's end:     predictor.end_round: its rows are due for consolidation
A consolidation:      slots.expand (the last batch's) -> predictor.take_block (one due round) -> stage1.train
                      -> stage2.consolidate (a trained head: the head, through the trained memory, and its task-end
                      snapshot), in the background
Publishing it:        slots.load_trained -> predictor.install: the next model version
Evaluation:           predictor.evaluate / predictor.predict, the model served now.

When a consolidation starts and is published is the stream clock's call (memcl_ops/realtime.py): `advance`. Only
the roles the method has exist (`role_plan`); a method without a slot memory hands its features straight to the
predictor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from memcl_ops.buffer import BufferConfig
from memcl_ops.mars.router import frozen_router
from memcl_ops.mars.slots import SlotStore
from memcl_ops.method_config import MethodConfig
from memcl_ops.prequential import PrequentialConfig
from memcl_ops.realtime import StreamClock
from memcl_ops.roles.executor import Executor, store_call
from memcl_ops.roles.memory_manager import MemoryManager, StoreSpec
from memcl_ops.roles.novelty_monitor import NoveltyMonitor
from memcl_ops.roles.predictor import Predictor
from memcl_ops.roles.stage1_trainer import Stage1Trainer
from memcl_ops.roles.stage2_trainer import Stage2Trainer
from memcl_ops.spec import MethodSpec

RolePlan = dict[str, tuple[type, tuple[Any, ...]]]  # role -> (its class, the constructor's arguments)
TRAINED_HEADS = ("distill", "ewc", "joint", "derpp")  # heads the stage 2 trainer consolidates in the background


def role_plan(spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int, *, threads: int | None = None,
              device: str = "cpu", devices: Mapping[str, str] | None = None,
              near_future: int = PrequentialConfig.near_future, buffer: BufferConfig = BufferConfig()) -> RolePlan:
    """The roles a method has and how each is built. `threads`: the torch threads of each hosting process (None:
    leave them); `device`: where routing, SGSE's reference distances, stage 1 and stage 2's training compute
    ("auto": a GPU where the hosting process sees one), and where a head of sums sums its statistics; `devices`: per
    role ("memory", "monitor", "stage1", "stage2", "predictor"), instead of `device`; `near_future`: the k of
    near-future accuracy (memcl_ops/prequential.py); `buffer`: the consolidation buffer's budget and policy."""
    method = spec.resolve(config)
    on = lambda role: (devices or {}).get(role, device)  # noqa: E731
    plan: RolePlan = {}
    if spec.memory:
        stores = {"slots": StoreSpec(SlotStore, (feature_dim, method.router, method.sgse.max_slots, seed,
                                                 on("memory")))}
        # one thread: it routes every batch while encoders run, and a second thread would fight them for the cores
        plan["memory"] = (MemoryManager, (stores, None if threads is None else 1))
    if spec.sgse:
        plan["monitor"] = (NoveltyMonitor, (method.sgse, on("monitor")))
    if spec.stage1:
        plan["stage1"] = (Stage1Trainer, (feature_dim, method.router, method.stage1, seed, threads, on("stage1")))
    memory = partial(frozen_router, feature_dim, method.router) if spec.memory else None
    if spec.head in TRAINED_HEADS:
        plan["stage2"] = (Stage2Trainer, (method, feature_dim, seed, threads, memory, on("stage2")))
    plan["predictor"] = (Predictor, (method, feature_dim, seed, threads, memory, near_future, buffer, on("predictor")))
    return plan


@dataclass
class Consolidation:
    """The handles of the consolidation running in the background."""

    trained: Any  # stage 1's memory state (None: no stage 1)
    snapshot: Any  # stage 2's snapshot of a trained head (None: the head settles at install)
    memory: Any  # the memory state the head reads after it (None: no memory)
    submitted: float  # the wall-clock time it was handed to the trainers


@dataclass(frozen=True)
class Published:
    """A consolidation made the served model: the handle of its install's report, and when it was submitted."""

    report: Any
    submitted: float


class FeatureFlow:
    """One run's flow over its roles. Holds the monitor's verdict on the last batch routed (its expansions, applied
    by the next `route` call or when a consolidation starts) and the consolidation in flight."""

    def __init__(self, executor: Executor, spec: MethodSpec, config: MethodConfig):
        self.x, self.spec, self.method = executor, spec, spec.resolve(config)
        self.expansions: Any = None
        self.job: Consolidation | None = None

    def route(self, features: Any, keep: bool = False) -> Any:
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

    def step(self, *features: Any) -> Any:
        """The batches predicted, learned by the per-batch step and buffered (their predictions' handle)."""
        return self.x.call("predictor", "step", *features)

    def end_round(self, clock: StreamClock) -> None:
        """The round's rows are due for consolidation."""
        self.x.call("predictor", "end_round")
        clock.due += 1

    def end_stream(self) -> Any:
        """The call that applies the last batch's expansions (None: nothing pending)."""
        expansions, self.expansions = self.expansions, None
        return None if expansions is None else store_call(self.x, "slots", "expand", expansions)

    # -- consolidation, scheduled by the stream's clock --

    def advance(self, clock: StreamClock, now: float, *, final: bool = False, progress: Any = None
                ) -> list[Published]:
        """Everything the clock has done by `now`: publish the consolidation in flight once it is due (or done,
        "wall"), start the next once a round has ended and the trainers are free. `final`: the stream has ended,
        the trainers work off the rounds still due, oldest first. Returns what was published."""
        published = []
        while True:
            if self.job is not None and (final or clock.publishes_by(now) or self._done(clock)):
                published.append(self.publish())
                clock.end(now)
                continue
            if self.job is None and (clock.due or (final and self.x.get(self.x.call("predictor", "due_rows")))):
                self.begin(clock, now, progress, newest=not final)
                continue
            return published

    def _done(self, clock: StreamClock) -> bool:
        return clock.mode == "wall" and self.x.ready(self.job.snapshot or self.job.trained or self.job.memory)

    def begin(self, clock: StreamClock, now: float, progress: Any = None, newest: bool = True) -> None:
        """Start a consolidation of the newest due round (`newest` False: the oldest); the clock learns its size
        where its cost depends on it."""
        x = self.x
        self.end_stream()  # stage 1 trains every slot SGSE has added (the memory manager runs it first)
        memory = store_call(x, "slots", "memory_state") if self.spec.memory else None
        block = x.call("predictor", "take_block", memory, newest)
        clock.begin(now, x.get(x.call("predictor", "in_flight_rows")) if clock.cost else 0)
        self.job = self._submit(memory, block, clock.published, progress)

    def resume(self, clock: StreamClock, progress: Any = None) -> None:
        """After a restore: the consolidation the clock has in flight starts again from its inputs, which the
        predictor kept."""
        if clock.job is None or self.job is not None:
            return
        block, memory = self.x.get(self.x.call("predictor", "consolidation"))
        self.job = self._submit(memory, block, clock.published, progress)

    def _submit(self, memory: Any, block: Any, consolidation: int, progress: Any) -> Consolidation:
        x = self.x
        trained = (x.call("stage1", "train", memory, block, consolidation=consolidation, progress=progress)
                   if self.spec.stage1 else None)
        head_memory = trained if trained is not None else memory
        snapshot = (x.call("stage2", "consolidate", head_memory, block, progress=progress) if x.has("stage2")
                    else None)
        return Consolidation(trained, snapshot, head_memory, time.time())

    def publish(self) -> Published:
        """The consolidation in flight becomes the served model."""
        x, job, self.job = self.x, self.job, None
        if job.trained is not None:
            store_call(x, "slots", "load_trained", job.trained)
        if job.snapshot is not None:
            return Published(x.call("predictor", "install", job.snapshot), job.submitted)
        return Published(x.call("predictor", "install", None, job.memory), job.submitted)

    def forget_job(self) -> None:
        """The roles were restored: the handles of a consolidation in flight belong to the actors before."""
        self.job, self.expansions = None, None

    # -- the served model --

    def evaluate(self, features: Any) -> Any:
        """(correct, total) on one labelled feature batch."""
        return self.x.call("predictor", "evaluate", features)

    def confusion(self, features: Any) -> Any:
        """(label, prediction) pairs of one labelled feature batch, for the class confusion matrix."""
        return self.x.call("predictor", "confusion", features)

    def memory_report(self) -> dict[str, int]:
        """Bytes of all persistent memory: the memory manager's stores (and the slot count), the monitor's
        references (`monitor.rows`: the per-sample features they keep; `monitor.aggregates`), the served head's parts
        (`head.*`), the prototypes and the buffer."""
        x = self.x
        report = x.get(x.call("memory", "memory_report")) if x.has("memory") else {}
        if x.has("monitor"):
            report.update({f"monitor.{k}": v for k, v in x.get(x.call("monitor", "memory_bytes")).items()})
        return {**report, **x.get(x.call("predictor", "memory_bytes"))}
