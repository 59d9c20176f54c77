"""Encoder actor: a frozen encoder turning raw Arrow batches into feature batches."""

from __future__ import annotations

import pyarrow as pa
import ray
import torch

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
        self.clock = StageClock(intervals=("encode",))  # when it encoded: did it overlap a consolidation?
        self.cache: ContentCache | None = None  # features by payload digest (`use_cache`)
        self.bound: S.FeatureBound | None = None  # the feature values the stream's method takes (`use_bound`)
        if getattr(self, "args", None) == (spec, payload, threads):
            return  # same frozen encoder: keep the loaded weights
        torch.set_num_threads(threads)
        self.encoder = build_encoder(spec, payload)
        self.args = (spec, payload, threads)

    @property
    def device(self) -> torch.device:
        """Where this replica encodes (precomputed features: the CPU)."""
        return torch.device(getattr(self.encoder, "device", "cpu"))

    def info(self) -> dict:
        return {"id": self.encoder.id, "fingerprint": self.encoder.fingerprint, "dim": self.encoder.dim,
                "payload": self.encoder.payload,
                "device": str(self.device), "node": ray.get_runtime_context().get_node_id()}

    @ray.method(num_returns=2)
    def encode(self, batch: pa.RecordBatch | None) -> tuple[pa.RecordBatch | None, pa.Table]:
        """(feature batch, dead letters): rows whose features come out non-finite (or beyond `use_bound`'s bound) are
        refused here."""
        with self.clock.time("encode"):
            if batch is None:  # every row was refused upstream
                return None, empty_dead_letters()
            return gate(encode_checked(self.encoder, batch, self.cache),
                        S.Contract(feature_dim=self.encoder.dim, feature_bound=self.bound))

    def use_bound(self, bound: S.FeatureBound) -> None:
        """Refuse encoded rows beyond `bound` too, as the source refuses given features (rows encoded in-line, which
        no source gate sees as features); filling the feature cache refuses only what is not finite."""
        self.bound = bound

    def use_cache(self, root: str) -> None:
        """Look features up by payload digest in the content cache under `root` before encoding (in-line encoding of
        rows without a dataset index: an `arrow:` folder)."""
        self.cache = ContentCache(root, self.encoder.id, self.encoder.fingerprint)

    def flush_cache(self) -> int:
        """Write the rows encoded since the last flush into the content cache; returns how many."""
        return self.cache.flush() if self.cache is not None else 0

    def take_intervals(self) -> list[tuple[float, float]]:
        """The wall-clock (start, end) of each encode call since the last take."""
        return self.clock.take_intervals()

    def timings(self) -> dict:
        return self.clock.report()
