"""NSR's streaming loop. NSR trains LoRA adapters *inside* the frozen encoder on raw batches, so it cannot use the
feature-cache loop of pipeline/runner.py; `runner.run` hands `method: nsr` runs here. Per visit of a task:

    source.train_batch ──> trainer.key (first rows, LoRA off) ──> memory.arrive      (allocation "bank")
                       └─> trainer.begin_task(plan) ─> trainer.train(batch) … ─> trainer.end_task
                                                                          └─> memory.store_task(snapshot)
    then every seen task is evaluated: with its bank entry (or the active capacity for the memoryless
    allocations and for evicted tasks).

Allocations (docs/methods.md, "NSR"): "bank" is NSR's similarity rule; "fresh" and "keep" are the memoryless rules.
For a returning task the trainer tracks accuracy after the arrival decision and after every step until it is back within
`recovery_tolerance` of its previous best (the best accuracy measured while it was the active task).

Data moves between actors by reference (the driver only sees small reports); the active capacity and the bank
are checkpointed after each visit and `memcl run --resume` continues from the last visit written.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from actors.adapter_trainer import AdapterTrainer
from actors.memory_manager import MemoryManager
from memcl_ops import metrics as M
from memcl_ops.data.sources import StreamInfo
from memcl_ops.mars.router import RouterConfig
from memcl_ops.methods import method_spec
from memcl_ops.nsr.adapter import ArrivalPlan
from pipeline import checkpoint, report
from pipeline.config import RunConfig
from pipeline.progress import InFlight, Progress

log = logging.getLogger("memcl")


@dataclass
class AdapterRunState:
    next_visit: int = 0
    acc_rows: list[list[float]] = field(default_factory=list)  # after visit i: accuracy per task (NaN: unseen)
    seen_tasks: list[int] = field(default_factory=list)
    best: dict[str, float] = field(default_factory=dict)  # task -> best accuracy while it was the active task
    visit_log: list[dict] = field(default_factory=list)
    wall: dict[str, float] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def add_wall(self, phase: str, seconds: float) -> None:
        self.wall[phase] = self.wall.get(phase, 0.0) + seconds


class AdapterPipeline:
    def __init__(self, config: RunConfig, info: StreamInfo, source: ray.actor.ActorHandle, actors) -> None:
        self.config, self.info, self.source = config, info, source
        self.nsr = method_spec(config.method.name).resolve(config.method).nsr
        if info.payload not in ("text", "image"):
            raise ValueError(f"NSR trains LoRA inside the encoder, so it needs raw text or image batches; the stream "
                             f"{info.name!r} carries {info.payload!r}")
        enc, rt = config.encoder, config.runtime
        gpus = enc.num_gpus
        if gpus == "auto":
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        n_way = max(len(c) for c in info.task_classes)
        self.trainer = actors.get("adapter_trainer", AdapterTrainer,
                                  {"num_cpus": enc.num_cpus, "num_gpus": gpus, "max_restarts": rt.max_restarts},
                                  enc.spec, info.payload, self.nsr, n_way, config.seed, enc.threads)
        self.trainer_info = ray.get(self.trainer.info.remote())
        self.memory = None
        if self.nsr.allocation == "bank":  # the memoryless rules keep nothing beyond the active capacity
            self.memory = actors.get("memory", MemoryManager, {"num_cpus": 0, "max_restarts": rt.max_restarts},
                                     self.trainer_info["dim"], RouterConfig(initial_slots=0), 0, config.seed,
                                     rt.actor_threads, self.nsr.bank)

    def roles(self) -> dict[str, ray.actor.ActorHandle]:
        return {k: v for k, v in {"source": self.source, "trainer": self.trainer, "memory": self.memory}.items() if v}

    def test_refs(self, task: int, after_visit: int, letters: list) -> list[ray.ObjectRef]:
        refs = []
        for k in range(self.info.test_batches[task]):
            batch, refused = self.source.test_batch.remote(task, k, after_visit)
            refs.append(batch)
            letters.append(refused)
        return refs

    def visit(self, v: int, state: AdapterRunState, bars) -> dict:
        """Stream one visit: arrival decision, training, compression and storage, evaluation of the seen tasks."""
        info, nsr, rt = self.info, self.nsr, self.config.runtime
        task, n = info.visits[v], info.visit_batches[v]
        classes = info.task_classes[task]
        letters: list[ray.ObjectRef] = []
        t0 = time.perf_counter()
        batches: deque = deque()

        def submit(i: int) -> None:
            batch, refused = self.source.train_batch.remote(v, i)
            batches.append(batch)
            letters.append(refused)

        probe_batches = min(n, -(-nsr.probe_size // self.config.stream.batch_size))
        for i in range(probe_batches):
            submit(i)
        key = None
        if self.memory is not None:
            key = self.trainer.key.remote(*batches)
            plan = self.memory.arrive.remote(key, nsr.lora.rank)
        else:
            plan = ray.put(ArrivalPlan("fresh" if nsr.allocation == "fresh" else "keep"))
        returning = task in state.seen_tasks
        tests = self.test_refs(task, v, letters)
        ray.get(self.trainer.begin_task.remote(classes, plan, state.best.get(str(task)) if returning else None,
                                               *tests))
        in_flight = InFlight(rt.max_in_flight, bars.bar(f"task {task + 1}/{len(info.task_classes)} "
                                                        f"(visit {v + 1}/{len(info.visits)}) nsr[{nsr.allocation}]", n))
        for i in range(n):
            if i >= probe_batches:
                submit(i)
            in_flight.add(self.trainer.train.remote(batches.popleft()))
        in_flight.drain()
        t_train = time.perf_counter()
        what = f"task {task + 1}/{len(info.task_classes)} (visit {v + 1}/{len(info.visits)})"
        ended = bars.wait([self.trainer.end_task.remote(self.memory is not None, *tests)], f"{what} compress and test",
                          "call", leave=False)[0]
        if self.memory is not None:
            evicted = ray.get(self.memory.store_task.remote(task, key, self.trainer.snapshot.remote(),
                                                            ended["acc_stored"]))
            ended["evicted"] = evicted
        seen = state.seen_tasks + ([] if returning else [task])
        accuracy = self.evaluate(seen, task, ended, v, letters, bars, what)
        refused = [t for t in ray.get(letters) if t.num_rows]
        arrival = ray.get(plan)
        ended.update(visit=v, task=task, arrival=arrival.kind, accuracy=accuracy,
                     retrieval=vars(arrival.retrieval) if arrival.retrieval else None,
                     memory=ray.get(self.memory.memory_report.remote()) if self.memory is not None else {"bank": 0})
        return {"log": ended, "seen": seen, "dead": pa.concat_tables(refused) if refused else None,
                "seconds": {"stream": t_train - t0, "evaluate": time.perf_counter() - t_train}}

    def evaluate(self, seen: list[int], active: int, ended: dict, v: int, letters: list, bars: Progress,
                 what: str) -> dict[int, float]:
        """Each seen task through its bank entry (bank allocation; the active capacity for an evicted task), or
        through the active capacity (memoryless allocations: one task solution held at a time)."""
        refs = {}
        for t in sorted(seen):
            if t == active:
                continue
            entry = self.memory.bank_entry.remote(t) if self.memory is not None else None
            refs[t] = self.trainer.evaluate_entry.remote(entry, self.info.task_classes[t],
                                                         *self.test_refs(t, v, letters))
        scores = bars.wait(list(refs.values()), f"{what} evaluate", "task", leave=False)
        accuracy = {t: float(a) for t, a in zip(refs, scores)}
        accuracy[active] = ended["acc_stored"] if self.memory is not None else ended["acc_live"]
        return dict(sorted(accuracy.items()))

    def state(self) -> dict[str, checkpoint.State]:
        roles = self.roles()
        return dict(zip(roles, ray.get([h.state.remote() for h in roles.values()])))

    def restore(self, parts: dict[str, checkpoint.State]) -> None:
        ray.get([h.restore.remote(parts[name]) for name, h in self.roles().items()])


def run_adapter(config: RunConfig, info: StreamInfo, source: ray.actor.ActorHandle, run_dir: Path, resume: bool,
                bars: Progress, started: float, actors) -> dict:
    """Run (or resume) an NSR stream once `runner.run` has set up Ray, the source and the run folder; returns the
    metrics written to the run folder's metrics.json."""
    rt = config.runtime
    pipe = AdapterPipeline(config, info, source, actors)
    state = AdapterRunState()
    ckpt_dir = run_dir / "checkpoints"
    if resume and (found := checkpoint.latest_valid(ckpt_dir)) is not None:
        path, parts, meta = found
        pipe.restore(parts)
        state = AdapterRunState(**meta)
        log.info("resumed from %s at visit %d", path, state.next_visit)

    for v in range(state.next_visit, len(info.visits)):
        outcome = pipe.visit(v, state, bars)
        entry = outcome["log"]
        for phase, seconds in outcome["seconds"].items():
            state.add_wall(phase, seconds)
        state.seen_tasks = outcome["seen"]
        task = str(entry["task"])
        measured = [entry["acc_live"]] + [a for _, a in (entry["recovery"] or {}).get("curve", [])]
        state.best[task] = max([state.best.get(task, 0.0), *measured])
        state.acc_rows.append([entry["accuracy"].get(t, float("nan")) for t in range(len(info.task_classes))])
        dead = outcome["dead"]
        if dead is not None:
            (run_dir / "dead_letters").mkdir(exist_ok=True)
            pq.write_table(dead, run_dir / "dead_letters" / f"visit-{v:06d}.parquet")
            for reason, count in Counter(dead.column("reason").to_pylist()).items():
                state.refused[reason] = state.refused.get(reason, 0) + count
        state.visit_log.append(entry)
        state.next_visit = v + 1
        if rt.checkpoint:
            t_ckpt = time.perf_counter()
            checkpoint.write(ckpt_dir, v, pipe.state(), state.to_json())
            state.add_wall("checkpoint", time.perf_counter() - t_ckpt)
        bars.note(f"after visit {v + 1}: {entry['arrival']} start, accuracy {entry['accuracy']}")

    metrics = adapter_metrics(config, pipe, info, state, time.perf_counter() - started)
    report.write_run(run_dir, metrics)
    metrics["run_dir"] = str(run_dir)
    return metrics


def recovery_summary(visit_log: list[dict]) -> dict:
    """Steps to recover per returning visit; a visit whose task never got back within the tracked steps counts
    as censored (its steps are a lower bound: the number of steps tracked)."""
    rows = [(e["visit"], e["task"], e["recovery"]) for e in visit_log if e.get("recovery")]
    steps = [r["recovered_at"] if not r["censored"] else r["curve"][-1][0] for _, _, r in rows]
    return {"returning_visits": [{"visit": v, "task": t, "steps": s, "censored": r["censored"],
                                  "previous_best": r["previous_best"], "start_accuracy": r["curve"][0][1]}
                                 for (v, t, r), s in zip(rows, steps)],
            "mean_steps": float(np.mean(steps)) if steps else None,
            "censored": sum(r["censored"] for _, _, r in rows)}


def adapter_metrics(config: RunConfig, pipe: AdapterPipeline, info: StreamInfo, state: AdapterRunState,
                    wall: float) -> dict:
    acc = np.array(state.acc_rows, dtype=np.float64).reshape(len(state.acc_rows), len(info.task_classes))
    firsts = [info.visits.index(t) for t in range(len(info.task_classes)) if t in info.visits]
    first_visits = acc[np.ix_(firsts, range(len(firsts)))] if firsts else acc
    learned = ray.get(pipe.trainer.learned_ids.remote())
    memory = ray.get(pipe.memory.memory_report.remote()) if pipe.memory is not None else {"bank": 0}
    timings = {name: ray.get(h.timings.remote()) for name, h in pipe.roles().items()}
    return {
        "method": config.method.name,
        "allocation": pipe.nsr.allocation,
        "dataset": info.name,
        "seed": config.seed,
        "task_classes": info.task_classes,
        "class_names": info.extra.get("class_names"),
        "visits": info.visits,
        "acc_matrix": acc.tolist(),
        "summary": M.Summary.of(first_visits).as_dict() if first_visits.size else {},
        "final_accuracy_all_tasks": float(np.nanmean(acc[-1])) if acc.size else None,
        "recovery": recovery_summary(state.visit_log),
        "bank": ray.get(pipe.memory.bank_summary.remote()) if pipe.memory is not None else None,
        "adapter": pipe.trainer_info,
        "samples": {"stream": info.num_samples, "learned": len(learned), "unique_learned": len(np.unique(learned)),
                    "refused": sum(state.refused.values()), "refused_by_reason": state.refused},
        "slots": {"history": [], "expansions": [], "refused_expansions": 0, "monitor": {}},
        "memory_bytes": {k: v for k, v in memory.items() if k != "num_slots"},
        "wall_seconds": {"total": wall, **state.wall},
        "actor_busy_seconds": {f"{a}.{s}": v["seconds"] for a, stages in timings.items() for s, v in stages.items()},
        "visit_log": state.visit_log,
    }
