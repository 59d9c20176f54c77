"""The pipeline of the "features" family (MARS and its ablations, the baselines, the analytic heads): a learner
over frozen features, cached in Parquet or encoded in-line. Per training batch the driver only submits calls;
data moves between actors by object reference:

    source.train_batch -> [encoder.encode] -> memory.route -> monitor.observe -> memory.expand
          (gate)              (gate)

(`runtime.transport: compiled` moves the same data through the same actors as one Ray Compiled Graph, by
shared-memory channels instead of object refs: pipeline/compiled_chain.py.)
Ray runs one caller's calls to one actor in submission order, so each batch is routed by the memory as it stood
after the previous batch's expansions, and the result is the same for any `max_in_flight`. At the end of a round:
DCDA stage 1 on the round's block, then the head learner (stage 2) and its task-end snapshot, then evaluation after
the visits the round ended (task-free: at every evaluation point). Only the roles the method has are started
(memcl_ops/methods.py)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque

import numpy as np
import pyarrow as pa
import ray

from memcl.actors.memory_manager import MemoryManager
from memcl.actors.novelty_monitor import NoveltyMonitor
from memcl.actors.stage1_trainer import Stage1Trainer
from memcl.actors.stage2_trainer import Stage2Trainer
from memcl.pipeline import checkpoint, preflight
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.compiled_chain import ChainActors, CompiledChain
from memcl.pipeline.config import RunConfig
from memcl.pipeline.encoder_pool import EncoderPool
from memcl.pipeline.executors import ActorCalls
from memcl.pipeline.progress import InFlight, Progress, Reports
from memcl.pipeline.roles import BatchHook, Roles, RoundOutcome, RunState, ensure_ray, stream_source
from memcl_ops.arrow import schema as S
from memcl_ops.data.feature_cache import FeatureCache
from memcl_ops.data.sources import StreamInfo
from memcl_ops.realtime import StreamClock, start_clock
from memcl_ops.roles.features import FeatureFlow, role_plan
from memcl_ops.rounds import RoundBatches, Schedule, plan_rounds, seen_after
from memcl_ops.spec import MethodSpec

log = logging.getLogger("memcl")

ACTORS = {"memory": MemoryManager, "monitor": NoveltyMonitor, "stage1": Stage1Trainer, "stage2": Stage2Trainer}


class FeaturePipeline:
    """The actors of one "features" run: source, encoders (when features are not given), and the method's roles."""

    def __init__(self, config: RunConfig, spec: MethodSpec, info: StreamInfo, actors: ActorCache, bars: Progress):
        self.config, self.spec, self.actors = config, spec, actors
        rt = config.runtime
        self.encoders, self.features = None, {}
        self.encoding_seconds = 0.0  # filling the feature cache (the stream's own encoding is in its rounds)
        if info.feature_dim is None:
            self.encoders = EncoderPool(config, info.payload, actors)
            if rt.cache_dir and info.cacheable:
                t_encode = time.perf_counter()
                self.features = encode_into_cache(config, actors.handle("source"), self.encoders, info, bars)
                self.encoding_seconds = time.perf_counter() - t_encode
            info = ray.get(actors.handle("source").describe.remote())
            info.feature_dim = info.feature_dim or self.encoders.dim
        self.info = info
        self.offsets = np.cumsum([0, *info.visit_batches])  # the stream position of each visit's first batch
        self.task_free = config.stream.task_free
        self.rounds = len(self.plan())
        self.inline = self.encoders is not None and not self.features  # no feature cache: encode on the fly
        # rows encoded in-line (an arrow: folder's text or images) are looked up by payload in the content cache
        self.content_cache = rt.cache_dir if self.inline and rt.cache_dir else None
        self.method = method = spec.resolve(config.method)
        # An analytic head over features encoded in-line: each encoder replica sums the statistics of the batches it
        # encodes and the MemoryManager's statistics store merges them.
        self.merges = spec.mergeable and self.inline and method.analytic.accumulate_in == "encoders"
        names = ["source"]
        # each role computes where its placement put it: a GPU only where Ray assigned it one
        devices = {role: rt.device(role) for role in ("memory", "monitor", "stage1", "stage2")}
        plan = role_plan(spec, config.method, info.feature_dim, config.seed, merges=self.merges,
                         threads=rt.actor_threads, devices=devices, near_future=rt.prequential.near_future)
        for role, (_, args) in plan.items():
            actors.get(role, ACTORS[role], rt.actor_options(role), *args)
            names.append(role)
        self.roles = Roles(actors, names, tuple(self.encoders.roles) if self.encoders is not None else ())
        self.flow = FeatureFlow(ActorCalls(self.roles.handle), spec, config.method)
        self.chain: CompiledChain | None = None
        self.message_bytes: int | None = None
        self._prepare_encoders()
        self._compile()

    def _prepare_encoders(self) -> None:
        if self.merges:
            ray.get([r.use_statistics.remote(self.method.analytic, self.config.seed) for r in self.encoders.replicas])
        if self.content_cache:
            self.encoders.use_cache(self.content_cache)

    def __getattr__(self, role: str) -> ray.actor.ActorHandle | None:
        # pipe.memory, pipe.stage2, ...: the current handle of a role (it changes when a role is revived)
        if role in ("source", "memory", "monitor", "stage1", "stage2"):
            return self.roles.handle(role)
        raise AttributeError(role)

    def plan(self) -> list[RoundBatches]:
        return plan_rounds(self.info, self.task_free, self.config.method.consolidate_every, self.config.runtime.anytime)

    def _features(self, batch_ref: ray.ObjectRef, letters: list[ray.ObjectRef], accumulate: bool = False
                  ) -> ray.ObjectRef:
        if not self.inline:
            return batch_ref
        features, more = self.encoders.encode(batch_ref, accumulate)
        letters.append(more)
        return features

    def learn_batch(self, visit: int, index: int, letters: list[ray.ObjectRef]) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        """Submit one training batch through the chain: (its feature batch, the last call of its chain)."""
        batch, refused = self.source.train_batch.remote(visit, index)
        letters.append(refused)
        feats = self._features(batch, letters, accumulate=self.merges)
        tail = self.flow.learn_batch(feats)
        return feats, tail

    def consolidate(self, batches: list[ray.ObjectRef], learned: list[bool] | None, reports: Reports, what: str
                    ) -> tuple[dict, dict[str, float]]:
        """The round's batches predicted, then DCDA stage 1 and stage 2 (or the method's head training) on those
        learned, then the task-end snapshot; the trainers' epochs are shown as `what` stage 1 / stage 2 bars.
        Returns (report, seconds per stage)."""
        partials = self.encoders.take_statistics() if self.merges else None
        out, seconds = self.flow.consolidate(batches, learned=learned, partials=partials, progress=reports.queue,
                                             wait=lambda ref: reports.get(ref, what))
        out["epoch_losses"] = reports.take_losses()
        return out, seconds

    def stream_round(self, batches: RoundBatches, state: RunState, reports: Reports, on_batch: BatchHook | None
                     ) -> RoundOutcome:
        """Stream one round, consolidate, and evaluate after the visits it ends (task-free: if it is an evaluation
        point)."""
        rt, info = self.config.runtime, self.info
        first, last = batches[0][0], batches[-1][0]
        what = (f"task {info.visits[first] + 1}/{len(info.task_classes)} (visit {first + 1}/{len(info.visits)})"
                if first == last else f"visits {first + 1}-{last + 1}/{len(info.visits)}")
        bar = reports.progress.bar(f"{what} stream", len(batches))
        t_stream = time.perf_counter()
        letters: list[ray.ObjectRef] = []
        clock = self.clock(state)
        learned = None
        if rt.transport == "compiled":
            block, refused = self.stream_compiled(batches, bar, on_batch)
        else:
            (block, learned), refused = self.stream_classic(batches, bar, letters, on_batch, clock), []
        seconds = {"stream": time.perf_counter() - t_stream}
        consolidation, trained = self.consolidate(block, learned, reports, what)
        predictions = consolidation.pop("prequential")
        seconds.update(trained)
        if clock is not None and self.config.stream.realtime.mode == "wall":
            clock.measured(seconds["stream"] + trained["stage1"] + trained["stage2"], sum(learned))

        t_eval = time.perf_counter()
        schedule = Schedule(self.task_free, self.rounds, rt.evaluate_every, rt.evaluate_window, rt.anytime)
        ended = schedule.ended(info, batches)
        seen = seen_after(state.seen_tasks, ray.get([self.source.visit_tasks.remote(v)
                                                     for v in sorted({v for v, _ in batches})]))
        accuracy: dict[int, float] = {}
        if schedule.due(info, state.next_round, ended):
            reports.phase("evaluate")
            accuracy = self.evaluate(schedule.tasks(seen, state.next_round, len(info.task_classes)),
                                     schedule.test_visit(batches, ended), letters)
        refused = [t for t in [*refused, *ray.get(letters)] if t.num_rows]
        seconds["evaluate"] = time.perf_counter() - t_eval
        return RoundOutcome(accuracy, seen, ended, len(batches), pa.concat_tables(refused) if refused else None,
                            seconds, consolidation, predictions, None if clock is None else dataclasses.asdict(clock))

    def clock(self, state: RunState) -> StreamClock | None:
        """The stream's clock as the last committed round left it (a copy: only a commit moves it); None when the
        stream waits for its learner."""
        realtime = self.config.stream.realtime
        if not realtime.on:
            return None
        if state.realtime is None:
            return start_clock(realtime, self.spec, self.config.method)
        return StreamClock(**state.realtime)

    def stream_classic(self, batches: RoundBatches, bar, letters: list[ray.ObjectRef], on_batch: BatchHook | None,
                       clock: StreamClock | None = None) -> tuple[list[ray.ObjectRef], list[bool]]:
        """The round's batches as actor calls (their dead letters join `letters`); returns (the round's feature
        batches, whether the learner took each). With a `clock`, a batch that arrives while the learner is busy is
        fetched for its prediction and not learned."""
        in_flight = InFlight(self.config.runtime.max_in_flight, bar)
        block: list[ray.ObjectRef] = []
        learned: list[bool] = []
        rate = self.config.stream.realtime.rate
        for v, i in batches:
            takes = clock is None or clock.admit(self.offsets[v] + i, rate)
            if takes:
                feats, tail = self.learn_batch(v, i, letters)
            else:
                batch, refused = self.source.train_batch.remote(v, i)
                letters.append(refused)
                feats = tail = self._features(batch, letters)
            block.append(feats)
            learned.append(takes)
            if on_batch is not None:
                on_batch(v, i)
            in_flight.add(tail)
        in_flight.drain()
        return block, learned

    def _compile(self) -> None:
        """The compiled chain over the current actors (`runtime.transport: compiled`), built during setup and again
        after a fault, so no round's streaming time holds a compile."""
        rt = self.config.runtime
        if rt.transport != "compiled":
            return
        self.chain = CompiledChain(ChainActors(
            self.source, lambda binding: FeatureFlow(binding, self.spec, self.config.method),
            self.encoders.replicas if self.inline else (), self.memory if self.spec.memory else None,
            self.monitor, accumulate=self.merges),
            rt.max_in_flight, rt.compiled_timeout_s, self._message_bytes())

    def _message_bytes(self) -> int:
        """A bound on one hop's message, measured once per run: twice the larger of the stream's largest emitted
        batch and a batch of float32 features (twice: a dead-letter table or a routing may add to a batch)."""
        if self.message_bytes is None:
            features = self.config.stream.batch_size * (4 * self.info.feature_dim + 64)  # + ids, label, task
            self.message_bytes = 2 * max(ray.get(self.source.largest_batch_bytes.remote()), features)
        return self.message_bytes

    def stream_compiled(self, batches: RoundBatches, bar, on_batch: BatchHook | None
                        ) -> tuple[list[ray.ObjectRef], list[pa.Table]]:
        """The round's batches through the compiled chain: (the round's block, its dead-letter tables)."""
        def on_step(step: list[tuple[int, int]]) -> None:
            bar.update(len(step))
            for v, i in step if on_batch is not None else ():
                on_batch(v, i)
        try:
            return self.chain.stream(batches, on_step)
        finally:
            bar.close()

    def close(self) -> None:
        """Release the actors from the compiled chain, if one was built (a teardown that fails after a fault is
        logged: the graph is gone either way, and the replay or the run's own error matters more)."""
        chain, self.chain = self.chain, None
        if chain is not None:
            try:
                chain.close()
            except Exception as err:
                log.warning("compiled chain teardown: %s: %s", type(err).__name__, err)

    def evaluate(self, tasks: list[int], after_visit: int, letters: list[ray.ObjectRef]) -> dict[int, float]:
        """Accuracy per task on its test data (refused test rows join `letters`)."""
        refs = {}
        for t in tasks:
            refs[t] = []
            for k in range(self.info.test_batches[t]):
                batch, refused = self.source.test_batch.remote(t, k, after_visit)
                letters.append(refused)
                refs[t].append(self.flow.evaluate(self._features(batch, letters)))
        accuracy = {}
        for t, parts in refs.items():
            counts = np.array(ray.get(parts)).reshape(-1, 2).sum(axis=0)
            accuracy[t] = float(counts[0] / counts[1]) if counts[1] else float("nan")
        return accuracy

    def memory_report(self) -> dict[str, int]:
        """Bytes of all persistent memory: the MemoryManager's stores, the novelty monitor's references, the head."""
        return self.flow.memory_report()

    def revive(self, parts: dict[str, checkpoint.State] | None) -> None:
        """After a fault: every role alive and reset, the source given its features again, all restored."""
        self.flow.expansions = None  # belonged to the replayed round
        self.close()  # the fault shut the compiled graph down; it is compiled again over the revived actors below
        self.roles.revive()
        if self.encoders is not None:
            self.encoders.revive()
        self._prepare_encoders()
        for split, (rows, feats) in self.features.items():
            ray.get(self.source.set_features.remote(split, rows, feats))
        self.roles.restore(parts)
        self._compile()

    def learned_ids(self) -> np.ndarray:
        return ray.get(self.stage2.learned_ids.remote())

    def finish(self, state: RunState) -> dict:
        if self.content_cache:  # the rows encoded in-line, written to the content cache once per run
            self.encoders.flush_cache()
        confusion = self.class_confusion() if self.config.runtime.anytime else None
        history = ray.get(self.memory.call.remote("slots", "history")) if self.spec.memory else {}
        monitor = ray.get(self.monitor.counters.remote()) if self.monitor is not None else {}
        return {"slots": {"history": history.get("slot_history", []), "expansions": history.get("expansions", []),
                          "refused_expansions": history.get("refused_expansions", 0), "monitor": monitor},
                "memory_bytes": {k: v for k, v in self.memory_report().items() if k != "num_slots"},
                "encoders": self.encoders.info if self.encoders is not None else [],
                **({"class_confusion": confusion} if confusion is not None else {})}

    def class_confusion(self) -> dict:
        """The class confusion matrix of the model at the end on every task's test data (as of the last visit):
        counts[i][k], rows of true class classes[i] predicted as classes[k] (-1: no class known)."""
        letters: list[ray.ObjectRef] = []
        parts = [self.flow.confusion(self._features(self.source.test_batch.remote(t, k, len(self.info.visits) - 1)[0],
                                                    letters))
                 for t in range(len(self.info.task_classes)) for k in range(self.info.test_batches[t])]
        pairs = np.concatenate([np.zeros((0, 2), np.int64), *ray.get(parts)])
        classes = sorted({c for task in self.info.task_classes for c in task} | set(pairs.ravel().tolist()))
        index = {c: i for i, c in enumerate(classes)}
        counts = np.zeros((len(classes), len(classes)), np.int64)
        np.add.at(counts, ([index[c] for c in pairs[:, 0]], [index[c] for c in pairs[:, 1]]), 1)
        return {"classes": classes, "counts": counts.tolist()}


def encode_into_cache(config: RunConfig, source: ray.actor.ActorHandle, encoders: EncoderPool, info: StreamInfo,
                      progress: Progress) -> dict[str, tuple[ray.ObjectRef, ray.ObjectRef]]:
    """Encode every row the stream needs that the Parquet cache lacks, then hand the features to the source.
    Returns the (rows, features) object refs per split, to hand over again if the source is ever restarted."""
    cache = FeatureCache(config.runtime.cache_dir)
    handed = {}
    for split in ("train", "test"):
        key = FeatureCache.key(encoders.id, encoders.fingerprint, info.name, split)
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


def encode_stream(config: RunConfig, actors: ActorCache) -> float:
    """Encode what `config`'s stream needs into the feature cache, with a progress bar whatever
    `runtime.progress` says, and return the seconds it took (about 0 when cached, features or in-line encoding):
    `memcl bench` does it once, before its runs, so no method's time includes it."""
    config = preflight.with_absolute_paths(config)
    preflight.check_run(config)
    ensure_ray(config)
    started = time.perf_counter()
    source = stream_source(config, actors)
    info: StreamInfo = ray.get(source.describe.remote())
    if info.feature_dim is None and config.runtime.cache_dir and info.cacheable:
        encode_into_cache(config, source, EncoderPool(config, info.payload, actors), info, Progress(enabled=True))
    return time.perf_counter() - started
