"""StreamSource actor: owns a dataset, its stream plan, and (once encoded) its cached features."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import ray

from actors.clock import StageClock
from memcl_ops import schema as S
from memcl_ops.datasets import Dataset, SyntheticSpec, load_dataset, make_synthetic
from memcl_ops.streams import StreamPlan, StreamSpec, make_plan


def plan_fingerprint(plan: StreamPlan) -> str:
    h = hashlib.sha256()
    for rows in (*plan.visit_rows, *plan.test_rows):
        h.update(np.ascontiguousarray(rows, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@ray.remote
class StreamSource:
    def __init__(self, dataset: str, synthetic: SyntheticSpec, stream: StreamSpec):
        self.reset(dataset, synthetic, stream)

    def reset(self, dataset: str, synthetic: SyntheticSpec, stream: StreamSpec) -> None:
        if getattr(self, "dataset_args", None) != (dataset, synthetic):  # reuse the loaded dataset if unchanged
            self.dataset: Dataset = make_synthetic(synthetic) if dataset == "synthetic" else load_dataset(dataset)
            self.dataset_args = (dataset, synthetic)
        self.plan = make_plan(self.dataset.train_y, self.dataset.test_y, self.dataset.num_classes, stream)
        self.features: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # split -> (rows, features)
        if self.dataset.payload == "features":
            self.features = {"train": (np.arange(len(self.dataset.train_y)), self.dataset.train_x),
                             "test": (np.arange(len(self.dataset.test_y)), self.dataset.test_x)}
        self.clock = StageClock()
        self.name = self.dataset.name

    def describe(self) -> dict:
        plan, bs = self.plan, self.plan.spec.batch_size
        return {
            "dataset": self.dataset.name, "payload": self.dataset.payload, "image_shape": self.dataset.image_shape,
            "num_classes": self.dataset.num_classes, "class_names": self.dataset.class_names,
            "task_classes": plan.classes, "visits": plan.visits,
            "visit_batches": [len(plan.batches_of_visit(v)) for v in range(len(plan.visits))],
            "test_batches": [int(np.ceil(len(r) / bs)) for r in plan.test_rows],
            "num_samples": plan.num_samples, "labels": sorted(plan.label_set),
            "feature_dim": int(self.dataset.train_x.shape[1]) if self.dataset.payload == "features" else None,
            "fingerprint": plan_fingerprint(plan),
        }

    def visit_tasks(self, visit: int) -> list[int]:
        """The true tasks whose rows a visit streamed (more than one under drift)."""
        return sorted(set(self.plan.visit_tasks[visit].tolist()))

    def needed_rows(self, split: str) -> np.ndarray:
        rows = self.plan.train_rows if split == "train" else self.plan.test_rows
        return np.unique(np.concatenate(rows))

    def raw_rows(self, split: str, rows: np.ndarray) -> pa.RecordBatch:
        """Raw rows of a split (sample_id = dataset row) for encoding into the feature cache."""
        _, y = self.dataset.split(split)
        return self._raw(split, rows, rows, y[rows], None)

    def set_features(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        self.features[split] = (np.asarray(rows), np.asarray(features))

    def train_batch(self, visit: int, index: int) -> pa.RecordBatch:
        with self.clock.time("source"):
            batch = self.plan.batches_of_visit(visit)[index]
            tasks = None if self.plan.spec.task_free else batch.tasks
            return self._emit("train", batch.sample_ids, batch.rows, tasks)

    def test_batch(self, task: int, index: int) -> pa.RecordBatch:
        with self.clock.time("source"):
            bs = self.plan.spec.batch_size
            rows = self.plan.test_rows[task][index * bs:(index + 1) * bs]
            return self._emit("test", rows, rows, np.full(len(rows), task))

    def _emit(self, split: str, ids: np.ndarray, rows: np.ndarray, tasks: np.ndarray | None) -> pa.RecordBatch:
        _, y = self.dataset.split(split)
        if split in self.features:
            have, feats = self.features[split]
            pos = np.searchsorted(have, rows)
            return S.feature_batch(ids, feats[pos], y[rows], tasks, stream=self.name)
        return self._raw(split, ids, rows, y[rows], tasks)

    def _raw(self, split: str, ids: np.ndarray, rows: np.ndarray, labels: np.ndarray,
             tasks: np.ndarray | None) -> pa.RecordBatch:
        x, _ = self.dataset.split(split)
        return S.raw_batch(ids, self.dataset.payload, x[rows], labels, tasks,
                           image_shape=self.dataset.image_shape, stream=self.name)

    def state(self) -> dict[str, np.ndarray]:
        return {"fingerprint": np.array(plan_fingerprint(self.plan))}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        if str(state["fingerprint"]) != plan_fingerprint(self.plan):
            raise ValueError("the checkpoint was written for a different stream plan (dataset, seed or split changed)")

    def timings(self) -> dict:
        return self.clock.report()
