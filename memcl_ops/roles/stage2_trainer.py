"""Stage2Trainer role: consolidates a trained head (DCDA stage 2 for MARS; the trained baselines' heads) in the
background while the predictor (memcl_ops/roles/predictor.py) serves the last published model. A consolidation
trains the head on its block through the memory it is given, takes its task-end snapshot, and returns the head's
whole state: the snapshot the predictor publishes. Between consolidations the trainer's head is that snapshot, so
the predictor's copy is the trainer's checkpoint (`restore` takes the predictor's state)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.clock import StageClock
from memcl_ops.learner import FeatureMemory
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import build_head, method_spec
from memcl_ops.tensors import prefixed, resolve_device, state_part
from memcl_ops.training import ProgressQueue, epoch_reporter, report_epochs

MemoryBuilder = Callable[[dict[str, np.ndarray]], FeatureMemory]  # a memory's state -> the memory


def set_head_role(role, method: MethodConfig, feature_dim: int, seed: int, threads: int | None,
                  memory_from_state: MemoryBuilder | None, device: str) -> None:
    """What a role that builds the method's head holds of its construction: the method (resolved), the feature size,
    the seed, the device it computes on and how it rebuilds a memory; `threads` sets torch's threads."""
    if threads is not None:
        torch.set_num_threads(threads)
    role.spec = method_spec(method.name)
    role.method = role.spec.resolve(method)
    role.feature_dim, role.seed = feature_dim, seed
    role.device = resolve_device(device)
    role.memory_from_state = memory_from_state


class Stage2Trainer:
    """`threads`: the hosting process's torch threads (None: leave them); `memory_from_state`: how the memory the
    head reads is rebuilt from its state (None: the method has no memory); `device`: where the head's epochs run
    ("auto": the GPU Ray assigned, else the CPU); its state and predictions stay on the CPU."""

    def __init__(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
                 memory_from_state: MemoryBuilder | None = None, device: str = "cpu"):
        # torch imports torch._dynamo (~1-2 s here) when the first optimizer is built: pay it while the actor
        # starts, not inside the first run's training time.
        import torch._dynamo  # noqa: F401

        self.reset(method, feature_dim, seed, threads, memory_from_state, device)

    def reset(self, method: MethodConfig, feature_dim: int, seed: int, threads: int | None = None,
              memory_from_state: MemoryBuilder | None = None, device: str = "cpu") -> None:
        set_head_role(self, method, feature_dim, seed, threads, memory_from_state, device)
        self.learner = self._new_head()
        self.clock = StageClock()

    def _new_head(self):
        head = build_head(self.spec, self.method, self.feature_dim, self.seed)
        if hasattr(head, "to"):
            head.to(self.device)
        return head

    def consolidate(self, memory_state: dict[str, np.ndarray] | None, *batches: pa.RecordBatch | None,
                    progress: ProgressQueue | None = None) -> dict[str, np.ndarray]:
        """Train the head on `batches` through the memory at `memory_state` (None: no memory), then its task-end
        snapshot; returns the head's state and the memory state ("head.", "memory.") to publish, and the epochs'
        losses (reported on `progress` if given) under "report."."""
        with self.clock.time("stage2"), report_epochs(epoch_reporter(progress, "stage 2")):
            memory = self.memory_from_state(memory_state) if memory_state else None
            x, y, _ = S.labelled_block(batches)
            report = self.learner.fit(x, y, memory) if len(y) else {}
            self.learner.end_task(memory)
            return {**prefixed("head", self.learner.state()), **prefixed("memory", memory_state or {}),
                    **{f"report.{k}": np.array(v) for k, v in report.items()}}

    def state(self) -> dict[str, np.ndarray]:
        """Nothing of its own: the predictor holds the snapshot this trainer's head stands at."""
        return {}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """The head at the predictor's published snapshot (`state`: the predictor's state)."""
        self.learner = self._new_head()
        head = state_part(state, "head")
        if head:
            self.learner.restore(head)

    def timings(self) -> dict:
        return self.clock.report()
