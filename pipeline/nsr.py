"""The pipeline of the "nsr" family: LoRA adapters trained *inside* the frozen encoder on raw batches, so no
feature cache. Per visit of a task (one round):

    source.train_batch ──> trainer.key (first rows, LoRA off) ──> memory.arrive      (allocation "bank")
                       └─> trainer.begin_task(plan) ─> trainer.train(batch) … ─> trainer.end_task
                           (each batch predicted, then learned)
                                                                          └─> memory.store_task(snapshot)
    then every seen task is evaluated: with its bank entry (or the active capacity for the memoryless
    allocations and for evicted tasks).

Allocations (docs/methods.md, "NSR"): "bank" is NSR's similarity rule, "round-robin" and "learned" other rules on
the same bank; "fresh" and "keep" (methods nsr-fresh, nsr-keep; with task_heads nsr-fresh-heads, nsr-keep-heads) the
memoryless rules. For a returning task the trainer tracks accuracy after the arrival decision and after every step
until it is back within `recovery_tolerance` of its previous best (the best accuracy measured while it was the
active task, read from the round log). At the end a bank's run also answers every task's test batches without
their task id, each batch through the entry nearest its key (`task_agnostic` in metrics.json), and counts its false
restores (an entry of another task restored) and missed ones (a returning task whose entry was kept, not restored).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import ray

from memcl.actors.adapter_trainer import AdapterTrainer
from memcl.actors.memory_manager import MemoryManager
from memcl.pipeline import checkpoint
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import ConfigError, Placement, RunConfig
from memcl.pipeline.local import LocalActors
from memcl.pipeline.progress import Reports
from memcl.pipeline.roles import Roles, RoundEnd, RunState, round_label
from memcl.pipeline.trainer_group import TrainerGroup
from memcl_ops.arrow import schema as S
from memcl_ops.data.sources import StreamInfo
from memcl_ops.methods import method_spec
from memcl_ops.nsr.adapter import probe_full
from memcl_ops.roles.adapter_trainer import REPLICATED
from memcl_ops.roles.nsr import NSRFlow, nsr_stores
from memcl_ops.rounds import RoundBatches, plan_rounds


@dataclass
class OpenVisit:
    """The visit being streamed: the probe held until it fills, then the arrival's key and plan, the test batches
    a returning task's recovery is tracked on, and the visit's end report."""

    visit: int
    task: int
    batches: int
    previous_best: float | None  # a returning task's best accuracy so far (None: its first visit)
    held: list = field(default_factory=list)
    rows: int = 0  # rows of the held batches that passed the gate
    key: object = None
    plan: object = None  # the arrival plan (None: the probe still fills)
    tests: list = field(default_factory=list)
    ended: dict = field(default_factory=dict)


class NSRPipeline:
    def __init__(self, config: RunConfig, info: StreamInfo, actors: ActorCache | LocalActors) -> None:
        self.config, self.info = config, info
        self.nsr = method_spec(config.method.name).resolve(config.method).nsr
        enc, rt = config.encoder, config.runtime
        gpus = enc.num_gpus
        if gpus == "auto":
            gpus = 1.0 if not actors.local and ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        n_way = max(len(c) for c in info.task_classes)
        if min(len(c) for c in info.task_classes) < 2:  # the classes of own data are known only once it is read
            raise ConfigError(f"stream.tasks: {config.method.name} learns each task with its own head of two classes "
                              f"or more; {info.name} gives tasks of {[len(c) for c in info.task_classes]} classes")
        # the adapter trains inside the encoder: by default each worker reserves what an encoder replica would
        options = rt.actor_options("adapter_trainer", Placement(enc.num_cpus, gpus, dict(enc.resources)))
        self.trainers = TrainerGroup(actors, "adapter_trainer", rt.data_parallel, AdapterTrainer, options, enc.spec,
                                     info.payload, self.nsr, n_way, config.seed, enc.threads,
                                     rt.prequential.near_future, replicated=REPLICATED)
        self.trainer_info = actors.call("adapter_trainer", "info")
        names = ["source", *self.trainers.workers]
        self.banks = self.nsr.banked  # the memoryless rules keep nothing beyond the active capacity (and heads)
        self.stores = nsr_stores(self.nsr)
        if self.stores:
            actors.get("memory", MemoryManager, rt.actor_options("memory"), self.stores, rt.actor_threads)
            names.append("memory")
        self.roles = Roles(actors, names, copies=self.trainers.copies)
        self.x, self.runtime = actors.executor(self._handle), rt
        self.flow = NSRFlow(self.x, self.nsr)
        self.task_free = False  # NSR keys its bank at task arrival
        self.ended = True  # a stream planned whole at its start (only the features family follows a folder)

    def _handle(self, role: str):
        return self.trainers.handle() if role == "adapter_trainer" else self.roles.handle(role)

    def plan(self) -> list[RoundBatches]:
        return plan_rounds(self.info, task_free=False, every=0)

    def test_refs(self, task: int, after_visit: int, letters: list) -> list:
        refs = []
        for k in range(self.info.test_batches[task]):
            batch, refused = self.x.call("source", "test_batch", task, k, after_visit)
            refs.append(batch)
            letters.append(refused)
        return refs

    def begin_round(self, batches: RoundBatches, state: RunState, reports: Reports) -> None:
        """A visit begins: its first batches are held until their rows make the probe."""
        visit = batches[0][0]
        task = self.info.visits[visit]
        returning = task in state.seen_tasks
        self.visit = OpenVisit(visit, task, len(batches),
                               previous_best(state.records("round_log"), task) if returning else None)

    def observe(self, visit: int, index: int, letters: list) -> object:
        """One training batch: held while the probe fills (the visit's arrival decision reads it), then trained on,
        the held ones first. Returns the last training call submitted (None while the probe fills)."""
        now, x = self.visit, self.x
        batch, refused = x.call("source", "train_batch", visit, index)
        letters.append(refused)
        if now.plan is not None:
            return self.flow.train(batch)
        now.held.append(batch)
        now.rows += x.get(x.call("source", "train_rows", visit, index))
        if not probe_full(now.rows, self.nsr.probe_size) and index < now.batches - 1:
            return None
        now.tests = self.test_refs(now.task, visit, letters)
        now.key, now.plan = self.flow.arrive(list(now.held), self.info.task_classes[now.task], now.task,
                                             now.previous_best, now.tests)
        return [self.flow.train(b) for b in now.held][-1]

    def end_round(self, state: RunState, reports: Reports, *, final: bool) -> RoundEnd:
        """The visit ends: the adapter compressed and, with a bank, stored under its task."""
        now, bars = self.visit, reports.progress
        self.trainers.drain()
        what = round_label(self, [(now.visit, 0)])
        ended = self.flow.end_visit(now.task, now.key, now.tests, wait=lambda ref: bars.wait(
            [ref], f"{what} compress and test", "call", leave=False)[0])
        predictions = ended.pop("prequential")
        arrival = self.x.get(now.plan)
        ended.update(visit=now.visit, task=now.task, arrival=arrival.kind,
                     retrieval=vars(arrival.retrieval) if arrival.retrieval else None)
        now.ended = ended
        return RoundEnd(ended, predictions)

    def visit_tasks(self, visits: list[int]) -> list[list[int]]:
        return [[self.info.visits[v]] for v in visits]

    def evaluate(self, tasks: list[int], after_visit: int, letters: list, reports: Reports) -> dict[int, float]:
        """Each task through its bank entry (the bank's rules; the active capacity for an evicted task), or through
        the active capacity (memoryless allocations: one task solution held at a time; with task_heads the task's own
        head on the active adapter); the visit's own task as its end measured it."""
        now, bars = self.visit, reports.progress
        refs = {t: self.flow.evaluate(t, self.info.task_classes[t], self.test_refs(t, after_visit, letters))
                for t in tasks if t != now.task}
        scores = bars.wait(list(refs.values()), f"{round_label(self, [(now.visit, 0)])} evaluate", "task",
                           leave=False)
        accuracy = {t: float(a) for t, a in zip(refs, scores)}
        if now.task in tasks:
            accuracy[now.task] = now.ended["acc_stored"] if self.banks else now.ended["acc_live"]
        bars.note(f"after visit {now.visit + 1}: {now.ended['arrival']} start, accuracy {accuracy}")
        return dict(sorted(accuracy.items()))

    def revive(self, parts: dict[str, checkpoint.State] | None) -> None:
        self.trainers.break_up()
        self.roles.revive()
        self.trainers.join()
        self.roles.restore(parts)

    def memory_report(self) -> dict[str, int]:
        return self.x.get(self.x.call("memory", "memory_report")) if self.stores else {}

    def learned_counts(self) -> tuple[int, int]:
        return self.x.get(self.x.call("adapter_trainer", "learned_counts"))

    def close(self) -> None:
        """Nothing to release: this family streams through classic actor calls only."""

    def finish(self, state: RunState) -> dict:
        log = state.records("round_log")
        return {"allocation": self.nsr.allocation, "task_heads": self.nsr.task_heads, "adapter": self.trainer_info,
                "recovery": recovery_summary(log), "arrivals": arrival_summary(log),
                "bank": self.x.get(self.x.call("memory", "call", "bank", "bank_summary")) if self.banks else None,
                "task_agnostic": self.task_agnostic(state) if self.banks else None}

    def task_agnostic(self, state: RunState) -> dict:
        """Every seen task's test batches after the last visit, answered without their task id: each batch through
        the bank entry nearest its key. Accuracy (all rows, and per task) and the share of batches routed to their
        own task's entry."""
        x, last = self.x, len(self.info.visits) - 1
        classes = {t: list(c) for t, c in enumerate(self.info.task_classes)}
        batches = [(task, x.call("source", "test_batch", task, k, last)[0]) for task in sorted(state.seen_tasks)
                   for k in range(self.info.test_batches[task])]
        batches = [(task, batch) for task, batch in ((t, x.get(b)) for t, b in batches) if batch is not None]
        answers = [(task, batch, self.flow.predict_agnostic(batch, classes)) for task, batch in batches]
        right, rows, routed, per_task = 0, 0, 0, {}
        for task, batch, answer in answers:
            predicted, through = x.get(answer)
            hits = int((predicted == S.labels_to_numpy(batch)).sum())
            right, rows, routed = right + hits, rows + batch.num_rows, routed + (through == task)
            done = per_task.setdefault(task, [0, 0])
            done[0], done[1] = done[0] + hits, done[1] + batch.num_rows
        return {"accuracy": right / rows if rows else None, "batches": len(answers),
                "routed_to_own_task": routed / len(answers) if answers else None,
                "per_task": {t: h / n for t, (h, n) in per_task.items()}}


def previous_best(round_log: list[dict], task: int) -> float:
    """The best accuracy of `task` measured while it was the active task (after its visits' training and along
    their recovery curves; NaN, a test set the gate refused whole, measures nothing)."""
    measured = [a for e in round_log if e["task"] == task
                for a in [e["acc_live"], *[a for _, a in (e["recovery"] or {}).get("curve", [])]]]
    return max([0.0, *(a for a in measured if not np.isnan(a))])


def arrival_summary(round_log: list[dict]) -> dict:
    """How the visits started, and the bank's mistakes: a false restore restores another task's entry; a missed
    restore leaves a returning task's kept entry unrestored (its key fell below the rule's bar)."""
    kinds: dict[str, int] = {}
    false, missed = [], []
    for e in round_log:
        kinds[e["arrival"]] = kinds.get(e["arrival"], 0) + 1
        retrieval = e.get("retrieval") or {}
        if e["arrival"] == "restore" and retrieval["tasks"][0] != e["task"]:
            false.append(e["visit"])
        own = str(e["task"]) in {str(t) for t in retrieval.get("similarities", {})}
        if own and e["arrival"] != "restore":
            missed.append(e["visit"])
    return {"kinds": kinds, "false_restores": len(false), "false_restore_visits": false,
            "missed_restores": len(missed), "missed_restore_visits": missed}


def recovery_summary(round_log: list[dict]) -> dict:
    """Steps to recover per returning visit; a visit whose task never got back within the tracked steps counts
    as censored (its steps are a lower bound: the number of steps tracked)."""
    rows = [(e["visit"], e["task"], e["recovery"]) for e in round_log if e.get("recovery")]
    steps = [r["recovered_at"] if not r["censored"] else r["curve"][-1][0] for _, _, r in rows]
    return {"returning_visits": [{"visit": v, "task": t, "steps": s, "censored": r["censored"],
                                  "previous_best": r["previous_best"], "start_accuracy": r["curve"][0][1]}
                                 for (v, t, r), s in zip(rows, steps)],
            "mean_steps": float(np.mean(steps)) if steps else None,
            "censored": sum(r["censored"] for _, _, r in rows)}
