"""Encoder actor: a frozen encoder turning raw Arrow batches into feature batches."""

from __future__ import annotations

import pyarrow as pa
import ray
import torch

from actors.clock import StageClock
from memcl_ops.encoders import EncoderSpec, build_encoder, encode_checked


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

    def encode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        with self.clock.time("encode"):
            return encode_checked(self.encoder, batch)

    def timings(self) -> dict:
        return self.clock.report()
