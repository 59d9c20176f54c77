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
from memcl_ops.prequential import NearFutureModels, PrequentialConfig, prediction_table
from memcl_ops.tensors import prefixed, resolve_device, state_part
from memcl_ops.training import ProgressQueue, epoch_reporter, report_epochs

MemoryBuilder = Callable[[dict[str, np.ndarray]], FeatureMemory]  # a memory's state -> the memory


class Stage2Trainer:
    """`threads`: the hosting process's torch threads (None: leave them); `memory_from_state`: how the memory the
    head reads is rebuilt from its state (None: the method has no memory); `device`: where a head with `to(device)`
    computes ("auto": the GPU Ray assigned, else the CPU): the trained heads' epochs, the analytic heads' feature
    expansion and statistics; the rest (the trained heads' predictions, the closed-form solves) is the CPU's."""

    def __init__(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
                 memory_from_state: MemoryBuilder | None = None,
                 near_future: int = PrequentialConfig.near_future, device: str = "cpu"):
        # torch imports torch._dynamo (~1-2 s here) when the first optimizer is built: pay it while the actor
        # starts, not inside the first run's training time.
        import torch._dynamo  # noqa: F401

        self.reset(method, feature_dim, seed, threads, memory_from_state, near_future, device)

    def reset(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
              memory_from_state: MemoryBuilder | None = None,
              near_future: int = PrequentialConfig.near_future, device: str = "cpu") -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.spec = method_spec(method.name)
        self.method = self.spec.resolve(method)
        self.feature_dim, self.seed = feature_dim, seed
        self.device = resolve_device(device)
        self.learner = build_head(self.spec, self.method, feature_dim, seed)
        if hasattr(self.learner, "to"):
            self.learner.to(self.device)
        self.memory_from_state = memory_from_state
        self.memory: FeatureMemory | None = None
        self.learned: list[np.ndarray] = []  # sample ids trained on, for exactly-once accounting
        self.fits = 0  # rounds consolidated: the version of the model
        # earlier models (a head, the memory it read) for the near-future predictions
        self.earlier: NearFutureModels[tuple[HeadLearner, FeatureMemory | None]] = NearFutureModels(near_future)
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
            self.earlier.changing(self._model_copy)
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
                old = self.earlier.for_next()
                near = prediction if old is None else old[0].predict(features, old[1])
                tables.append(prediction_table(batch, prediction, score, near, self.fits, takes))
                self.earlier.predicted()
                if takes and hasattr(self.learner, "observe"):
                    self.earlier.changing(self._model_copy)
                    x, y, _ = S.labelled_block((batch,))
                    self.learner.observe(x, y, self.memory)
            return pa.concat_tables(tables) if tables else prediction_table(
                S.feature_batch(np.zeros(0, np.int64), np.zeros((0, self.feature_dim))), *([np.zeros(0)] * 3), 0)

    def _model_copy(self) -> tuple[HeadLearner, FeatureMemory | None]:
        """The model as it stands, kept apart from the learning to come (the memory is replaced, never changed)."""
        return self._head_from(self.learner.state()), self.memory

    def _head_from(self, state: dict[str, np.ndarray]) -> HeadLearner:
        head = build_head(self.spec, self.method, self.feature_dim, self.seed)
        head.restore(state)
        return head

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
        out["fits"] = np.array(self.fits, np.int64)
        out.update(prefixed("versions", self.earlier.state(lambda model: {
            **prefixed("learner", model[0].state()), **prefixed("memory", model[1].state() if model[1] else {})})))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.learner.restore(state_part(state, "learner"))
        self._set_memory(state_part(state, "memory") or None)
        self.learned = [np.asarray(state["learned"])]
        self.fits = int(state["fits"])
        self.earlier.restore(state_part(state, "versions"), self._model_from)

    def _model_from(self, arrays: dict[str, np.ndarray]) -> tuple[HeadLearner, FeatureMemory | None]:
        memory = state_part(arrays, "memory")
        return self._head_from(state_part(arrays, "learner")), self.memory_from_state(memory) if memory else None

    def timings(self) -> dict:
        return self.clock.report()
