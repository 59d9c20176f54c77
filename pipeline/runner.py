"""The streaming runner: builds the actors from a RunConfig, streams the plan through them with bounded
calls in flight, consolidates (DCDA stage 1 then stage 2) at each task end (every K batches when
task-free), evaluates on every seen task, checkpoints every actor atomically, and writes the run folder.

Per training batch the driver only submits calls; data moves between actors by object reference:

    source.train_batch -> [encoder.encode] -> memory.route -> monitor.observe -> memory.expand

Ray runs one caller's calls to one actor in submission order, so each batch is routed by the memory as
it stood after the previous batch's expansions, and the result is the same for any `max_in_flight`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray

from actors.encoder import Encoder
from actors.memory_manager import MemoryManager
from actors.novelty_monitor import NoveltyMonitor
from actors.stage1_trainer import Stage1Trainer
from actors.stage2_trainer import Stage2Trainer
from actors.stream_source import StreamSource
from memcl_ops import schema as S
from memcl_ops.feature_cache import FeatureCache
from memcl_ops.methods import MethodSpec, method_spec
from pipeline import checkpoint, report
from pipeline.config import RunConfig, dump_config, load_config
from pipeline.progress import Progress

log = logging.getLogger("memcl")


def ensure_ray(config: RunConfig) -> None:
    """Join `runtime.address` (or RAY_ADDRESS), or start Ray in-process; reuse a session already started."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    rt = config.runtime
    address = rt.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=rt.num_cpus, include_dashboard=False, object_store_memory=rt.object_store_mb * 2**20,
                 logging_level=logging.WARNING)


@dataclass
class RunState:
    """The runner's own checkpointed progress."""

    next_visit: int = 0
    acc_rows: list[list[float]] = field(default_factory=list)  # after visit i: accuracy per task (NaN: unseen)
    seen_tasks: list[int] = field(default_factory=list)
    consolidations: int = 0
    visit_log: list[dict] = field(default_factory=list)
    wall: dict[str, float] = field(default_factory=dict)  # driver wall time per phase

    def to_json(self) -> dict:
        return {"next_visit": self.next_visit, "acc_rows": self.acc_rows, "seen_tasks": self.seen_tasks,
                "consolidations": self.consolidations, "visit_log": self.visit_log, "wall": self.wall}

    def add_wall(self, phase: str, seconds: float) -> None:
        self.wall[phase] = self.wall.get(phase, 0.0) + seconds


class ActorCache:
    """Actors kept alive between runs of one process tree (bench, tests): a later run resets them instead of
    paying an actor start-up again (~4 s each here: a fresh process importing torch)."""

    def __init__(self) -> None:
        self.handles: dict[str, tuple[dict, ray.actor.ActorHandle]] = {}

    def get(self, role: str, actor_class: type, options: dict, *args: object) -> ray.actor.ActorHandle:
        known = self.handles.get(role)
        if known is not None and known[0] == options:
            ray.get(known[1].reset.remote(*args))
            return known[1]
        if known is not None:
            ray.kill(known[1])
        handle = actor_class.options(**options).remote(*args)
        self.handles[role] = (options, handle)
        return handle

    def close(self) -> None:
        for _, handle in self.handles.values():
            ray.kill(handle)
        self.handles.clear()


class EncoderPool:
    """N Encoder replicas, used round-robin (calls to one replica run in order)."""

    def __init__(self, config: RunConfig, payload: str, actors: ActorCache):
        enc = config.encoder
        gpus = enc.num_gpus
        if gpus == "auto":
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        options = {"num_cpus": enc.num_cpus, "num_gpus": gpus}
        self.replicas = [actors.get(f"encoder{i}", Encoder, options, enc.spec, payload, enc.threads)
                         for i in range(enc.replicas)]
        self.info = ray.get([r.info.remote() for r in self.replicas])
        self.next = 0

    @property
    def id(self) -> str:
        return self.info[0]["id"]

    @property
    def dim(self) -> int:
        return self.info[0]["dim"]

    def encode(self, batch_ref: ray.ObjectRef) -> ray.ObjectRef:
        replica = self.replicas[self.next]
        self.next = (self.next + 1) % len(self.replicas)
        return replica.encode.remote(batch_ref)


class Pipeline:
    """The actors of one run, wired for one method."""

    def __init__(self, config: RunConfig, spec: MethodSpec, describe: dict, source: ray.actor.ActorHandle,
                 encoders: EncoderPool | None, feature_dim: int, actors: ActorCache):
        self.config, self.spec, self.describe, self.source, self.encoders = config, spec, describe, source, encoders
        self.inline = encoders is not None  # no feature cache: encode on the fly
        method, seed, threads = spec.resolve(config.method), config.seed, config.runtime.actor_threads
        light = {"num_cpus": 0}  # learner actors do little work per call; the encoders hold the CPUs
        self.memory = (actors.get("memory", MemoryManager, light, feature_dim, method.router, method.sgse.max_slots,
                                  seed, threads) if spec.memory else None)
        self.monitor = actors.get("monitor", NoveltyMonitor, light, method.sgse) if spec.sgse else None
        self.stage1 = (actors.get("stage1", Stage1Trainer, light, feature_dim, method.router, method.stage1, seed,
                                  threads) if spec.stage1 else None)
        self.stage2 = actors.get("stage2", Stage2Trainer, light, method, feature_dim, seed, threads)
        self.method = method

    def actors(self) -> dict[str, ray.actor.ActorHandle]:
        named = {"source": self.source, "memory": self.memory, "monitor": self.monitor, "stage1": self.stage1,
                 "stage2": self.stage2}
        return {k: v for k, v in named.items() if v is not None}

    def features(self, batch_ref: ray.ObjectRef) -> ray.ObjectRef:
        return self.encoders.encode(batch_ref) if self.inline else batch_ref

    def learn_batch(self, visit: int, index: int) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        """Submit one training batch through the chain; returns (feature batch ref, last ref of the chain)."""
        feats = self.features(self.source.train_batch.remote(visit, index))
        tail = feats
        if self.memory is not None:
            tail = routed = self.memory.route.remote(feats)
            if self.monitor is not None:
                tail = self.memory.expand.remote(self.monitor.observe.remote(routed))
        return feats, tail

    def consolidate(self, block: list[ray.ObjectRef]) -> dict:
        """DCDA stage 1 then stage 2 (or the method's head training) on one block, then the task-end snapshot."""
        out: dict = {}
        t0 = time.perf_counter()
        if self.stage1 is not None:
            trained = self.stage1.train.remote(self.memory.memory_state.remote(), *block)
            ray.get(self.memory.load_memory.remote(trained))
        t1 = time.perf_counter()
        memory = self.memory.memory_state.remote() if self.memory is not None else None
        out["stage2"] = ray.get(self.stage2.train.remote(memory, *block))
        ray.get(self.stage2.end_task.remote())
        out["seconds"] = {"stage1": t1 - t0, "stage2": time.perf_counter() - t1}
        return out

    def evaluate(self, tasks: list[int]) -> dict[int, float]:
        refs = {t: [self.stage2.evaluate.remote(self.features(self.source.test_batch.remote(t, k)))
                    for k in range(self.describe["test_batches"][t])] for t in tasks}
        accuracy = {}
        for t, parts in refs.items():
            counts = np.array(ray.get(parts)).reshape(-1, 2).sum(axis=0)
            accuracy[t] = float(counts[0] / max(counts[1], 1))
        return accuracy

    def state(self) -> dict[str, checkpoint.State]:
        names, handles = zip(*self.actors().items())
        return dict(zip(names, ray.get([h.state.remote() for h in handles])))

    def restore(self, parts: dict[str, checkpoint.State]) -> None:
        ray.get([h.restore.remote(parts[name]) for name, h in self.actors().items()])

    def timings(self) -> dict[str, dict]:
        handles = dict(self.actors())
        if self.encoders is not None:
            handles.update({f"encoder{i}": r for i, r in enumerate(self.encoders.replicas)})
        return dict(zip(handles, ray.get([h.timings.remote() for h in handles.values()])))



def encode_into_cache(config: RunConfig, source: ray.actor.ActorHandle, encoders: EncoderPool, describe: dict,
                      progress: Progress) -> None:
    """Encode every row the stream needs that the Parquet cache lacks, then hand the features to the source."""
    cache = FeatureCache(config.runtime.cache_dir)
    for split in ("train", "test"):
        key = FeatureCache.key(encoders.id, describe["dataset"], split)
        rows = ray.get(source.needed_rows.remote(split))
        feats, missing = cache.lookup(key, rows)
        if feats is None:
            bs = config.stream.batch_size
            chunks = [missing[a:a + bs] for a in range(0, len(missing), bs)]
            bar = progress.bar(f"encode {split} ({encoders.id})", len(chunks))
            pending: deque[tuple[np.ndarray, ray.ObjectRef]] = deque()
            results = []
            for chunk in chunks:
                pending.append((chunk, encoders.encode(source.raw_rows.remote(split, chunk))))
                if len(pending) > config.runtime.max_in_flight * len(encoders.replicas):
                    results.append(_take(pending, bar))
            while pending:
                results.append(_take(pending, bar))
            bar.close()
            cache.add(key, np.concatenate([r for r, _ in results]), np.concatenate([f for _, f in results]))
            feats, missing = cache.lookup(key, rows)
        ray.get(source.set_features.remote(split, rows, feats))


def _take(pending: deque, bar) -> tuple[np.ndarray, np.ndarray]:
    rows, ref = pending.popleft()
    batch = ray.get(ref)
    bar.update(1)
    return rows, np.array(S.features_to_numpy(batch))


def new_run_dir(config: RunConfig, dataset: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = dataset.replace(":", "_").replace("/", "_")
    base = Path(config.runtime.out) / f"{stamp}-{config.method.name}-{name}-s{config.seed}"
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    path.mkdir(parents=True)
    return path


def run(config: RunConfig | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
        progress: bool | None = None, actors: ActorCache | None = None) -> dict:
    """Run (or resume) one continual-learning stream; returns the metrics dict written to metrics.json.

    `actors`: reuse the actors of earlier runs (they are reset); by default the run starts and kills its own.
    """
    own = actors is None
    actors = actors or ActorCache()
    try:
        return _run(config, run_dir, resume, progress, actors)
    finally:
        if own:
            actors.close()


def _run(config: RunConfig | None, run_dir: Path | None, resume: Path | None, progress: bool | None,
         actors: ActorCache) -> dict:
    if resume is not None:
        run_dir = Path(resume)
        config = load_config(run_dir / "config.yaml")
    config = config or RunConfig()
    spec = method_spec(config.method.name)
    if config.stream.task_free and not spec.task_free:
        raise ValueError(f"method {spec.name} needs task boundaries; it cannot run a task-free stream")
    show = config.runtime.progress if progress is None else progress
    started = time.perf_counter()
    ensure_ray(config)
    bars = Progress(enabled=show)
    source = actors.get("source", StreamSource, {"num_cpus": 0}, config.data.dataset, config.data.synthetic,
                        config.stream)
    describe = ray.get(source.describe.remote())
    if run_dir is None:
        run_dir = new_run_dir(config, describe["dataset"])
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume is None:
        dump_config(config, run_dir / "config.yaml")

    state = RunState()
    encoders = None
    t0 = time.perf_counter()
    if describe["payload"] == "features":
        feature_dim = describe["feature_dim"]
    else:
        encoders = EncoderPool(config, describe["payload"], actors)
        feature_dim = encoders.dim
        if config.runtime.cache_dir:
            encode_into_cache(config, source, encoders, describe, bars)
    encode_seconds = time.perf_counter() - t0
    inline = encoders if (encoders is not None and not config.runtime.cache_dir) else None
    pipe = Pipeline(config, spec, describe, source, inline, feature_dim, actors)
    ckpt_dir = run_dir / "checkpoints"
    if resume is not None:
        found = checkpoint.latest_valid(ckpt_dir)
        if found is not None:
            path, parts, meta = found
            pipe.restore(parts)
            state = RunState(**meta)
            log.info("resumed from %s at visit %d", path, state.next_visit)
    state.add_wall("encode_cache", encode_seconds)

    num_tasks = len(describe["task_classes"])
    visits = describe["visits"]
    every = config.method.consolidate_every
    for v in range(state.next_visit, len(visits)):
        task = visits[v]
        n = describe["visit_batches"][v]
        bar = bars.bar(f"task {task + 1}/{num_tasks} (visit {v + 1}/{len(visits)}) stream", n)
        t_stream = time.perf_counter()
        pending: deque[ray.ObjectRef] = deque()
        block: list[ray.ObjectRef] = []
        consolidations: list[dict] = []
        stream_seconds = 0.0
        for i in range(n):
            feats, tail = pipe.learn_batch(v, i)
            block.append(feats)
            pending.append(tail)
            if len(pending) > config.runtime.max_in_flight:
                ray.get(pending.popleft())
                bar.update(1)
            if config.stream.task_free and len(block) == every and i < n - 1:
                ray.get(list(pending))
                bar.update(len(pending))
                pending.clear()
                stream_seconds += time.perf_counter() - t_stream
                consolidations.append(pipe.consolidate(block))
                t_stream = time.perf_counter()
                block = []
        ray.get(list(pending))
        bar.update(len(pending))
        bar.close()
        stream_seconds += time.perf_counter() - t_stream
        state.add_wall("stream", stream_seconds)
        if block:
            consolidations.append(pipe.consolidate(block))
        del block, pending
        for c in consolidations:
            for k, s in c["seconds"].items():
                state.add_wall(k, s)
        state.consolidations += len(consolidations)

        t_eval = time.perf_counter()
        for t in ray.get(source.visit_tasks.remote(v)):
            if t not in state.seen_tasks:
                state.seen_tasks.append(t)
        accuracy = pipe.evaluate(sorted(state.seen_tasks))
        state.add_wall("evaluate", time.perf_counter() - t_eval)
        state.acc_rows.append([accuracy.get(t, float("nan")) for t in range(num_tasks)])
        memory = ray.get(pipe.memory.memory_report.remote()) if pipe.memory is not None else {}
        state.visit_log.append({"visit": v, "task": task, "accuracy": accuracy,
                                "mean_seen": float(np.mean(list(accuracy.values()))), "memory": memory,
                                "stage2": [c["stage2"] for c in consolidations]})
        state.next_visit = v + 1
        if config.runtime.checkpoint:
            t_ckpt = time.perf_counter()
            checkpoint.write(ckpt_dir, v, pipe.state(), state.to_json())
            state.add_wall("checkpoint", time.perf_counter() - t_ckpt)
        bars.note(f"after visit {v + 1}: mean accuracy on seen tasks {state.visit_log[-1]['mean_seen']:.3f}")

    metrics = collect_metrics(config, pipe, describe, state, time.perf_counter() - started)
    report.write_run(run_dir, metrics)
    metrics["run_dir"] = str(run_dir)
    return metrics


def collect_metrics(config: RunConfig, pipe: Pipeline, describe: dict, state: RunState, wall: float) -> dict:
    from memcl_ops import metrics as M

    acc = np.array(state.acc_rows, dtype=np.float64)
    first_rows = [describe["visits"].index(t) for t in range(len(describe["task_classes"]))
                  if t in describe["visits"]]
    square = acc[np.ix_(first_rows, list(range(len(first_rows))))] if len(first_rows) else acc
    summary = M.Summary.of(square) if square.size else None
    learned = ray.get(pipe.stage2.learned_ids.remote())
    history = ray.get(pipe.memory.history.remote()) if pipe.memory is not None else {}
    monitor = ray.get(pipe.monitor.counters.remote()) if pipe.monitor is not None else {}
    memory = ray.get(pipe.memory.memory_report.remote()) if pipe.memory is not None else {}
    head_bytes = ray.get(pipe.stage2.memory_bytes.remote())
    timings = pipe.timings()
    busy = {f"{actor}.{stage}": v["seconds"] for actor, stages in timings.items() for stage, v in stages.items()}
    return {
        "method": config.method.name,
        "dataset": describe["dataset"],
        "seed": config.seed,
        "task_classes": describe["task_classes"],
        "visits": describe["visits"],
        "acc_matrix": acc.tolist(),
        "summary": summary.as_dict() if summary else {},
        "final_accuracy_all_tasks": float(np.nanmean(acc[-1])) if acc.size else float("nan"),
        "samples": {"stream": describe["num_samples"], "learned": len(learned),
                    "unique_learned": len(np.unique(learned))},
        "slots": {"history": history.get("slot_history", []), "expansions": history.get("expansions", []),
                  "refused_expansions": history.get("refused_expansions", 0), "monitor": monitor},
        "memory_bytes": {**{k: v for k, v in memory.items() if k != "num_slots"},
                         **{f"head.{k}": v for k, v in head_bytes.items()}},
        "wall_seconds": {"total": wall, **state.wall},
        "actor_busy_seconds": busy,
        "visit_log": state.visit_log,
        "consolidations": state.consolidations,
    }
