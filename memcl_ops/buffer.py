"""The consolidation buffer: every labelled row the stream delivered that no consolidation has taken yet, under a
byte budget (`stream.buffer`). A round's rows become due when the round ends. A consolidation takes one round's
rows (`take`): during the stream the newest due round, so its cost stays that of one round however far the trainer
lags and the version it publishes has learned the freshest rows; once the stream has ended, the rounds the trainer
passed over, oldest first, one consolidation each. While the trainer lags, rows pile up: past the budget the buffer
lets rows go, each counted, by its policy:

* "class-balanced" (the default): the oldest rows of the classes that hold the most rows go first, so every class
  keeps as many rows as the budget allows for the least of them;
* "reservoir": a uniform draw over the rows held (seeded by the row's arrival index, so a replay lets the same rows
  go).

Rows are kept as plain arrays (features float32), so the buffer's state is its checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S

ROW_OVERHEAD = 8 + 4 + 4 + 8 + 8  # sample id, label, task id, arrival index and round of each row


@dataclass(frozen=True)
class BufferConfig:
    bytes: int = 64 * 2**20  # the most the buffer holds; past it, rows are let go (counted) [R]
    policy: Literal["class-balanced", "reservoir"] = "class-balanced"  # which rows go first [R]

    def __post_init__(self) -> None:
        if self.bytes < 1 or self.policy not in ("class-balanced", "reservoir"):
            raise ValueError(f"stream.buffer: bytes must be >= 1 and policy one of class-balanced, reservoir; got "
                             f"{self.bytes}, {self.policy!r}")


class ConsolidationBuffer:
    def __init__(self, feature_dim: int, config: BufferConfig = BufferConfig(), seed: int = 0):
        self.feature_dim, self.config, self.seed = feature_dim, config, seed
        self.ids = np.zeros(0, np.int64)
        self.features = np.zeros((0, feature_dim), np.float32)
        self.labels = np.zeros(0, np.int32)
        self.tasks = np.zeros(0, np.int32)
        self.arrival = np.zeros(0, np.int64)  # the row's place among the labelled rows delivered
        self.rounds = np.zeros(0, np.int64)  # the round that delivered it
        self.let_go = 0  # rows dropped for the budget before any consolidation took them

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def row_bytes(self) -> int:
        return 4 * self.feature_dim + ROW_OVERHEAD

    def nbytes(self) -> int:
        return len(self) * self.row_bytes

    def add(self, ids: np.ndarray, features: np.ndarray, labels: np.ndarray, tasks: np.ndarray, first_arrival: int,
            round_index: int) -> None:
        """Labelled rows in stream order; the first of them the `first_arrival`-th labelled row delivered."""
        n = len(ids)
        self.ids = np.concatenate([self.ids, np.asarray(ids, np.int64)])
        self.features = np.concatenate([self.features, np.asarray(features, np.float32).reshape(n, -1)])
        self.labels = np.concatenate([self.labels, np.asarray(labels, np.int32)])
        self.tasks = np.concatenate([self.tasks, np.asarray(tasks, np.int32)])
        self.arrival = np.concatenate([self.arrival, first_arrival + np.arange(n, dtype=np.int64)])
        self.rounds = np.concatenate([self.rounds, np.full(n, round_index, np.int64)])
        self._fit_budget()

    def due(self, open_round: int) -> int:
        """Rows of the rounds before `open_round` (those a consolidation may take)."""
        return int((self.rounds < open_round).sum())

    def round_rows(self, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(features, labels) of the rows `round_index` delivered that the buffer still holds; they stay."""
        rows = self.rounds == round_index
        return self.features[rows], self.labels[rows]

    def take(self, open_round: int, *, newest: bool = True) -> pa.RecordBatch | None:
        """The rows of the newest due round (`newest` False: the oldest), in arrival order, as one feature batch
        (None: none due); they leave the buffer."""
        due = self.rounds < open_round
        if not due.any():
            return None
        due &= self.rounds == (self.rounds[due].max() if newest else self.rounds[due].min())
        block = S.feature_batch(self.ids[due], self.features[due], self.labels[due], self.tasks[due])
        block = block.append_column("arrival", pa.array(self.arrival[due]))
        self._keep(~due)
        return block

    def _keep(self, keep: np.ndarray) -> None:
        self.ids, self.features, self.labels = self.ids[keep], self.features[keep], self.labels[keep]
        self.tasks, self.arrival, self.rounds = self.tasks[keep], self.arrival[keep], self.rounds[keep]

    def _fit_budget(self) -> None:
        excess = len(self) - self.config.bytes // self.row_bytes
        if excess <= 0:
            return
        drop = self._class_balanced(excess) if self.config.policy == "class-balanced" else self._uniform(excess)
        keep = np.ones(len(self), bool)
        keep[drop] = False
        self._keep(keep)
        self.let_go += excess

    def _class_balanced(self, excess: int) -> np.ndarray:
        """The oldest rows of the fullest classes: each class is cut down to a common level (the last ones cut
        one more, the largest classes first), so no class loses a row while a fuller one has more than it."""
        classes, counts = np.unique(self.labels, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        sizes = counts[order].astype(np.int64)
        keep = sizes.copy()
        for _ in range(excess):  # excess is small next to the rows held: a batch at the most
            keep[int(np.argmax(keep))] -= 1
        drop = []
        for c, held, kept in zip(classes[order], sizes, keep, strict=True):
            if kept < held:
                rows = np.flatnonzero(self.labels == c)
                drop.append(rows[np.argsort(self.arrival[rows], kind="stable")[:held - kept]])
        return np.concatenate(drop)

    def _uniform(self, excess: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(self.arrival.max())])
        return rng.choice(len(self), excess, replace=False)

    def state(self) -> dict[str, np.ndarray]:
        return {"ids": self.ids.copy(), "features": self.features.copy(), "labels": self.labels.copy(),
                "tasks": self.tasks.copy(), "arrival": self.arrival.copy(), "rounds": self.rounds.copy(),
                "let_go": np.array(self.let_go, np.int64)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.ids = np.array(state["ids"], np.int64)
        self.features = np.array(state["features"], np.float32).reshape(-1, self.feature_dim)
        self.labels = np.array(state["labels"], np.int32)
        self.tasks = np.array(state["tasks"], np.int32)
        self.arrival = np.array(state["arrival"], np.int64)
        self.rounds = np.array(state["rounds"], np.int64)
        self.let_go = int(state["let_go"])
