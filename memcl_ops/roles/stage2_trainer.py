"""Stage2Trainer role: the method's head learner (DCDA stage 2 for MARS; the baselines' heads), its teacher
snapshot, and evaluation through the frozen memory it was trained with (a `FeatureMemory` rebuilt from the state the
memory manager hands over, by the builder the family's flow gives)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.clock import StageClock
from memcl_ops.learner import FeatureMemory
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import build_head, method_spec
from memcl_ops.training import ProgressQueue, epoch_reporter, report_epochs

MemoryBuilder = Callable[[dict[str, np.ndarray]], FeatureMemory]  # a memory's state -> the memory


class Stage2Trainer:
    """`threads`: the hosting process's torch threads (None: leave them); `memory_from_state`: how the memory the
    head reads is rebuilt from its state (None: the method has no memory)."""

    def __init__(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
                 memory_from_state: MemoryBuilder | None = None):
        # torch imports torch._dynamo (~1-2 s here) when the first optimizer is built: pay it while the actor
        # starts, not inside the first run's training time.
        import torch._dynamo  # noqa: F401

        self.reset(method, feature_dim, seed, threads, memory_from_state)

    def reset(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
              memory_from_state: MemoryBuilder | None = None) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.spec = method_spec(method.name)
        self.method = self.spec.resolve(method)
        self.feature_dim = feature_dim
        self.learner = build_head(self.spec, self.method, feature_dim, seed)
        self.memory_from_state = memory_from_state
        self.memory: FeatureMemory | None = None
        self.learned: list[np.ndarray] = []  # sample ids trained on, for exactly-once accounting
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
            self._set_memory(memory_state)
            x, y, ids = S.labelled_block(batches)
            self.learned.append(ids)
            return fit(x, y, self.memory) if len(y) else {}

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

    def learned_ids(self) -> np.ndarray:
        return np.concatenate(self.learned) if self.learned else np.zeros(0, np.int64)

    def memory_bytes(self) -> dict[str, int]:
        return self.learner.memory_bytes()

    def state(self) -> dict[str, np.ndarray]:
        out = {f"learner.{k}": v for k, v in self.learner.state().items()}
        if self.memory is not None:
            out.update({f"memory.{k}": v for k, v in self.memory.state().items()})
        out["learned"] = self.learned_ids()
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.learner.restore({k[8:]: v for k, v in state.items() if k.startswith("learner.")})
        memory = {k[7:]: v for k, v in state.items() if k.startswith("memory.")}
        self._set_memory(memory or None)
        self.learned = [np.asarray(state["learned"])]

    def timings(self) -> dict:
        return self.clock.report()
