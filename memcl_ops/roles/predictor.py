"""Predictor role: the model a "features" run serves while it learns. Every training batch is predicted by the
newest published model, then learned at once by the method's cheap step, and its labelled rows wait in the
consolidation buffer (memcl_ops/buffer.py) until a consolidation takes them:

* a head that learns each batch exactly (one with `observe`: the analytic heads, SLDA, the nearest means, the blind
  baseline) adds the batch to its sums; its consolidation only settles what they hold (λ chosen again), in place;
* a trained head (MARS's stage 2, LwF, fine-tuning, EWC, DER++, joint) is consolidated by the trainers in the
  background; meanwhile an interim head here answers for the classes the published head has not learned yet, so a
  class seen once is predicted from its next batch on. By default (`method.interim`) it is the `analytic` head on the
  raw features (exact sums of every labelled row, solved lazily; λ and the nearest-mean blend chosen on a round's rows
  as it ends, once the rows summed have grown by half since the last choice); "nearest-mean" keeps the Euclidean
  class means instead. A row goes to it where its answer is a class the published head cannot name.

A consolidation's result is published (`install`) as a new model version; every prediction row carries the version
that made it. The predictor keeps the published head's full state, which is where the trainer's head stands between
consolidations (a checkpoint of the trainer is this copy), and the in-flight consolidation's inputs, so a restored
run starts that consolidation again and publishes the same model."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.analytic.ridge import AnalyticConfig, AnalyticLearner
from memcl_ops.arrow import schema as S
from memcl_ops.baselines.heads import StreamingLDAHead
from memcl_ops.buffer import BufferConfig, ConsolidationBuffer
from memcl_ops.clock import StageClock
from memcl_ops.learner import FeatureMemory, HeadLearner
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import build_head
from memcl_ops.prequential import NearFutureModels, PrequentialConfig, prediction_table
from memcl_ops.roles.stage2_trainer import MemoryBuilder, set_head_role
from memcl_ops.tensors import SampleIds, array_bytes, prefixed, state_part

# The interim head of a trained method: the `analytic` head on the raw features, its λ and nearest-mean blend chosen
# at a round's end on that round's rows (leave-one-out), so it keeps no reservoir of rows of its own.
INTERIM = AnalyticConfig(expansion_dim=0, lambda_selection="loo")
# its λ is chosen again once the rows summed have grown by this factor since the last choice: a choice costs a
# Cholesky per candidate, so a stream of n rows pays O(log n) of them, not one per round
CHOOSE_AGAIN = 1.5

Interim = AnalyticLearner | StreamingLDAHead  # `method.interim`: "ridge" or "nearest-mean"
Model = tuple[HeadLearner, FeatureMemory | None, Interim | None]  # what predicts: head, memory, interim head


class Predictor:
    """`memory_from_state`: how the memory the head reads is rebuilt from its state (None: the method has none);
    `near_future`: the k of near-future accuracy (memcl_ops/prequential.py); `buffer`: the consolidation buffer's
    budget and policy; `threads`: the hosting process's torch threads (None: leave them); `device`: where a head of
    sums with `to(device)` sums its statistics ("auto": the GPU Ray assigned, else the CPU), the same integers as
    on the CPU; predictions stay on the CPU."""

    def __init__(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
                 memory_from_state: MemoryBuilder | None = None, near_future: int = PrequentialConfig.near_future,
                 buffer: BufferConfig = BufferConfig(), device: str = "cpu"):
        self.reset(method, feature_dim, seed, threads, memory_from_state, near_future, buffer, device)

    def reset(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
              memory_from_state: MemoryBuilder | None = None, near_future: int = PrequentialConfig.near_future,
              buffer: BufferConfig = BufferConfig(), device: str = "cpu") -> None:
        set_head_role(self, method, feature_dim, seed, threads, memory_from_state, device)
        self.head: HeadLearner = self._new_head()
        self.online = hasattr(self.head, "observe")  # learns each batch itself: consolidation settles in place
        self.memory: FeatureMemory | None = None
        self.memory_state: dict[str, np.ndarray] = {}  # the state `memory` was built from
        self.interim = None if self.online else self._new_interim()
        self.interim_chosen_at = 0  # rows observed when the interim head last chose its λ
        self.buffer = ConsolidationBuffer(feature_dim, buffer, seed)
        self.version = 0  # consolidations published
        self.round = 0  # the open round: its rows are not due yet
        self.observed = 0  # labelled training rows learned by the per-batch step
        self.in_flight: dict[str, np.ndarray] = {}  # the running consolidation's inputs (block, memory)
        self.learned = SampleIds()  # every consolidated row's sample id, for exactly-once accounting
        self.staleness = np.zeros(2, np.int64)  # over the consolidated rows: Σ rows delivered meanwhile, the most
        self.earlier: NearFutureModels[Model] = NearFutureModels(near_future)
        self.clock = StageClock()

    def _new_head(self) -> HeadLearner:
        head = build_head(self.spec, self.method, self.feature_dim, self.seed)
        if hasattr(head, "observe") and hasattr(head, "to"):  # a head of sums: its sums where the role computes
            head.to(self.device)
        return head

    def _new_interim(self) -> Interim:
        if self.method.interim == "nearest-mean":
            return StreamingLDAHead(self.feature_dim, covariance=False)
        return AnalyticLearner(self.feature_dim, INTERIM, self.seed)

    # -- the stream: each batch predicted, then learned by the cheap step and buffered --

    def step(self, *batches: pa.RecordBatch | None) -> pa.Table:
        """Test-then-train over stream batches in order (a block kept as one batch is cut at its `stream_batch`
        column; None, a batch the gate refused whole, is skipped): each predicted by the model as it stands and by
        the model of `near_future` batches back, then learned. Returns the predictions (memcl_ops/prequential.py)."""
        with self.clock.time("step"):
            tables = []
            for batch in (part for b in batches if b is not None for part in S.stream_batches(b)):
                features = S.features_to_torch(batch)
                prediction, score = self._scored(self._model(), features)
                old = self.earlier.for_next()
                near = prediction if old is None else self._scored(old, features)[0]
                tables.append(prediction_table(batch, prediction, score, near, self.version))
                self.earlier.predicted()
                x, y, ids = S.labelled_block((batch,))
                if len(y):
                    self.earlier.changing(self._model_copy)
                    self._learn(batch, x, y, ids)
            return pa.concat_tables(tables) if tables else prediction_table(
                S.feature_batch(np.zeros(0, np.int64), np.zeros((0, self.feature_dim))), *([np.zeros(0)] * 3), 0)

    def _learn(self, batch: pa.RecordBatch, x: torch.Tensor, y: torch.Tensor, ids: np.ndarray) -> None:
        if self.online:
            self.head.observe(x, y, self.memory)
        else:
            self.interim.observe(x, y, None)
        labels = S.labels_to_numpy(batch)
        self.buffer.add(ids, x.numpy(), y.numpy(), S.task_ids_to_numpy(batch)[labels >= 0], self.observed,
                        self.round)
        self.observed += len(y)

    def end_round(self) -> None:
        """The open round ended: its rows are due for consolidation, and the interim head chooses its λ on them when
        the rows it sums have grown by `CHOOSE_AGAIN` since its last choice."""
        if self.interim is not None and self.observed >= CHOOSE_AGAIN * self.interim_chosen_at:
            features, labels = self.buffer.round_rows(self.round)
            if len(labels):
                self.interim.settle(torch.from_numpy(features), torch.from_numpy(labels.astype(np.int64)), None)
                self.interim_chosen_at = self.observed
        self.round += 1

    # -- consolidation: the due rows taken, the result published --

    def take_block(self, memory_state: dict[str, np.ndarray] | None = None, newest: bool = True
                   ) -> pa.RecordBatch | None:
        """The newest due round's rows (`newest` False: the oldest's), out of the buffer, for the consolidation
        that starts now (None: no row due), kept with `memory_state` (the memory it starts from) until it is
        published."""
        block = self.buffer.take(self.round, newest=newest)
        self.in_flight = {"running": np.array(True), **prefixed("memory", memory_state or {}),
                          **(prefixed("block", _block_arrays(block)) if block is not None else {})}
        return block

    def consolidation(self) -> tuple[pa.RecordBatch | None, dict[str, np.ndarray] | None]:
        """The in-flight consolidation's inputs: its block and the memory it started from (a restored run starts
        it again)."""
        block = state_part(self.in_flight, "block")
        return _block_from(block) if block else None, state_part(self.in_flight, "memory") or None

    def due_rows(self) -> int:
        """Rows of ended rounds that no consolidation has taken."""
        return self.buffer.due(self.round)

    def in_flight_rows(self) -> int:
        return len(state_part(self.in_flight, "block").get("ids", ()))

    def running(self) -> bool:
        """Whether a consolidation has taken its rows and is not published yet."""
        return bool(self.in_flight)

    def install(self, snapshot: dict[str, np.ndarray] | None = None,
                memory_state: dict[str, np.ndarray] | None = None) -> dict[str, float]:
        """Publish the in-flight consolidation as the next version: a trained head's `snapshot` (its state after
        the consolidation, with the memory it was trained through under "memory."), or, for a head that learns
        online, the `memory_state` it reads from now on and its settling on the block, here. Returns the head's
        report (an online head's λ choice), the rows the consolidation took and the wall-clock time of the
        install."""
        with self.clock.time("install"):
            block, _ = self.consolidation()
            report: dict[str, float] = {}
            self.earlier.changing(self._model_copy)
            if snapshot is not None:
                self.head = self._new_head()
                self.head.restore(state_part(snapshot, "head"))
                self._set_memory(state_part(snapshot, "memory") or None)
                report = {k: v.item() for k, v in state_part(snapshot, "report").items()}
            else:
                if memory_state is not None:
                    self._set_memory(memory_state)
                if block is not None:
                    x, y, _ = S.labelled_block((block,))
                    report = self.head.settle(x, y, self.memory)
                self.head.end_task(self.memory)
            self.version += 1
            if block is not None:
                ids = S.sample_ids_to_numpy(block)
                self.learned.add(ids)
                # an online head learned each row as it came: the next batch was predicted with it
                waited = np.zeros(len(ids), np.int64) if self.online else (
                    self.observed - 1 - block.column("arrival").to_numpy())
                self.staleness[0] += int(waited.sum())
                self.staleness[1] = max(int(self.staleness[1]), int(waited.max(initial=0)))
                report = {**report, "rows": len(ids)}
            self.in_flight = {}
            return {**report, "installed_at": time.time()}

    def _set_memory(self, memory_state: dict[str, np.ndarray] | None) -> None:
        self.memory_state = dict(memory_state or {})
        self.memory = self.memory_from_state(self.memory_state) if memory_state else None

    # -- what the served model answers --

    def _model(self) -> Model:
        return self.head, self.memory, self.interim

    def _model_copy(self) -> Model:
        """The model as it stands, kept apart from the learning to come: an online head's frozen copy (a trained
        head is replaced at each install, never changed) and the interim head's."""
        head = self.head.frozen() if self.online else self.head
        return head, self.memory, None if self.interim is None else self.interim.frozen()

    def _scored(self, model: Model, features: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        head, memory, interim = model
        prediction, score = head.scored(features, memory)
        if interim is None:
            return prediction, score
        guess, guess_score = interim.scored(features, None)
        new = ~np.isin(guess, head.known_classes()) & (guess >= 0)  # a class the head cannot name yet
        return np.where(new, guess, prediction), np.where(new, guess_score, score).astype(np.float32)

    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        """The class of every row of a feature batch, by the model served now."""
        return self._scored(self._model(), S.features_to_torch(batch))[0]

    def evaluate(self, batch: pa.RecordBatch | None) -> tuple[int, int]:
        """(correct, total) on a labelled feature batch (None: every row was refused)."""
        if batch is None:
            return 0, 0
        with self.clock.time("evaluate"):
            labels = S.labels_to_numpy(batch)
            return int((self.predict(batch) == labels).sum()), len(labels)

    def confusion(self, batch: pa.RecordBatch | None) -> np.ndarray:
        """(label, predicted class) of every row of a labelled feature batch, as an (n, 2) array."""
        if batch is None:
            return np.zeros((0, 2), np.int64)
        return np.stack([S.labels_to_numpy(batch), self.predict(batch)], axis=1)

    # -- accounting, memory, state --

    def learned_ids(self) -> np.ndarray:
        return self.learned.array()

    def learned_counts(self) -> tuple[int, int]:
        """(rows consolidated, distinct sample ids among them)."""
        return self.learned.added, len(self.learned)

    def counters(self) -> dict[str, Any]:
        """Rows observed, consolidated and let go, and the staleness of the consolidated ones (labelled rows
        delivered between a row's arrival and the first version that learned it)."""
        consolidated = self.learned.added
        return {"observed": self.observed, "consolidated": consolidated, "let_go": self.buffer.let_go,
                "buffered": len(self.buffer) + self.in_flight_rows(),
                "versions": self.version,
                "staleness_mean": float(self.staleness[0] / consolidated) if consolidated else None,
                "staleness_max": int(self.staleness[1])}

    def memory_bytes(self) -> dict[str, int]:
        """The served head's parts (`head.*`), the interim head and the buffer (with the block a consolidation
        holds)."""
        out = prefixed("head", self.head.memory_bytes())
        if self.interim is not None:
            out["interim"] = sum(self.interim.memory_bytes().values())
        out["buffer"] = self.buffer.nbytes() + array_bytes(state_part(self.in_flight, "block"))
        return out

    def state(self) -> dict[str, np.ndarray]:
        out = {**prefixed("head", self.head.state()), **prefixed("memory", self.memory_state),
               **prefixed("buffer", self.buffer.state()), **prefixed("in_flight", self.in_flight),
               "counters": np.array([self.version, self.round, self.observed, self.interim_chosen_at, *self.staleness],
                                   np.int64),
               **prefixed("learned", self.learned.state())}
        if self.interim is not None:
            out.update(prefixed("interim", self.interim.state()))
        out.update(prefixed("versions", self.earlier.state(self._versions_state)))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head = self._new_head()
        self.head.restore(state_part(state, "head"))
        self._set_memory(state_part(state, "memory") or None)
        self.buffer.restore(state_part(state, "buffer"))
        self.in_flight = state_part(state, "in_flight")
        self.version, self.round, self.observed, self.interim_chosen_at, *staleness = (
            int(v) for v in state["counters"])
        self.staleness = np.array(staleness, np.int64)
        self.learned.restore(state_part(state, "learned"))
        if self.interim is not None:
            self.interim = self._new_interim()
            self.interim.restore(state_part(state, "interim"))
        self.earlier.restore(state_part(state, "versions"), self._versions_from)

    def _versions_state(self, model: Model) -> dict[str, np.ndarray]:
        head, memory, interim = model
        return {**prefixed("head", head.state()), **prefixed("memory", memory.state() if memory else {}),
                **prefixed("interim", interim.state() if interim is not None else {})}

    def _versions_from(self, arrays: dict[str, np.ndarray]) -> Model:
        head = self._new_head()
        head.restore(state_part(arrays, "head"))
        memory = state_part(arrays, "memory")
        interim = None
        if self.interim is not None:
            interim = self._new_interim()
            interim.restore(state_part(arrays, "interim"))
        return head, self.memory_from_state(memory) if memory else None, interim

    def timings(self) -> dict:
        return self.clock.report()


def _block_arrays(block: pa.RecordBatch) -> dict[str, np.ndarray]:
    return {"ids": S.sample_ids_to_numpy(block).copy(), "features": np.array(S.features_to_numpy(block)),
            "labels": S.labels_to_numpy(block).copy(), "tasks": S.task_ids_to_numpy(block).copy(),
            "arrival": block.column("arrival").to_numpy().copy()}


def _block_from(arrays: dict[str, np.ndarray]) -> pa.RecordBatch:
    block = S.feature_batch(arrays["ids"], np.asarray(arrays["features"]).reshape(len(arrays["ids"]), -1),
                            arrays["labels"], arrays["tasks"])
    return block.append_column("arrival", pa.array(np.asarray(arrays["arrival"], np.int64)))
