"""Encoder actor: a frozen encoder turning raw Arrow batches into feature batches."""

from __future__ import annotations

import pyarrow as pa
import ray
import torch

from actors.clock import StageClock
from memcl_ops import schema as S
from memcl_ops.encoders import EncoderSpec, build_encoder, encode_checked
from memcl_ops.gate import empty_dead_letters, gate


@ray.remote
class Encoder:
    """Created with `num_gpus=1` by the runner when the cluster has GPUs; torch threads are set explicitly
    because Ray starts actors with OMP_NUM_THREADS=1."""

    def __init__(self, spec: EncoderSpec, payload: str, threads: int):
        self.reset(spec, payload, threads)

    def reset(self, spec: EncoderSpec, payload: str, threads: int) -> None:
        self.clock = StageClock()
        if getattr(self, "args", None) == (spec, payload, threads):
            return  # same frozen encoder: keep the loaded weights
        torch.set_num_threads(threads)
        self.encoder = build_encoder(spec, payload)
        self.args = (spec, payload, threads)

    def info(self) -> dict:
        return {"id": self.encoder.id, "dim": self.encoder.dim, "payload": self.encoder.payload,
                "device": str(getattr(self.encoder, "device", "cpu")), "node": ray.get_runtime_context().get_node_id()}

    @ray.method(num_returns=2)
    def encode(self, batch: pa.RecordBatch | None) -> tuple[pa.RecordBatch | None, pa.Table]:
        """(feature batch, dead letters): rows whose features come out non-finite are refused here."""
        with self.clock.time("encode"):
            if batch is None:  # every row was refused upstream
                return None, empty_dead_letters()
            return gate(encode_checked(self.encoder, batch), S.Contract(feature_dim=self.encoder.dim))

    def timings(self) -> dict:
        return self.clock.report()
