"""A Parquet cache of frozen features, so re-runs and benchmarks never re-encode.

One file per (encoder id, encoder fingerprint, dataset, split): columns `row` (the dataset row) and `features`
(FixedSizeList<float32>). The fingerprint digests the encoder's weights and preprocessing
(memcl_ops/models/encoders.py), so new weights under the same encoder name never read the old features. A later
run that needs rows the file lacks encodes only those and rewrites the file (atomically, memcl_ops/files.py) with
the union.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memcl_ops import files
from memcl_ops.arrow.schema import column_matrix, matrix_to_arrow


class FeatureCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @staticmethod
    def key(encoder_id: str, fingerprint: str, dataset: str, split: str) -> str:
        blob = json.dumps({"encoder": encoder_id, "fingerprint": fingerprint, "dataset": dataset, "split": split},
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
        files.write_parquet(table, self.path(key))


class ContentCache:
    """Features of raw rows keyed by a digest of their payload, for streams whose rows have no fixed dataset index
    (an `arrow:` folder): a re-run, and every evaluation after the first, encodes only rows it has not seen.

    One folder per encoder (its id and fingerprint) under the cache root; each writer (an encoder replica) adds its
    new rows as a file of its own (`flush`), so replicas never write the same file, and a reader merges them all.
    """

    def __init__(self, root: str | Path, encoder_id: str, fingerprint: str):
        self.folder = Path(root) / f"content-{encoder_id}-{fingerprint}".replace("/", "_").replace(":", "_")
        self.known: dict[bytes, np.ndarray] = {}
        for path in sorted(self.folder.glob("*.parquet")):
            table = pq.read_table(path)
            if table.num_rows:
                batch = table.combine_chunks().to_batches()[0]
                self.known.update(zip(batch.column("digest").to_pylist(), column_matrix(batch, "features")))
        self.added: list[bytes] = []

    @staticmethod
    def digests(batch: pa.RecordBatch, payload: str) -> list[bytes]:
        """One digest per row of the payload column's value (images: their pixels and shape)."""
        shape = (batch.schema.metadata or {}).get(b"image_shape", b"")
        return [hashlib.sha1(shape + repr(v).encode()).digest() for v in batch.column(payload).to_pylist()]

    def encode(self, digests: list[bytes], encode_rows) -> np.ndarray:
        """Features of every row: the known ones looked up, the others from `encode_rows(positions)` and kept."""
        missing = [i for i, d in enumerate(digests) if d not in self.known]
        if missing:
            for i, feats in zip(missing, encode_rows(np.array(missing, dtype=np.int64))):
                if digests[i] not in self.known:
                    self.added.append(digests[i])
                self.known[digests[i]] = np.asarray(feats, dtype=np.float32)
        return np.stack([self.known[d] for d in digests]) if digests else np.zeros((0, 0), np.float32)

    def flush(self) -> int:
        """Write the rows added since the last flush to a new file; returns how many."""
        if not self.added:
            return 0
        table = pa.table({"digest": pa.array(self.added, pa.binary()),
                          "features": matrix_to_arrow(np.stack([self.known[d] for d in self.added]))})
        self.folder.mkdir(parents=True, exist_ok=True)
        files.write_parquet(table, self.folder / f"{os.getpid()}-{os.urandom(6).hex()}.parquet")
        added, self.added = len(self.added), []
        return added
