"""The streaming runner: builds the actors from a RunConfig, streams the plan through them with bounded
calls in flight, consolidates (DCDA stage 1 then stage 2) at each task end (every K batches when
task-free), evaluates, checkpoints every actor atomically, survives actor faults, and writes the run folder.

Per training batch the driver only submits calls; data moves between actors by object reference:

    source.train_batch -> [encoder.encode] -> memory.route -> monitor.observe -> memory.expand
          (gate)              (gate)

Ray runs one caller's calls to one actor in submission order, so each batch is routed by the memory as
it stood after the previous batch's expansions, and the result is the same for any `max_in_flight`.

Rows that break the contract leave the gates as dead letters (`dead_letters/*.parquet` in the run folder).
If an actor dies mid-visit, every actor is brought back (Ray restarts it, or the runner starts a new one),
all are restored to the state after the previous visit, and the visit is replayed: each sample is learned
exactly once and the result equals an uninterrupted run.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from actors.memory_manager import MemoryManager
from actors.novelty_monitor import NoveltyMonitor
from actors.stage1_trainer import Stage1Trainer
from actors.stage2_trainer import Stage2Trainer
from actors.stream_source import StreamSource
from memcl_ops.arrow import schema as S
from memcl_ops.data.feature_cache import FeatureCache
from memcl_ops.data.sources import StreamInfo
from memcl_ops.mars.router import RouterConfig
from memcl_ops.methods import MethodSpec
from pipeline import checkpoint, preflight, report
from pipeline.actor_cache import ActorCache, is_fault
from pipeline.config import RunConfig, dump_config, load_config
from pipeline.encoder_pool import EncoderPool
from pipeline.errors import RunInterrupted
from pipeline.progress import InFlight, Progress, Reports
from pipeline.tracking import TensorBoardLog

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

    next_round: int = 0
    acc_rows: list[list[float]] = field(default_factory=list)  # after visit i: accuracy per task (NaN: not evaluated)
    seen_tasks: list[int] = field(default_factory=list)  # in order of first training
    consolidations: int = 0
    round_log: list[dict] = field(default_factory=list)
    wall: dict[str, float] = field(default_factory=dict)  # driver wall time per phase
    refused: dict[str, int] = field(default_factory=dict)  # dead-lettered rows per reason
    recoveries: int = 0  # visits replayed after an actor fault
    elapsed: float = 0.0  # driver wall time up to the last commit, over every session of a resumed run

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def add_wall(self, phase: str, seconds: float) -> None:
        self.wall[phase] = self.wall.get(phase, 0.0) + seconds


@dataclass
class Submitted:
    """One training batch in flight: its feature batch, the last call of its chain and its dead letters."""

    features: ray.ObjectRef
    tail: ray.ObjectRef
    letters: list[ray.ObjectRef]


class Pipeline:
    """The actors of one run, wired for one method."""

    LEARNER_ROLES = ("memory", "monitor", "stage1", "stage2")

    def __init__(self, config: RunConfig, spec: MethodSpec, info: StreamInfo, actors: ActorCache,
                 encoders: EncoderPool | None, inline: bool):
        self.config, self.spec, self.info, self.actors = config, spec, info, actors
        self.encoders, self.inline = encoders, inline  # inline: no feature cache, encode on the fly
        # rows encoded in-line (an arrow: folder's text or images) are looked up by payload in the content cache
        self.content_cache = config.runtime.cache_dir if inline and config.runtime.cache_dir else None
        self.expansions: ray.ObjectRef | None = None  # the monitor's verdict on the last batch, not yet applied
        self.method = method = spec.resolve(config.method)
        seed, threads, dim = config.seed, config.runtime.actor_threads, info.feature_dim
        # Learner actors do little work per call (the encoders hold the CPUs); Ray restarts them after a crash.
        light = {"num_cpus": 0, "max_restarts": config.runtime.max_restarts}
        self.roles = ["source"]
        # An analytic head over features encoded in-line: each encoder replica sums the statistics of the batches it
        # encodes and the MemoryManager merges them (a memory-free method gets one without slots for that).
        self.merges = spec.mergeable and inline and method.analytic.accumulate_in == "encoders"
        if spec.memory or self.merges:
            router = method.router if spec.memory else RouterConfig(initial_slots=0)
            # One torch thread: it routes every batch while the encoders run, and a second thread would fight
            # them for the cores (`memcl bench throughput`).
            actors.get("memory", MemoryManager, light, dim, router, method.sgse.max_slots, seed, 1)
            self.roles.append("memory")
        if spec.sgse:
            actors.get("monitor", NoveltyMonitor, light, method.sgse)
            self.roles.append("monitor")
        if spec.stage1:
            actors.get("stage1", Stage1Trainer, light, dim, method.router, method.stage1, seed, threads)
            self.roles.append("stage1")
        actors.get("stage2", Stage2Trainer, light, method, dim, seed, threads)
        self.roles.append("stage2")
        self._prepare_encoders()

    def _prepare_encoders(self) -> None:
        if self.merges:
            ray.get([r.use_statistics.remote(self.method.analytic, self.config.seed) for r in self.encoders.replicas])
        if self.content_cache:
            self.encoders.use_cache(self.content_cache)

    def flush_cache(self) -> None:
        if self.content_cache:
            self.encoders.flush_cache()

    def __getattr__(self, role: str) -> ray.actor.ActorHandle | None:
        # pipe.memory, pipe.stage2, ...: the current handle of a role (it changes when a role is revived)
        if role in ("source", *self.LEARNER_ROLES):
            return self.actors.handle(role) if role in self.roles else None
        raise AttributeError(role)

    def _features(self, batch_ref: ray.ObjectRef, letters: list[ray.ObjectRef], accumulate: bool = False
                  ) -> ray.ObjectRef:
        if not self.inline:
            return batch_ref
        features, more = self.encoders.encode(batch_ref, accumulate)
        letters.append(more)
        return features

    def learn_batch(self, visit: int, index: int) -> Submitted:
        """Submit one training batch through the chain."""
        batch, letters = self.source.train_batch.remote(visit, index)
        letters = [letters]
        feats = self._features(batch, letters, accumulate=self.merges)
        tail = feats
        if self.spec.memory:
            tail = routed = self.memory.route.remote(feats, self.expansions)
            if self.monitor is not None:
                frozen = feats if self.method.sgse.signal == "reference" else None
                tail = self.expansions = self.monitor.observe.remote(routed, frozen)
        return Submitted(feats, tail, letters)

    def apply_expansions(self) -> None:
        """Apply the last batch's expansions (each batch's are otherwise applied by the next route call)."""
        if self.expansions is not None:
            ray.get(self.memory.expand.remote(self.expansions))
            self.expansions = None

    def consolidate(self, block: list[ray.ObjectRef], reports: Reports, what: str) -> dict:
        """DCDA stage 1 then stage 2 (or the method's head training) on one block, then the task-end snapshot;
        the trainers' epochs are shown as `what` stage 1 / stage 2 bars."""
        out: dict = {}
        t0 = time.perf_counter()
        self.apply_expansions()
        queue = reports.queue
        if self.stage1 is not None:
            trained = self.stage1.train.remote(self.memory.memory_state.remote(), *block, progress=queue)
            reports.get(trained, what)
            ray.get(self.memory.load_memory.remote(trained))
        t1 = time.perf_counter()
        memory = self.memory.memory_state.remote() if self.spec.memory else None
        if self.merges:
            merged = self.memory.merge_statistics.remote(*self.encoders.take_statistics())
            out["stage2"] = reports.get(self.stage2.train_merged.remote(merged, memory, *block, progress=queue), what)
        else:
            out["stage2"] = reports.get(self.stage2.train.remote(memory, *block, progress=queue), what)
        ray.get(self.stage2.end_task.remote())
        out["seconds"] = {"stage1": t1 - t0, "stage2": time.perf_counter() - t1}
        out["epoch_losses"] = reports.take_losses()
        return out

    def evaluate(self, tasks: list[int], after_visit: int) -> tuple[dict[int, float], list[ray.ObjectRef]]:
        """Accuracy per task on its test data, and the dead-letter refs of refused test rows."""
        letters: list[ray.ObjectRef] = []
        refs = {}
        for t in tasks:
            refs[t] = []
            for k in range(self.info.test_batches[t]):
                batch, refused = self.source.test_batch.remote(t, k, after_visit)
                letters.append(refused)
                refs[t].append(self.stage2.evaluate.remote(self._features(batch, letters)))
        accuracy = {}
        for t, parts in refs.items():
            counts = np.array(ray.get(parts)).reshape(-1, 2).sum(axis=0)
            accuracy[t] = float(counts[0] / counts[1]) if counts[1] else float("nan")
        return accuracy, letters

    def memory_report(self) -> dict[str, int]:
        """Bytes of all persistent memory: the MemoryManager's stores and the novelty monitor's references."""
        report = ray.get(self.memory.memory_report.remote()) if self.memory is not None else {}
        if self.monitor is not None:
            report["monitor"] = ray.get(self.monitor.nbytes.remote())
        return report

    def state(self) -> dict[str, checkpoint.State]:
        return dict(zip(self.roles, ray.get([getattr(self, r).state.remote() for r in self.roles])))

    def restore(self, parts: dict[str, checkpoint.State]) -> None:
        ray.get([getattr(self, r).restore.remote(parts[r]) for r in self.roles])

    def revive(self, parts: dict[str, checkpoint.State], features: dict[str, tuple]) -> None:
        """After a fault: every role alive and reset, the source given its features again, all restored."""
        self.expansions = None  # belonged to the replayed round
        for role in self.roles:
            self.actors.revive(role)
        if self.encoders is not None:
            self.encoders.revive()
        self._prepare_encoders()
        for split, (rows, feats) in features.items():
            ray.get(self.source.set_features.remote(split, rows, feats))
        self.restore(parts)

    def timings(self) -> dict[str, dict]:
        roles = list(self.roles) + (self.encoders.roles if self.encoders is not None else [])
        handles = [self.actors.handle(r) for r in roles]
        return dict(zip(roles, ray.get([h.timings.remote() for h in handles])))


def encode_into_cache(config: RunConfig, source: ray.actor.ActorHandle, encoders: EncoderPool, info: StreamInfo,
                      progress: Progress) -> dict[str, tuple[ray.ObjectRef, ray.ObjectRef]]:
    """Encode every row the stream needs that the Parquet cache lacks, then hand the features to the source.
    Returns the (rows, features) object refs per split, to hand over again if the source is ever restarted."""
    cache = FeatureCache(config.runtime.cache_dir)
    handed = {}
    for split in ("train", "test"):
        key = FeatureCache.key(encoders.id, info.name, split)
        rows = ray.get(source.needed_rows.remote(split))
        feats, missing = cache.lookup(key, rows)
        if feats is None:
            bs = config.stream.batch_size
            chunks = [missing[a:a + bs] for a in range(0, len(missing), bs)]
            bar = progress.bar(f"encode {split} ({encoders.id})", len(chunks))
            pending: deque[tuple[np.ndarray, ray.ObjectRef]] = deque()
            results = []
            for chunk in chunks:
                features, _ = encoders.encode(source.raw_rows.remote(split, chunk))
                pending.append((chunk, features))
                if len(pending) > config.runtime.max_in_flight * len(encoders.roles):
                    results.append(_take(pending, bar))
            while pending:
                results.append(_take(pending, bar))
            bar.close()
            cache.add(key, np.concatenate([r for r, _ in results]), np.concatenate([f for _, f in results]))
            feats, missing = cache.lookup(key, rows)
        handed[split] = (ray.put(rows), ray.put(feats))
        ray.get(source.set_features.remote(split, *handed[split]))
    return handed


def _take(pending: deque, bar) -> tuple[np.ndarray, np.ndarray]:
    rows, ref = pending.popleft()
    batch = ray.get(ref)
    bar.update(1)
    if batch is None or batch.num_rows != len(rows):
        raise RuntimeError(f"the encoder refused rows of the dataset itself (rows {rows[:5].tolist()}...): "
                           "its features are not finite")
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


BatchHook = Callable[[int, int], None]  # called with (visit, batch index) after each batch is submitted
RoundHook = Callable[[int, "RunState", "Pipeline"], None]  # called after each round is committed


def plan_rounds(info: StreamInfo, task_free: bool, every: int) -> list[list[tuple[int, int]]]:
    """The units of consolidation, commit and replay, as (visit, batch index) lists: one visit each when task
    boundaries are given; K consecutive batches regardless of visits when task-free (the learner is told
    nothing at boundaries; evaluation still happens after the round in which a visit ends)."""
    if not task_free:
        return [[(v, i) for i in range(n)] for v, n in enumerate(info.visit_batches)]
    flat = [(v, i) for v, n in enumerate(info.visit_batches) for i in range(n)]
    return [flat[a:a + every] for a in range(0, len(flat), every)]


def run(config: RunConfig | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
        progress: bool | None = None, actors: ActorCache | None = None, on_batch: BatchHook | None = None,
        on_round: RoundHook | None = None) -> dict:
    """Run (or resume) one continual-learning stream; returns the metrics dict written to metrics.json.

    `actors`: reuse the actors of earlier runs (they are reset); by default the run starts and kills its own.
    `on_batch` / `on_round`: observers (fault injection in tests, resource sampling in `memcl stress`).
    """
    if resume is not None:
        run_dir = preflight.run_folder(resume, "config.yaml")
        config = load_config(run_dir / "config.yaml")
    config = preflight.with_absolute_paths(config or RunConfig())
    spec = preflight.check_run(config)  # before Ray starts: a bad config fails in a second, with one line
    own = actors is None
    actors = actors or ActorCache()
    try:
        started = time.perf_counter()
        ensure_ray(config)
        source = _source(config, actors)
        info: StreamInfo = ray.get(source.describe.remote())
        run_dir = run_dir or new_run_dir(config, info.name)
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume is None:
            dump_config(config, run_dir / "config.yaml")
        try:
            return _run(config, spec, source, info, run_dir, resume is not None, progress, actors, started,
                        on_batch, on_round)
        except KeyboardInterrupt:
            raise RunInterrupted(run_dir) from None
    finally:
        if own:
            actors.close()


def _source(config: RunConfig, actors: ActorCache) -> ray.actor.ActorHandle:
    rt = config.runtime
    return actors.get("source", StreamSource, {"num_cpus": 0, "max_restarts": rt.max_restarts}, config.data,
                      config.stream, rt.max_batch_rows)


def encode_stream(config: RunConfig, actors: ActorCache) -> float:
    """Encode what `config`'s stream needs into the feature cache, with a progress bar whatever
    `runtime.progress` says, and return the seconds it took (about 0 when cached, features or in-line encoding):
    `memcl bench` does it once, before its runs, so no method's time includes it."""
    config = preflight.with_absolute_paths(config)
    preflight.check_run(config)
    ensure_ray(config)
    started = time.perf_counter()
    source = _source(config, actors)
    info: StreamInfo = ray.get(source.describe.remote())
    if info.feature_dim is None and config.runtime.cache_dir and info.cacheable:
        encode_into_cache(config, source, EncoderPool(config, info.payload, actors), info, Progress(enabled=True))
    return time.perf_counter() - started


def _run(config: RunConfig, spec: MethodSpec, source: ray.actor.ActorHandle, info: StreamInfo, run_dir: Path,
         resumed: bool, progress: bool | None, actors: ActorCache, started: float, on_batch: BatchHook | None,
         on_round: RoundHook | None) -> dict:
    rt = config.runtime
    bars = Progress(enabled=rt.progress if progress is None else progress)
    if spec.family == "nsr":  # NSR trains LoRA inside the encoder on raw batches: its own loop
        from pipeline.adapter_runner import run_adapter

        return run_adapter(config, info, source, run_dir, resumed, bars, started, actors)

    encoders, features = None, {}
    t0 = time.perf_counter()
    if info.feature_dim is None:
        encoders = EncoderPool(config, info.payload, actors)
        if rt.cache_dir and info.cacheable:
            features = encode_into_cache(config, source, encoders, info, bars)
        info = ray.get(source.describe.remote())
        info.feature_dim = info.feature_dim or encoders.dim
    pipe = Pipeline(config, spec, info, actors, encoders, inline=encoders is not None and not features)
    state = RunState()
    ckpt_dir = run_dir / "checkpoints"
    if resumed and (found := checkpoint.latest_valid(ckpt_dir)) is not None:
        path, parts, meta = found
        pipe.restore(parts)
        state = RunState(**meta)
        log.info("resumed from %s at round %d", path, state.next_round)
    state.add_wall("encode_cache", time.perf_counter() - t0)
    earlier = state.elapsed  # the sessions before this one (a resumed run's total counts them, as its phases do)
    last_good = pipe.state()  # what a fault rolls every actor back to

    rounds = plan_rounds(info, config.stream.task_free, config.method.consolidate_every)
    reports = Reports(bars, keep_losses=rt.tensorboard)  # the trainers report their epochs through it
    board = TensorBoardLog(run_dir) if rt.tensorboard else None
    for r in range(state.next_round, len(rounds)):
        for attempt in range(rt.max_recoveries + 1):
            try:
                outcome = _round(pipe, info, state, rounds[r], bars, reports, on_batch)
                break
            except Exception as err:
                if not is_fault(err) or attempt == rt.max_recoveries:
                    raise
                log.warning("actor fault in round %d (%s); restoring and replaying it", r, type(err).__name__)
                state.recoveries += 1
                pipe.revive(last_good, features)
        _commit_round(pipe, info, state, r, outcome, run_dir)
        state.elapsed = earlier + time.perf_counter() - started
        last_good = pipe.state()
        if rt.checkpoint:
            t_ckpt = time.perf_counter()
            checkpoint.write(ckpt_dir, r, last_good, state.to_json())
            state.add_wall("checkpoint", time.perf_counter() - t_ckpt)
        if on_round is not None:
            on_round(r, state, pipe)
        if board is not None:
            board.round(state)

    reports.close()
    pipe.flush_cache()
    metrics = collect_metrics(config, pipe, info, state, earlier + time.perf_counter() - started)
    report.write_run(run_dir, metrics)
    if board is not None:
        board.close(metrics)
    metrics["run_dir"] = str(run_dir)
    return metrics


def _round(pipe: Pipeline, info: StreamInfo, state: RunState, batches: list[tuple[int, int]], bars: Progress,
           reports: Reports, on_batch: BatchHook | None) -> dict:
    """Stream one round, consolidate, and evaluate after the visits it ends. Nothing of the run state changes
    here, so a fault can replay it."""
    rt = pipe.config.runtime
    first, last = batches[0][0], batches[-1][0]
    task = info.visits[first]
    what = (f"task {task + 1}/{len(info.task_classes)} (visit {first + 1}/{len(info.visits)})" if first == last
            else f"visits {first + 1}-{last + 1}/{len(info.visits)}")
    in_flight = InFlight(rt.max_in_flight, bars.bar(f"{what} stream", len(batches)))
    t_stream = time.perf_counter()
    block: list[ray.ObjectRef] = []
    letters: list[ray.ObjectRef] = []
    for v, i in batches:
        sub = pipe.learn_batch(v, i)
        block.append(sub.features)
        letters += sub.letters
        if on_batch is not None:
            on_batch(v, i)
        in_flight.add(sub.tail)
    in_flight.drain()
    stream_seconds = time.perf_counter() - t_stream
    consolidation = pipe.consolidate(block, reports, what)

    t_eval = time.perf_counter()
    ended = [v for v, i in batches if i == info.visit_batches[v] - 1]
    seen = list(state.seen_tasks)
    for v in sorted({v for v, _ in batches}):
        for t in ray.get(pipe.source.visit_tasks.remote(v)):
            if t not in seen:
                seen.append(t)
    accuracy: dict[int, float] = {}
    if any(v == len(info.visits) - 1 or (v + 1) % rt.evaluate_every == 0 for v in ended):
        recent = seen if rt.evaluate_window is None else seen[-rt.evaluate_window:]
        accuracy, test_letters = pipe.evaluate(sorted(recent), ended[-1])
        letters += test_letters
    refused = [t for t in ray.get(letters) if t.num_rows]
    return {"consolidation": consolidation, "accuracy": accuracy, "seen": seen, "ended": ended,
            "dead": pa.concat_tables(refused) if refused else None, "batches": len(batches),
            "seconds": {"stream": stream_seconds, "evaluate": time.perf_counter() - t_eval}}


def _commit_round(pipe: Pipeline, info: StreamInfo, state: RunState, r: int, outcome: dict, run_dir: Path) -> None:
    """Fold a completed round into the run state and write its dead letters."""
    for k, s in (*outcome["consolidation"]["seconds"].items(), *outcome["seconds"].items()):
        state.add_wall(k, s)
    state.consolidations += 1
    state.seen_tasks = outcome["seen"]
    accuracy = outcome["accuracy"]
    for _ in outcome["ended"]:  # one accuracy-matrix row per visit, as evaluated after the round that ended it
        state.acc_rows.append([accuracy.get(t, float("nan")) for t in range(len(info.task_classes))])
    dead = outcome["dead"]
    if dead is not None and dead.num_rows:
        (run_dir / "dead_letters").mkdir(exist_ok=True)
        pq.write_table(dead, run_dir / "dead_letters" / f"round-{r:06d}.parquet")  # a replay overwrites, never adds
        for reason, count in Counter(dead.column("reason").to_pylist()).items():
            state.refused[reason] = state.refused.get(reason, 0) + count
    memory = pipe.memory_report()
    evaluated = [a for a in accuracy.values() if not np.isnan(a)]
    state.round_log.append({"round": r, "visits_ended": outcome["ended"], "batches": outcome["batches"],
                            "accuracy": accuracy, "mean_evaluated": float(np.mean(evaluated)) if evaluated else None,
                            "memory": memory, "stage2": outcome["consolidation"]["stage2"],
                            "epoch_losses": outcome["consolidation"]["epoch_losses"],
                            "stream_seconds": outcome["seconds"]["stream"],
                            "refused": 0 if dead is None else dead.num_rows, "time": time.time()})
    state.next_round = r + 1


def collect_metrics(config: RunConfig, pipe: Pipeline, info: StreamInfo, state: RunState, wall: float) -> dict:
    from memcl_ops import metrics as M

    acc = np.array(state.acc_rows, dtype=np.float64).reshape(len(state.acc_rows), len(info.task_classes))
    first_rows = [info.visits.index(t) for t in range(len(info.task_classes)) if t in info.visits]
    square = acc[np.ix_(first_rows, list(range(len(first_rows))))] if first_rows else acc
    complete = square.size and not np.isnan(square[np.tril_indices(len(square))]).any()
    summary = M.Summary.of(square) if complete else None
    learned = ray.get(pipe.stage2.learned_ids.remote())
    history = ray.get(pipe.memory.history.remote()) if pipe.spec.memory else {}
    monitor = ray.get(pipe.monitor.counters.remote()) if pipe.monitor is not None else {}
    memory = pipe.memory_report()
    head_bytes = ray.get(pipe.stage2.memory_bytes.remote())
    timings = pipe.timings()
    busy = {f"{actor}.{stage}": v["seconds"] for actor, stages in timings.items() for stage, v in stages.items()}
    return {
        "method": config.method.name,
        "dataset": info.name,
        "seed": config.seed,
        "task_classes": info.task_classes,
        "class_names": info.extra.get("class_names"),
        "visits": info.visits,
        "acc_matrix": acc.tolist(),
        "summary": summary.as_dict() if summary else {},
        "final_accuracy_all_tasks": float(np.nanmean(acc[-1])) if acc.size and not np.isnan(acc[-1]).all() else None,
        "samples": {"stream": info.num_samples, "learned": len(learned), "unique_learned": len(np.unique(learned)),
                    "refused": sum(state.refused.values()), "refused_by_reason": state.refused},
        "slots": {"history": history.get("slot_history", []), "expansions": history.get("expansions", []),
                  "refused_expansions": history.get("refused_expansions", 0), "monitor": monitor},
        "memory_bytes": {**{k: v for k, v in memory.items() if k != "num_slots"},
                         **{f"head.{k}": v for k, v in head_bytes.items()}},
        "wall_seconds": {"total": wall, **state.wall},
        "actor_busy_seconds": busy,
        "round_log": state.round_log,
        "consolidations": state.consolidations,
        "recoveries": state.recoveries,
        "encoders": pipe.encoders.info if pipe.encoders is not None else [],
    }
