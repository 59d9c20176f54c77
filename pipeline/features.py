"""The pipeline of the "features" family (MARS and its ablations, the baselines, the analytic heads): a learner
over frozen features, cached in Parquet or encoded in-line. Per training batch the driver only submits calls;
data moves between the roles by object reference:

    source.train_batch -> [encoder.encode] -> memory.route -> monitor.observe -> memory.expand
          (gate)              (gate)       -> predictor.step (predicted, then learned by the per-batch step)

(`runtime.transport: compiled` moves the same data through the same actors as one Ray Compiled Graph, by
shared-memory channels instead of object refs: pipeline/compiled_chain.py.)
One caller's calls to one role run in submission order, so each batch is routed by the memory as it stood after the
previous batch's expansions, and predicted by the model published before it, whatever `max_in_flight`. When a
round ends its rows are due; the stream's clock (memcl_ops/realtime.py) says when the consolidation that takes
them (DCDA stage 1, the trained head) starts in the background and when it is published, and the stream goes on
meanwhile unless it waits. Evaluation after the visits a round ends (task-free: at every evaluation point) reads the
model served then. Only the roles the method has are started (memcl_ops/methods.py). The roles are actors, or held
in this process (`LocalActors`): the same code either way."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import ray

from memcl.actors.memory_manager import MemoryManager
from memcl.actors.novelty_monitor import NoveltyMonitor
from memcl.actors.predictor import Predictor
from memcl.actors.stage1_trainer import Stage1Trainer
from memcl.actors.stage2_trainer import Stage2Trainer
from memcl.pipeline import checkpoint, preflight
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.compiled_chain import ChainActors, CompiledChain
from memcl.pipeline.config import ConfigError, RunConfig
from memcl.pipeline.encoder_pool import EncoderPool
from memcl.pipeline.local import LocalActors
from memcl.pipeline.progress import Progress, Reports
from memcl.pipeline.roles import Roles, RoundEnd, RunState, ensure_ray, stream_source
from memcl_ops.arrow import schema as S
from memcl_ops.clock import overlap_seconds
from memcl_ops.costs import consolidation_cost
from memcl_ops.data.feature_cache import FeatureCache
from memcl_ops.data.sources import StreamInfo
from memcl_ops.methods import feature_bound
from memcl_ops.realtime import StreamClock
from memcl_ops.roles.features import FeatureFlow, role_plan
from memcl_ops.rounds import RoundBatches, plan_rounds
from memcl_ops.spec import MethodSpec

log = logging.getLogger("memcl")

ACTORS = {"memory": MemoryManager, "monitor": NoveltyMonitor, "stage1": Stage1Trainer, "stage2": Stage2Trainer,
          "predictor": Predictor}


@dataclass
class OpenRound:
    """The round being streamed: its batches, the stream's clock (a copy of the committed one: only a commit moves
    it), what it published and predicted so far, and the batches a compiled chain streams at the round's last."""

    batches: RoundBatches
    clock: StreamClock
    installs: list = field(default_factory=list)
    predictions: list = field(default_factory=list)
    compiled: list = field(default_factory=list)


class FeaturePipeline:
    """The roles of one "features" run: source, encoders (when features are not given), and the method's roles."""

    def __init__(self, config: RunConfig, spec: MethodSpec, info: StreamInfo, actors: ActorCache | LocalActors,
                 bars: Progress):
        self.config, self.spec, self.actors = config, spec, actors
        rt = config.runtime
        self.encoders, self.features = None, {}
        self.encoding_seconds = 0.0  # filling the feature cache (the stream's own encoding is in its rounds)
        if info.feature_dim is None:
            if actors.local:
                raise ConfigError(f"the stream {info.name!r} carries {info.payload!r}, not features: run it with "
                                  "`memcl.run` (its encoder actors fill the feature cache), or stream features")
            self.encoders = EncoderPool(config, info.payload, actors)
            if rt.cache_dir and info.cacheable:
                t_encode = time.perf_counter()
                self.features = encode_into_cache(config, actors.handle("source"), self.encoders, info, bars)
                self.encoding_seconds = time.perf_counter() - t_encode
            info = ray.get(actors.handle("source").describe.remote())
        self._take(info)
        self.task_free = config.stream.task_free
        self.ended = not config.stream.follow  # a followed folder's stream ends at its idle timeout
        self.inline = self.encoders is not None and not self.features  # no feature cache: encode on the fly
        # rows encoded in-line (an arrow: folder's text or images) are looked up by payload in the content cache
        self.content_cache = rt.cache_dir if self.inline and rt.cache_dir else None
        self.method = spec.resolve(config.method)
        names = ["source"]
        # each role computes where its placement put it: a GPU only where Ray assigned it one
        devices = {role: rt.device(role) for role in ("memory", "monitor", "stage1", "stage2", "predictor")}
        plan = role_plan(spec, config.method, info.feature_dim, config.seed, threads=rt.actor_threads,
                         devices=devices, near_future=rt.prequential.near_future, buffer=config.stream.buffer)
        for role, (_, args) in plan.items():
            actors.get(role, ACTORS[role], rt.actor_options(role), *args)
            names.append(role)
        # a trainer's head between consolidations is the predictor's published snapshot
        self.roles = Roles(actors, names, tuple(self.encoders.roles) if self.encoders is not None else (),
                           copies={"stage2": "predictor"} if "stage2" in plan else {})
        self.x, self.runtime = self.roles.x, rt
        self.flow = FeatureFlow(self.x, spec, config.method)
        self.cost = consolidation_cost(spec, config.method)
        self.chain: CompiledChain | None = None
        self.message_bytes: int | None = None
        self._prepare_encoders()
        self._compile()

    def _prepare_encoders(self) -> None:
        """In-line encoding: the encoders refuse rows beyond what the method takes, and look rows up in the content
        cache."""
        if self.inline:
            bound = feature_bound(self.config.method, self.encoders.dim, self.config.seed)
            ray.get([r.use_bound.remote(bound) for r in self.encoders.replicas])
        if self.content_cache:
            self.encoders.use_cache(self.content_cache)

    def _take(self, info: StreamInfo) -> None:
        """The stream as the source describes it now (a followed folder's grows)."""
        info.feature_dim = info.feature_dim or (self.encoders.dim if self.encoders is not None else None)
        self.info = info
        self.offsets = np.cumsum([0, *info.visit_batches])  # the stream position of each visit's first batch

    def plan(self) -> list[RoundBatches]:
        return plan_rounds(self.info, self.task_free, self.config.method.consolidate_every, self.config.runtime.anytime,
                           ended=self.ended)

    def follow(self, wait: bool) -> None:
        """A followed folder: the files that landed in train/ taken. With `wait` (the loop has no round to stream),
        train/ is listed every `stream.poll_s` until some have, or the stream ends once it has waited
        `stream.idle_timeout_s` (the time rounds take is no idle time: a slow round never ends the stream)."""
        stream = self.config.stream
        waiting_since = time.monotonic()
        while True:
            info = self.x.get(self.x.call("source", "follow", self.info.fingerprint))
            if info is not None:
                self._take(info)
                return
            if not wait:
                return
            if stream.idle_timeout_s is not None and time.monotonic() - waiting_since >= stream.idle_timeout_s:
                self.ended = True
                log.info("no new file in %s for %g s: the stream ends", self.info.name, stream.idle_timeout_s)
                return
            time.sleep(stream.poll_s)

    def _features(self, batch: object, letters: list) -> object:
        if not self.inline:
            return batch
        features, more = self.encoders.encode(batch)
        letters.append(more)
        return features

    def clock(self, state: RunState) -> StreamClock:
        """The stream's clock as the last committed round left it (a copy: only a commit moves it)."""
        if state.realtime is None:
            return StreamClock.start(self.config.stream.realtime, self.cost, self.config.stream.batch_size)
        return StreamClock(**state.realtime)

    def begin_round(self, batches: RoundBatches, state: RunState, reports: Reports) -> None:
        """The clock as the last commit left it, and the consolidation it had in flight started again after a
        restore."""
        self.round = OpenRound(batches, self.clock(state))
        self.flow.resume(self.round.clock, reports.queue)

    def observe(self, visit: int, index: int, letters: list) -> object:
        """One training batch: whatever the clock has done by its arrival (a consolidation published or started),
        then the batch fetched, encoded, routed and predicted, then learned by the per-batch step. Returns its
        predictions' handle (None with the compiled chain, which streams a round at its last batch)."""
        x, now = self.x, self.round
        if self.chain is not None:
            now.compiled.append((visit, index))
            if len(now.compiled) == len(now.batches):
                block, refused = self.chain.stream(now.compiled, lambda step: None)
                now.predictions.append(self.flow.step(*block))
                letters += refused
            return None
        clock = now.clock
        now.installs += self.flow.advance(clock, clock.arrival(self.offsets[visit] + index))
        batch, dead = x.call("source", "train_batch", visit, index)
        letters.append(dead)
        features = self._features(batch, letters)
        self.flow.route(features)
        now.predictions.append(self.flow.step(features))
        return now.predictions[-1]

    def end_round(self, state: RunState, reports: Reports, *, final: bool) -> RoundEnd:
        """The round's rows are due: the clock starts (and, when the stream waits, publishes) their consolidation;
        `final`: the trainers work off every due round."""
        now, x = self.round, self.x
        clock, (v, i) = now.clock, now.batches[-1]
        self.flow.end_round(clock)
        now.installs += self.flow.advance(clock, clock.arrival(self.offsets[v] + i), final=final,
                                          progress=reports.queue)
        reported = [reports.get(p.report, "consolidate") for p in now.installs]
        tables = [t for t in x.get(now.predictions) if t.num_rows]
        log = {"consolidations": [{k: v for k, v in r.items() if k != "installed_at"} for r in reported],
               "epoch_losses": reports.take_losses(), **self._overlap(now.installs, reported)}
        return RoundEnd(log, pa.concat_tables(tables) if tables else None, dataclasses.asdict(clock))

    def visit_tasks(self, visits: list[int]) -> list[list[int]]:
        return self.x.get([self.x.call("source", "visit_tasks", v) for v in visits])

    def _overlap(self, published: list, reported: list[dict]) -> dict[str, float]:
        """The encoders' busy seconds this round, and how many of them fell while a consolidation ran: between its
        submission and its install (the one still in flight: until now). Encoders only: nothing without them."""
        if not self.inline:
            return {}
        windows = [(p.submitted, r["installed_at"]) for p, r in zip(published, reported, strict=True)]
        if self.flow.job is not None:
            windows.append((self.flow.job.submitted, time.time()))
        busy = self.encoders.take_intervals()
        return {"encoder_busy_s": sum(end - start for start, end in busy),
                "encoder_busy_consolidating_s": overlap_seconds(busy, windows)}

    def _compile(self) -> None:
        """The compiled chain over the current actors (`runtime.transport: compiled`), built during setup and again
        after a fault, so no round's streaming time holds a compile."""
        rt = self.config.runtime
        if rt.transport != "compiled":
            return
        self.chain = CompiledChain(ChainActors(
            self.actors.handle("source"), lambda binding: FeatureFlow(binding, self.spec, self.config.method),
            self.encoders.replicas if self.inline else (), self.roles.handle("memory"),
            self.roles.handle("monitor")),
            rt.max_in_flight, rt.compiled_timeout_s, self._message_bytes())

    def _message_bytes(self) -> int:
        """A bound on one hop's message, measured once per run: twice the larger of the stream's largest emitted
        batch and a batch of float32 features (twice: a dead-letter table or a routing may add to a batch)."""
        if self.message_bytes is None:
            features = self.config.stream.batch_size * (4 * self.info.feature_dim + 64)  # + ids, label, task
            self.message_bytes = 2 * max(self.x.get(self.x.call("source", "largest_batch_bytes")), features)
        return self.message_bytes

    def close(self) -> None:
        """Release the actors from the compiled chain, if one was built (a teardown that fails after a fault is
        logged: the graph is gone either way, and the replay or the run's own error matters more)."""
        chain, self.chain = self.chain, None
        if chain is not None:
            try:
                chain.close()
            except Exception as err:
                log.warning("compiled chain teardown: %s: %s", type(err).__name__, err)

    def evaluate(self, tasks: list[int], after_visit: int, letters: list, reports: Reports) -> dict[int, float]:
        """Accuracy per task on its test data as of `after_visit`, by the model served now (refused test rows join
        `letters`)."""
        x, refs = self.x, {}
        for t in tasks:
            refs[t] = []
            for k in range(self.info.test_batches[t]):
                batch, refused = x.call("source", "test_batch", t, k, after_visit)
                letters.append(refused)
                refs[t].append(self.flow.evaluate(self._features(batch, letters)))
        accuracy = {}
        for t, parts in refs.items():
            counts = np.array(x.get(parts)).reshape(-1, 2).sum(axis=0)
            accuracy[t] = float(counts[0] / counts[1]) if counts[1] else float("nan")
        return accuracy

    def memory_report(self) -> dict[str, int]:
        """Bytes of all persistent memory: the MemoryManager's stores, the novelty monitor's references, the served
        head, the prototypes and the consolidation buffer."""
        return self.flow.memory_report()

    def revive(self, parts: dict[str, checkpoint.State] | None) -> None:
        """After a fault: every role alive and reset, the source given its features again, all restored."""
        self.flow.forget_job()  # belonged to the replayed round, or to the actors before
        self.close()  # the fault shut the compiled graph down; it is compiled again over the revived actors below
        self.roles.revive()
        if self.encoders is not None:
            self.encoders.revive()
            self._prepare_encoders()
        for split, (rows, feats) in self.features.items():
            self.x.get(self.x.call("source", "set_features", split, rows, feats))
        self.roles.restore(parts)
        if self.config.stream.follow:  # the source back at the files the driver plans over (the last commit's and more)
            self.x.get(self.x.call("source", "hold", self.info.extra["train_files"]))
        self._compile()

    def learned_counts(self) -> tuple[int, int]:
        return self.x.get(self.x.call("predictor", "learned_counts"))

    def finish(self, state: RunState) -> dict:
        x = self.x
        if self.content_cache:  # the rows encoded in-line, written to the content cache once per run
            self.encoders.flush_cache()
        confusion = self.class_confusion() if self.config.runtime.anytime else None
        history = x.get(x.call("memory", "call", "slots", "history")) if self.spec.memory else {}
        monitor = x.get(x.call("monitor", "counters")) if x.has("monitor") else {}
        return {"slots": {"history": history.get("slot_history", []), "expansions": history.get("expansions", []),
                          "refused_expansions": history.get("refused_expansions", 0), "monitor": monitor},
                "memory_bytes": {k: v for k, v in self.memory_report().items() if k != "num_slots"},
                "consolidation": {**x.get(x.call("predictor", "counters")), **{
                    key: sum(entry.get(key, 0.0) for entry in state.records("round_log"))
                    for key in ("encoder_busy_s", "encoder_busy_consolidating_s") if self.inline}},
                "encoders": self.encoders.info if self.encoders is not None else [],
                **({"class_confusion": confusion} if confusion is not None else {})}

    def class_confusion(self) -> dict:
        """The class confusion matrix of the model at the end on every task's test data (as of the last visit):
        counts[i][k], rows of true class classes[i] predicted as classes[k] (-1: no class known)."""
        x, letters = self.x, []
        parts = [self.flow.confusion(self._features(x.call("source", "test_batch", t, k, len(self.info.visits) - 1)[0],
                                                    letters))
                 for t in range(len(self.info.task_classes)) for k in range(self.info.test_batches[t])]
        pairs = np.concatenate([np.zeros((0, 2), np.int64), *x.get(parts)])
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
            try:
                for chunk in chunks:
                    features, _ = encoders.encode(source.raw_rows.remote(split, chunk))
                    pending.append((chunk, features))
                    if len(pending) > config.runtime.max_in_flight * len(encoders.roles):
                        results.append(_take(pending, bar))
                while pending:
                    results.append(_take(pending, bar))
            finally:  # an actor fault keeps what was encoded: set-up's replay encodes only the rest
                bar.close()
                if results:
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
