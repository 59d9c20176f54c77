"""The stream source role: owns one stream (a dataset plan, a user's Arrow folder or a generated drift stream) and
gates every batch it emits: rows that break the contract leave as dead letters, never silently."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.arrow.gate import empty_dead_letters, gate, with_origin
from memcl_ops.clock import StageClock
from memcl_ops.data.datasets import DatasetUnavailable
from memcl_ops.data.sources import SourceSpec, StreamInfo, build_stream
from memcl_ops.data.streams import StreamSpec
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import feature_bound


class StreamSource:
    """`unlabelled`: training rows without a label pass the gate (a learner that predicts them and learns only the
    labelled rows: the "features" family); otherwise they are refused as `missing_label`. Test rows always need
    one. `method`, `seed`: the method the stream feeds, whose bound on feature values the gate enforces
    (`memcl_ops.methods.feature_bound`; None: every method's)."""

    def __init__(self, source: SourceSpec, stream: StreamSpec, max_batch_rows: int | None, unlabelled: bool = False,
                 method: MethodConfig | None = None, seed: int = 0):
        # Data that cannot be read is the user's error: kept and raised by describe(), the runner's first call,
        # because a method's exception reaches the driver as itself, a constructor's only as a log and a text.
        self.unreadable: Exception | None = None
        try:
            self.reset(source, stream, max_batch_rows, unlabelled, method, seed)
        except (ValueError, OSError, DatasetUnavailable) as err:
            self.unreadable = err

    def reset(self, source: SourceSpec, stream: StreamSpec, max_batch_rows: int | None,
              unlabelled: bool = False, method: MethodConfig | None = None, seed: int = 0) -> None:
        self.unlabelled = unlabelled
        self.method, self.seed = method, seed
        self.bounds: dict[int, S.FeatureBound] = {}  # by feature dim, computed once
        self.unreadable = None
        self.follows = stream.follow
        # keep a loaded dataset when nothing changed (a followed folder changes: it is taken as it is now)
        if getattr(self, "args", None) != (source, stream) or self.follows:
            self.args = None
            self.stream = build_stream(source, stream)
            self.args = (source, stream)
        self.info: StreamInfo = self.stream.describe()
        if self.info.cacheable:  # a kept dataset may still hold the features an earlier run handed it
            self.stream.drop_cached_features()
        self.max_batch_rows = max_batch_rows
        self.clock = StageClock()

    def describe(self) -> StreamInfo:
        if self.unreadable is not None:
            raise self.unreadable
        return self.info

    def contract(self, split: str = "train") -> S.Contract:
        """What the learner accepts: the stream's labels, and its feature dim or raw payload."""
        dim = self.info.feature_dim  # raw streams get it once the feature cache filled them
        return S.Contract(feature_dim=dim, payload=None if dim is not None else self.info.payload,
                          known_labels=frozenset(self.info.labels) if self.info.labels is not None else None,
                          max_rows=self.max_batch_rows, require_labels=split == "test" or not self.unlabelled,
                          feature_bound=self.feature_bound(dim) if dim is not None else None)

    def feature_bound(self, dim: int) -> S.FeatureBound:
        """The feature values the method takes at width `dim` (every method's bound without a method)."""
        if dim not in self.bounds:
            self.bounds[dim] = (S.FeatureBound() if self.method is None
                                else feature_bound(self.method, dim, self.seed))
        return self.bounds[dim]

    def needed_rows(self, split: str) -> np.ndarray:
        return self.stream.needed_rows(split)

    def raw_rows(self, split: str, rows: np.ndarray) -> pa.RecordBatch:
        return self.stream.raw_rows(split, rows)

    def set_features(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        self.stream.set_features(split, rows, features)
        self.info.feature_dim = int(features.shape[1])

    def largest_batch_bytes(self) -> int:
        """The Arrow bytes of the stream's largest training batch as emitted (raw rows, or features once cached):
        what sizes the compiled chain's channels (pipeline/compiled_chain.py). Reads every batch once."""
        return max((self.stream.train_batch(v, i).nbytes for v, n in enumerate(self.info.visit_batches)
                    for i in range(n)), default=0)

    def train_batch(self, visit: int | None, index: int | None) -> tuple[pa.RecordBatch | None, pa.Table]:
        """(rows that pass the gate, dead letters) of one training batch; (None, none) for `visit` None, the empty
        places of the compiled chain's last step of a round (pipeline/compiled_chain.py)."""
        if visit is None:
            return None, empty_dead_letters()
        with self.clock.time("source"):
            return self._gated(self.stream.train_batch(visit, index), "train", visit, index)

    def train_rows(self, visit: int, index: int) -> int:
        """How many rows of one training batch pass the gate (NSR's probe counts rows, not batches)."""
        good, _ = self.train_batch(visit, index)
        return 0 if good is None else good.num_rows

    def test_batch(self, task: int, index: int, after_visit: int) -> tuple[pa.RecordBatch | None, pa.Table]:
        with self.clock.time("source"):
            return self._gated(self.stream.test_batch(task, index, after_visit), "test", task, index)

    def _gated(self, batch: pa.RecordBatch, split: str, key: int, index: int) -> tuple[pa.RecordBatch | None, pa.Table]:
        good, dead = gate(batch, self.contract(split), self.stream.repeated(split, key, index))
        return good, with_origin(dead, split, *self.stream.origin(split, key, index)) if dead.num_rows else dead

    def visit_tasks(self, visit: int) -> list[int]:
        return self.stream.visit_tasks(visit)

    def follow(self, known: str) -> StreamInfo | None:
        """A followed folder's train files that landed since, taken in name order: the stream's info, or None while it
        is still the one whose fingerprint is `known` (the driver's)."""
        new = self.stream.new_files()
        if new:
            self.stream.take(new)
            self.info = self.stream.describe()
        return None if self.info.fingerprint == known else self.info

    def hold(self, names: list[str]) -> None:
        """Hold at least these train files of a followed folder, in this order (the stream the driver plans over)."""
        self.stream.hold(names)
        self.info = self.stream.describe()

    def state(self) -> dict[str, np.ndarray]:
        """The stream's fingerprint and, when it follows a folder, the train files it has taken, in order: the offsets
        a resume continues from, so that no file is streamed twice or skipped."""
        state = {"fingerprint": np.array(self.info.fingerprint)}
        if self.follows:
            state["train_files"] = np.array(json.dumps(self.info.extra["train_files"]))
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        fingerprint = self.info.fingerprint
        if self.follows:
            taken = json.loads(str(state["train_files"]))
            self.hold(taken)
            fingerprint = self.stream.fingerprint(len(taken))
        if str(state["fingerprint"]) != fingerprint:
            raise ValueError("the checkpoint was written for a different stream (dataset, seed or split changed)")

    def timings(self) -> dict:
        return self.clock.report()
