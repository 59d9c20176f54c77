"""Encoder actor: a frozen encoder turning raw Arrow batches into feature batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import ray
import torch

from memcl_ops.analytic.ridge import AnalyticConfig, AnalyticHead
from memcl_ops.arrow import schema as S
from memcl_ops.arrow.gate import empty_dead_letters, gate
from memcl_ops.clock import StageClock
from memcl_ops.data.feature_cache import ContentCache
from memcl_ops.models.encoders import EncoderSpec, build_encoder, encode_checked


@ray.remote
class Encoder:
    """Created with `num_gpus=1` by the runner when the cluster has GPUs; torch threads are set explicitly
    because Ray starts actors with OMP_NUM_THREADS=1."""

    def __init__(self, spec: EncoderSpec, payload: str, threads: int):
        self.reset(spec, payload, threads)

    def reset(self, spec: EncoderSpec, payload: str, threads: int) -> None:
        self.clock = StageClock()
        self.partial: AnalyticHead | None = None  # this replica's share of an analytic head's statistics
        self.cache: ContentCache | None = None  # features by payload digest (`use_cache`)
        if getattr(self, "args", None) == (spec, payload, threads):
            return  # same frozen encoder: keep the loaded weights
        torch.set_num_threads(threads)
        self.encoder = build_encoder(spec, payload)
        self.args = (spec, payload, threads)

    @property
    def device(self) -> torch.device:
        """Where this replica encodes, and sums analytic statistics (precomputed features: the CPU)."""
        return torch.device(getattr(self.encoder, "device", "cpu"))

    def info(self) -> dict:
        return {"id": self.encoder.id, "fingerprint": self.encoder.fingerprint, "dim": self.encoder.dim,
                "payload": self.encoder.payload,
                "device": str(self.device), "node": ray.get_runtime_context().get_node_id()}

    @ray.method(num_returns=2)
    def encode(self, batch: pa.RecordBatch | None, accumulate: bool = False) -> tuple[pa.RecordBatch | None, pa.Table]:
        """(feature batch, dead letters): rows whose features come out non-finite are refused here.
        `accumulate`: also fold the labelled rows that pass into this replica's partial statistics (a training batch
        of an analytic head; `use_statistics` first)."""
        with self.clock.time("encode"):
            if batch is None:  # every row was refused upstream
                return None, empty_dead_letters()
            features, letters = gate(encode_checked(self.encoder, batch, self.cache),
                                     S.Contract(feature_dim=self.encoder.dim))
        if accumulate:
            if self.partial is None:
                raise RuntimeError("encode(accumulate=True) before use_statistics: no analytic head to sum into")
            with self.clock.time("accumulate"):
                x, y, _ = S.labelled_block((features,))
                if len(y):
                    self.partial.update(x, y)
        return features, letters

    def use_cache(self, root: str) -> None:
        """Look features up by payload digest in the content cache under `root` before encoding (in-line encoding of
        rows without a dataset index: an `arrow:` folder)."""
        self.cache = ContentCache(root, self.encoder.id, self.encoder.fingerprint)

    def flush_cache(self) -> int:
        """Write the rows encoded since the last flush into the content cache; returns how many."""
        return self.cache.flush() if self.cache is not None else 0

    def use_statistics(self, config: AnalyticConfig, seed: int) -> None:
        """Sum an analytic head's statistics (its feature map: `config`, `seed`) of the batches encoded with
        `accumulate`, starting from zero, on this replica's device (the same integers as on the CPU)."""
        self.partial = AnalyticHead(self.encoder.dim, config, seed)
        self.partial.to(self.device)

    def take_statistics(self) -> dict[str, np.ndarray]:
        """The partial statistics summed since the last take (then zero again), for the MemoryManager to merge."""
        if self.partial is None:
            raise RuntimeError("take_statistics before use_statistics")
        return self.partial.take_statistics().state()

    def timings(self) -> dict:
        return self.clock.report()
