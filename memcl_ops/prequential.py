"""Test-then-train (prequential) evaluation: every training batch is predicted by the model as it stands, then
learned (river's `progressive_val_score`, MOA's prequential evaluation). The predictor predicts each batch before the
per-batch step learns it (memcl_ops/roles/predictor.py), so the prediction of every labelled row is made before that
row is learned; rows without a label are predicted and never learned.

Definitions (docs/methods.md, "Prequential accuracy"):
* **prequential accuracy**: correct / labelled rows predicted, over the whole stream, per task and over the last
  `window` labelled rows;
* **near-future accuracy** (Al Kader Hammoud, Prabhu et al., ICCV 2023): batch t is scored with the model that had
  learned only the batches before t − k + 1, k = `near_future` (k = 1 is prequential accuracy). A learner that
  exploits the labels of the last few batches (the blind baseline) scores high on prequential accuracy of a stream
  whose labels come in runs, and at chance here once k exceeds the runs.

`PREDICTIONS` is the table of one round's predictions; `Tally` folds them into the run's figures (plain JSON, kept
in the run state that checkpoints carry)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.tensors import state_part

Model = TypeVar("Model")

PREDICTIONS = pa.schema([
    pa.field(S.SAMPLE_ID, pa.int64(), nullable=False),
    pa.field(S.TASK_ID, pa.int32(), nullable=True),
    pa.field(S.LABEL, pa.int32(), nullable=True),  # null: an unlabelled row, predicted and not learned
    pa.field("prediction", pa.int64(), nullable=False),  # -1: the model knew no class yet
    pa.field("score", pa.float32(), nullable=False),  # the head's own score of its prediction (not a probability)
    pa.field("near_future", pa.int64(), nullable=False),  # the prediction of the model k batches back
    pa.field("model_version", pa.int32(), nullable=False),  # consolidations published into the model that predicted
])


@dataclass(frozen=True)
class PrequentialConfig:
    """How test-then-train results are summarised (`runtime.prequential`)."""

    window: int = 1000  # labelled rows of the sliding-window accuracy
    near_future: int = 5  # k: batch t is scored by the model that had learned the batches before t - k + 1

    def __post_init__(self) -> None:
        if self.window < 1 or self.near_future < 1:
            raise ValueError(f"prequential window {self.window} and near_future {self.near_future} must be >= 1")


def prediction_table(batch: pa.RecordBatch, prediction: np.ndarray, score: np.ndarray, near_future: np.ndarray,
                     version: int) -> pa.Table:
    """One batch's predictions, as `PREDICTIONS` (a label of -1, what the block of a compiled chain keeps for a null
    label, is written null)."""
    labels = S.labels_to_numpy(batch)
    tasks = S.task_ids_to_numpy(batch)
    return pa.Table.from_arrays(
        [pa.array(S.sample_ids_to_numpy(batch), pa.int64()),
         pa.array(tasks, pa.int32(), mask=tasks < 0), pa.array(labels, pa.int32(), mask=labels < 0),
         pa.array(np.asarray(prediction, np.int64)), pa.array(np.asarray(score, np.float32)),
         pa.array(np.asarray(near_future, np.int64)), pa.array(np.full(len(labels), version, np.int32))],
        schema=PREDICTIONS)


class NearFutureModels(Generic[Model]):
    """The earlier models a learner's near-future predictions are made with: batch t is scored, beside the model as it
    stands, by the one that had learned only the batches before t − k + 1 (k = `near_future`). The learner counts
    each batch it predicts (`predicted`), asks for the model of the batch at hand (`for_next`) and says when its model
    is about to change (`changing`): that one is kept while a batch still to come will be scored with it (a model that
    predicted no batch is never asked for). With k = 1 nothing is kept."""

    def __init__(self, near_future: int):
        self.near_future = near_future
        self.position = 0  # training batches predicted so far
        self.current_from = 0  # the first batch the current model predicted
        self.kept: list[tuple[int, Model]] = []  # earlier models, oldest first: (the first batch each predicted, it)

    def for_next(self) -> Model | None:
        """The model the next batch is scored as of (None: the current one; before the first kept, the first)."""
        batch = self.position - self.near_future + 1
        if batch >= self.current_from or not self.kept:
            return None
        return next((m for start, m in reversed(self.kept) if start <= batch), self.kept[0][1])

    def predicted(self) -> None:
        self.position += 1

    def changing(self, current: Callable[[], Model]) -> None:
        """The model is about to change: keep `current()` (its copy) for the near-future predictions still to come,
        and drop the models no batch to come will be scored with."""
        if self.near_future > 1 and self.current_from < self.position:
            self.kept.append((self.current_from, current()))
            oldest_asked = self.position - self.near_future + 1
            while len(self.kept) > 1 and self.kept[1][0] <= oldest_asked:
                self.kept.pop(0)
        self.current_from = self.position

    def state(self, model_state: Callable[[Model], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The bookkeeping and each kept model (`model_state` of it), as flat arrays for a checkpoint."""
        out = {"position": np.array([self.position, self.current_from], np.int64)}
        for i, (start, model) in enumerate(self.kept):
            out[f"{i}.from"] = np.array(start, np.int64)
            out.update({f"{i}.{k}": v for k, v in model_state(model).items()})
        return out

    def restore(self, state: dict[str, np.ndarray], model_from: Callable[[dict[str, np.ndarray]], Model]) -> None:
        """The inverse of `state`, each kept model rebuilt by `model_from` of its arrays."""
        self.position, self.current_from = (int(v) for v in state["position"])
        self.kept = []
        while self.near_future > 1 and f"{len(self.kept)}.from" in state:  # with k = 1 none is ever asked for
            i = len(self.kept)
            self.kept.append((int(state[f"{i}.from"]), model_from(state_part(state, str(i)))))


def labelled(table: pa.Table) -> pa.Table:
    return table.filter(table.column(S.LABEL).is_valid())


def unlabelled(table: pa.Table) -> pa.Table:
    return table.filter(table.column(S.LABEL).is_null())


@dataclass
class Tally:
    """The running prequential figures of a run (its labelled rows, in stream order)."""

    rows: int = 0
    correct: int = 0
    near_future_correct: int = 0
    per_task: dict[str, list[int]] = field(default_factory=dict)  # task -> [correct, rows]
    recent: list[int] = field(default_factory=list)  # the last `window` rows: 1 right, 0 wrong
    curve: list[dict] = field(default_factory=list)  # after each round: rows so far, overall and window accuracy
    predicted_unlabelled: int = 0
    late_labels: int = 0  # unlabelled rows whose label came later in the stream
    late_correct: int = 0  # of those, the ones the prediction made while they were unlabelled got right

    def settle(self, earlier: pa.Table, labels: dict[int, int]) -> None:
        """Score the predictions made while rows were unlabelled (`earlier`, from the predictions sink) against the
        labels that came for them."""
        self.late_labels += earlier.num_rows
        self.late_correct += sum(int(p == labels[i]) for i, p in zip(earlier.column(S.SAMPLE_ID).to_pylist(),
                                                                       earlier.column("prediction").to_pylist(),
                                                                       strict=True))

    def add(self, table: pa.Table | None, window: int) -> None:
        """Fold one round's predictions in (call once per committed round, even with None: the curve gets a point)."""
        if table is not None and table.num_rows:
            self.predicted_unlabelled += unlabelled(table).num_rows
            rows = labelled(table)
            label = rows.column(S.LABEL).to_numpy().astype(np.int64)
            right = rows.column("prediction").to_numpy() == label
            self.rows += len(label)
            self.correct += int(right.sum())
            self.near_future_correct += int((rows.column("near_future").to_numpy() == label).sum())
            tasks = rows.column(S.TASK_ID).to_numpy(zero_copy_only=False)
            for task in np.unique(tasks[~np.isnan(tasks.astype(float))]) if len(tasks) else ():
                mine = tasks == task
                entry = self.per_task.setdefault(str(int(task)), [0, 0])
                entry[0] += int(right[mine].sum())
                entry[1] += int(mine.sum())
            self.recent = list(deque(self.recent + right.astype(int).tolist(), maxlen=window))
        self.curve.append({"rows": self.rows, "accuracy": self.accuracy, "window": self.window_accuracy})

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.rows if self.rows else None

    @property
    def window_accuracy(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None

    def report(self, config: PrequentialConfig) -> dict:
        """What metrics.json's `prequential` holds (accuracies as fractions; None before any labelled row)."""
        return {"accuracy": self.accuracy, "window_accuracy": self.window_accuracy, "window": config.window,
                "near_future_accuracy": self.near_future_correct / self.rows if self.rows else None,
                "near_future": config.near_future, "rows": self.rows,
                "per_task": {t: c / n for t, (c, n) in sorted(self.per_task.items(), key=lambda kv: int(kv[0]))},
                "predicted_unlabelled": self.predicted_unlabelled,
                "late_labels": self.late_labels,
                "late_label_accuracy": self.late_correct / self.late_labels if self.late_labels else None,
                "curve": self.curve}
