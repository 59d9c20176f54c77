"""A Parquet cache of frozen features, so re-runs and benchmarks never re-encode.

One file per (encoder id, dataset, split, preprocessing): columns `row` (the dataset row) and
`features` (FixedSizeList<float32>). A later run that needs rows the file lacks encodes only those and
rewrites the file (atomically: temp file + rename) with the union.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memcl_ops.schema import column_matrix, matrix_to_arrow


class FeatureCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @staticmethod
    def key(encoder_id: str, dataset: str, split: str, **preprocessing: object) -> str:
        blob = json.dumps({"encoder": encoder_id, "dataset": dataset, "split": split, **preprocessing},
                          sort_keys=True)
        readable = f"{dataset}-{split}-{encoder_id}".replace("/", "_").replace(":", "_")
        return f"{readable}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}"

    def path(self, key: str) -> Path:
        return self.root / f"{key}.parquet"

    def load(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, features) stored under `key`, or None."""
        path = self.path(key)
        if not path.exists():
            return None
        table = pq.read_table(path)
        batch = table.combine_chunks().to_batches()[0] if table.num_rows else None
        if batch is None:
            return None
        return batch.column("row").to_numpy(), np.array(column_matrix(batch, "features"))

    def lookup(self, key: str, rows: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """Features for `rows` (in that order) if all are cached, and the rows still missing."""
        cached = self.load(key)
        if cached is None:
            return None, np.unique(rows)
        have_rows, feats = cached
        pos = {int(r): i for i, r in enumerate(have_rows)}
        missing = np.array(sorted({int(r) for r in rows} - pos.keys()), dtype=np.int64)
        if len(missing):
            return None, missing
        return feats[[pos[int(r)] for r in rows]], missing

    def add(self, key: str, rows: np.ndarray, features: np.ndarray) -> None:
        """Merge (rows, features) into the file under `key`, written atomically."""
        cached = self.load(key)
        if cached is not None:
            keep = ~np.isin(cached[0], rows)
            rows = np.concatenate([cached[0][keep], rows])
            features = np.concatenate([cached[1][keep], features])
        order = np.argsort(rows, kind="stable")
        table = pa.table({"row": pa.array(rows[order].astype(np.int64)),
                          "features": matrix_to_arrow(features[order])})
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.path(key).with_suffix(f".tmp{os.getpid()}")
        pq.write_table(table, tmp)
        os.replace(tmp, self.path(key))
