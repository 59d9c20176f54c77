"""Stage2Trainer role: the method's head learner (DCDA stage 2 for MARS; the baselines' heads), its teacher
snapshot, and evaluation through the frozen memory it was trained with (a `FeatureMemory` rebuilt from the state the
memory manager hands over, by the builder the family's flow gives). It also predicts every training batch before
the head learns it (`prequential`, memcl_ops/prequential.py), keeping the models of the last `near_future` batches
for near-future accuracy."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.clock import StageClock
from memcl_ops.learner import FeatureMemory, HeadLearner
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import build_head, method_spec
from memcl_ops.prequential import PrequentialConfig, prediction_table
from memcl_ops.tensors import state_part
from memcl_ops.training import ProgressQueue, epoch_reporter, report_epochs

MemoryBuilder = Callable[[dict[str, np.ndarray]], FeatureMemory]  # a memory's state -> the memory


class Stage2Trainer:
    """`threads`: the hosting process's torch threads (None: leave them); `memory_from_state`: how the memory the
    head reads is rebuilt from its state (None: the method has no memory)."""

    def __init__(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
                 memory_from_state: MemoryBuilder | None = None,
                 near_future: int = PrequentialConfig.near_future):
        # torch imports torch._dynamo (~1-2 s here) when the first optimizer is built: pay it while the actor
        # starts, not inside the first run's training time.
        import torch._dynamo  # noqa: F401

        self.reset(method, feature_dim, seed, threads, memory_from_state, near_future)

    def reset(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
              memory_from_state: MemoryBuilder | None = None,
              near_future: int = PrequentialConfig.near_future) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.spec = method_spec(method.name)
        self.method = self.spec.resolve(method)
        self.feature_dim, self.seed, self.near_future = feature_dim, seed, near_future
        self.learner = build_head(self.spec, self.method, feature_dim, seed)
        self.memory_from_state = memory_from_state
        self.memory: FeatureMemory | None = None
        self.learned: list[np.ndarray] = []  # sample ids trained on, for exactly-once accounting
        self.position = 0  # training batches predicted so far
        self.fits = 0  # rounds consolidated: the version of the model
        # earlier models, oldest first: (the first batch each predicted, its head, the memory it read)
        self.versions: list[tuple[int, HeadLearner, FeatureMemory | None]] = []
        self.current_from = 0  # the first batch the current model predicted
        self.clock = StageClock()

    def _set_memory(self, memory_state: dict[str, np.ndarray] | None) -> None:
        if memory_state is None:
            self.memory = None
            return
        self.memory = self.memory_from_state(memory_state)

    def train(self, memory_state: dict[str, np.ndarray] | None, *batches: pa.RecordBatch,
              progress: ProgressQueue | None = None) -> dict[str, float]:
        """Fit the head on `batches`; each training epoch is reported on `progress` if given."""
        return self._train(memory_state, batches, self.learner.fit, progress)

    def train_merged(self, statistics: dict[str, np.ndarray], memory_state: dict[str, np.ndarray] | None,
                     *batches: pa.RecordBatch, progress: ProgressQueue | None = None) -> dict[str, float]:
        """`train` for an analytic head whose statistics (these batches included) the encoder replicas summed and
        the MemoryManager merged: the learner re-solves from them instead of summing the block itself."""
        return self._train(memory_state, batches, partial(self.learner.fit_merged, statistics), progress)

    def _train(self, memory_state: dict[str, np.ndarray] | None, batches: tuple[pa.RecordBatch, ...],
               fit: Callable[..., dict[str, float]], progress: ProgressQueue | None) -> dict[str, float]:
        with self.clock.time("stage2"), report_epochs(epoch_reporter(progress, "stage 2")):
            self._keep_version()
            self._set_memory(memory_state)
            x, y, ids = S.labelled_block(batches)
            self.learned.append(ids)
            self.fits += 1
            return fit(x, y, self.memory) if len(y) else {}

    def prequential(self, *block: pa.RecordBatch | None, learned: tuple[bool, ...] | None = None) -> pa.Table:
        """Test-then-train: every batch of a round predicted by the model as it stands, before the round is learned
        (an online head learns each batch it takes right after predicting it), and by the model of `near_future`
        batches back. `learned`: per element of `block`, whether the learner takes it (None: all; a stream that does
        not wait skips some). A block of one kept batch (a compiled chain's) is cut at its `stream_batch` column."""
        flags = learned if learned is not None else (True,) * len(block)
        with self.clock.time("prequential"):
            tables = []
            for batch, takes in ((part, takes) for b, takes in zip(block, flags, strict=True) if b is not None
                                 for part in S.stream_batches(b)):
                features = S.features_to_torch(batch)
                prediction, score = self.learner.scored(features, self.memory)
                old, memory = self._model_for(self.position - self.near_future + 1)
                near = prediction if old is self.learner else old.predict(features, memory)
                tables.append(prediction_table(batch, prediction, score, near, self.fits, takes))
                self.position += 1
                if takes and hasattr(self.learner, "observe"):
                    self._keep_version()
                    x, y, _ = S.labelled_block((batch,))
                    self.learner.observe(x, y, self.memory)
            return pa.concat_tables(tables) if tables else prediction_table(
                S.feature_batch(np.zeros(0, np.int64), np.zeros((0, self.feature_dim))), *([np.zeros(0)] * 3), 0)

    def _model_for(self, batch: int) -> tuple[HeadLearner, FeatureMemory | None]:
        """The model (head, memory) that predicted batch `batch` (before the stream's start: the first one)."""
        if batch >= self.current_from or not self.versions:
            return self.learner, self.memory
        _, learner, memory = next((v for v in reversed(self.versions) if v[0] <= batch), self.versions[0])
        return learner, memory

    def _keep_version(self) -> None:
        """The model is about to change: keep it for the near-future predictions still to come (a model that
        predicted no batch is never asked for), and drop the models no batch to come will be scored with."""
        if self.near_future > 1 and self.current_from < self.position:
            copy = build_head(self.spec, self.method, self.feature_dim, self.seed)
            copy.restore(self.learner.state())
            self.versions.append((self.current_from, copy, self.memory))
            oldest_asked = self.position - self.near_future + 1  # the earliest batch a later one is scored as of
            while len(self.versions) > 1 and self.versions[1][0] <= oldest_asked:
                self.versions.pop(0)
        self.current_from = self.position

    def end_task(self) -> None:
        self.learner.end_task(self.memory)

    def predict(self, batch: pa.RecordBatch) -> np.ndarray:
        """The class of every row of a feature batch, through the memory the head was last trained with."""
        return self.learner.predict(S.features_to_torch(batch), self.memory)

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

    def learned_ids(self) -> np.ndarray:
        return np.concatenate(self.learned) if self.learned else np.zeros(0, np.int64)

    def memory_bytes(self) -> dict[str, int]:
        return self.learner.memory_bytes()

    def state(self) -> dict[str, np.ndarray]:
        out = {f"learner.{k}": v for k, v in self.learner.state().items()}
        if self.memory is not None:
            out.update({f"memory.{k}": v for k, v in self.memory.state().items()})
        out["learned"] = self.learned_ids()
        out["versions.position"] = np.array([self.position, self.fits, self.current_from], np.int64)
        for i, (start, learner, memory) in enumerate(self.versions):
            out[f"versions.{i}.from"] = np.array(start, np.int64)
            out.update({f"versions.{i}.learner.{k}": v for k, v in learner.state().items()})
            out.update({f"versions.{i}.memory.{k}": v for k, v in (memory.state() if memory else {}).items()})
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.learner.restore(state_part(state, "learner"))
        self._set_memory(state_part(state, "memory") or None)
        self.learned = [np.asarray(state["learned"])]
        self.position, self.fits, self.current_from = (int(v) for v in state["versions.position"])
        self.versions = []
        for i in range(sum(1 for k in state if k.startswith("versions.") and k.endswith(".from"))):
            part = state_part(state, f"versions.{i}")
            learner = build_head(self.spec, self.method, self.feature_dim, self.seed)
            learner.restore(state_part(part, "learner"))
            memory = state_part(part, "memory")
            self.versions.append((int(part["from"]), learner, self.memory_from_state(memory) if memory else None))

    def timings(self) -> dict:
        return self.clock.report()
