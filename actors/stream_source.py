"""The StreamSource actor: the stream source role (memcl_ops/roles/stream_source.py) in a Ray process of its own.
Its batch methods return (rows that pass the gate, dead letters) as two objects, so the rows travel on without the
dead letters."""

from __future__ import annotations

import pyarrow as pa
import ray

from memcl.actors import hosting
from memcl_ops.roles import stream_source as role


class _TwoReturns(role.StreamSource):
    """The batch methods' (rows, dead letters) as two objects."""

    @ray.method(num_returns=2)
    def train_batch(self, visit: int | None, index: int | None) -> tuple[pa.RecordBatch | None, pa.Table]:
        return super().train_batch(visit, index)

    @ray.method(num_returns=2)
    def test_batch(self, task: int, index: int, after_visit: int) -> tuple[pa.RecordBatch | None, pa.Table]:
        return super().test_batch(task, index, after_visit)


StreamSource = hosting(role.StreamSource, ray.remote(_TwoReturns))
