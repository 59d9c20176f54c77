"""Stage1Trainer role: DCDA stage 1 (memory parameters only) on a consolidation's block. It keeps nothing between
consolidations: each starts from the memory state it is given, seeded by the consolidation's number, so a
consolidation started again after a fault trains the same memory."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.clock import StageClock
from memcl_ops.mars.dcda import Stage1Config, train_stage1
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.tensors import resolve_device
from memcl_ops.training import ProgressQueue, epoch_reporter, report_epochs


class Stage1Trainer:
    """`threads`: the hosting process's torch threads (None: leave them); `device`: where stage 1 trains."""

    def __init__(self, feature_dim: int, router: RouterConfig, config: Stage1Config, seed: int,
                 threads: int | None = None, device: str = "cpu"):
        # torch imports torch._dynamo (~1-2 s here) when the first optimizer is built: pay it while the host
        # starts, not inside the first run's training time.
        import torch._dynamo  # noqa: F401

        self.reset(feature_dim, router, config, seed, threads, device)

    def reset(self, feature_dim: int, router: RouterConfig, config: Stage1Config, seed: int,
              threads: int | None = None, device: str = "cpu") -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = resolve_device(device)
        self.feature_dim, self.router_config, self.config, self.seed = feature_dim, router, config, seed
        self.clock = StageClock()

    def train(self, memory_state: dict[str, np.ndarray], *batches: pa.RecordBatch | None, consolidation: int = 0,
              progress: ProgressQueue | None = None) -> dict[str, np.ndarray]:
        """Return the memory state after stage 1 on `batches` (the classifier is not involved), the `consolidation`-th
        of the run; each epoch is reported on `progress` if given."""
        with self.clock.time("stage1"), report_epochs(epoch_reporter(progress, "stage 1")):
            router = SlotRouter.from_state(self.feature_dim, self.router_config, memory_state).to(self.device)
            x, y, _ = S.labelled_block(batches)
            if len(y):
                train_stage1(router, x.to(self.device), y.to(self.device), self.config,
                             seed=self.seed * 100_003 + consolidation)
            return router.state()

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Nothing: each consolidation brings what it starts from."""

    def timings(self) -> dict:
        return self.clock.report()
