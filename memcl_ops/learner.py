"""The learner interfaces every method implements.

`StreamLearner` is what a stream asks of a method, in-process (no Ray): every registered method implements it
(`build_learner`) from the same memcl_ops parts the actors host, and `memcl_ops/conformance.py` checks it; the actor
pipelines that `memcl run` / `memcl lm` drive are checked end to end by tests/integration. `HeadLearner` is the
classifier role inside the "features" family (DCDA stage 2, the baselines' heads, the analytic heads), over an
optional `FeatureMemory` between the frozen encoder and the head (MARS's slot memory is the one registered)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import torch


@dataclass(frozen=True)
class Round:
    """What a learner is told when a round starts: a visit of a task, or (task-free) K batches and nothing else."""

    index: int
    task: int | None  # None in a task-free run
    classes: tuple[int, ...] | None  # the visit's classes when the stream gives boundaries


class StreamLearner(Protocol):
    """One method over one stream: `begin_round`, then `observe` every training batch of the round (Arrow
    batches of the contract in docs/architecture.md): each is predicted by the model as it stands, then learned by
    the method's per-batch step; then `consolidate`; `predict` any time after. `state` / `restore` are exact: a
    restored learner continues bit for bit like the original."""

    tags: frozenset[str]  # the method's capability tags (memcl_ops/methods.py, TAGS)

    def begin_round(self, round: Round) -> None: ...

    def observe(self, batch: pa.RecordBatch) -> None: ...

    # the round's report; a learner that predicts every training batch before learning it (test-then-train) puts
    # those predictions in it as "prequential" (an Arrow table, memcl_ops/prequential.py)
    def consolidate(self) -> dict[str, object]: ...

    def predict(self, batch: pa.RecordBatch) -> np.ndarray | list[str]: ...

    def state(self) -> dict[str, np.ndarray]: ...

    def restore(self, state: dict[str, np.ndarray]) -> None: ...

    def memory_bytes(self) -> dict[str, int]: ...


class MemoryOutput(Protocol):
    """What a feature memory gives for a batch: h̃, and LN(h) (which a second memory over the same batch reuses)."""

    h_tilde: torch.Tensor
    ln_h: torch.Tensor


class FeatureMemory(Protocol):
    """A trained map h -> h̃ between the frozen encoder and the head, with plain-array state."""

    feature_dim: int

    def __call__(self, h: torch.Tensor, ln_h: torch.Tensor | None = None) -> MemoryOutput: ...

    def state(self) -> dict[str, np.ndarray]: ...

    def at_state(self, state: dict[str, np.ndarray]) -> FeatureMemory: ...  # the same memory, as it stood then

    def anchors(self) -> tuple[torch.Tensor, torch.Tensor]: ...  # (points in h̃ space, their slot ids)

    def drift_pairs(self, previous: dict[str, np.ndarray], features: torch.Tensor
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]: ...  # (h̃ then, h̃ now) pairs since `previous`


class HeadLearner(Protocol):
    """The classifier role of a "features" method; features arrive raw and are passed through `memory` (may be
    None). `fit` learns a block. A head with `observe` learns each batch as it streams (sums of statistics, the
    blind baseline's labels) and at a consolidation only settles what it holds (`settle`); any other head is
    trained by `fit` on a consolidation's block, in the background (memcl_ops/roles/predictor.py)."""

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]: ...

    def end_task(self, memory: FeatureMemory | None) -> None: ...

    def predict(self, features: torch.Tensor, memory: FeatureMemory | None) -> np.ndarray: ...

    # (the predicted class, the head's own score of it) per row: what test-then-train predictions record
    def scored(self, features: torch.Tensor, memory: FeatureMemory | None) -> tuple[np.ndarray, np.ndarray]: ...

    # optional, for a head that learns each batch right after predicting it (the heads of sums, the blind baseline):
    # observe(features, labels, memory) takes one batch's labelled rows; settle(features, labels, memory) is the
    # consolidation of a block observed already (fit = observe, then settle); frozen() gives a copy that predicts as
    # the head does now and is never changed (what near-future accuracy scores with)

    # for a trained head: known_classes() -> the classes it can predict (the predictor's prototypes answer for the
    # others)

    # optional, for a head with work worth a GPU (the trained heads' epochs, the analytic heads' sums): to(device)
    # makes it compute there; its state and the rest stay on the CPU

    def state(self) -> dict[str, np.ndarray]: ...

    def restore(self, state: dict[str, np.ndarray]) -> None: ...

    def memory_bytes(self) -> dict[str, int]: ...

