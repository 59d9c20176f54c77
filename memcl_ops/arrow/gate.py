"""The boundary gate: every batch entering the learner passes here first.

`gate(batch, contract)` returns the rows that satisfy the contract and a dead-letter table for the rest:
one row per refused input row with its `sample_id` (null if the batch had none), its position in the
batch, the reason, the column, the message, and the row itself serialised as Arrow IPC bytes (so it can
be inspected with `pyarrow.ipc.open_stream(row)` whatever its schema was). Nothing is dropped silently:
every input row is either in the returned batch or in the dead-letter table.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S

DEAD_LETTER_SCHEMA = pa.schema([
    pa.field(S.SAMPLE_ID, pa.int64(), nullable=True),
    pa.field("position", pa.int64()),  # in the batch; once the source names the origin, in the origin
    pa.field("reason", pa.string()),
    pa.field("column", pa.string(), nullable=True),
    pa.field("message", pa.string()),
    pa.field("row", pa.binary()),
    pa.field("split", pa.string(), nullable=True),  # "train" or "test", set by the source (null: refused later)
    pa.field("origin", pa.string(), nullable=True),  # the file (or stream) the row came from, set by the source
])


def empty_dead_letters() -> pa.Table:
    return DEAD_LETTER_SCHEMA.empty_table()


def _row_bytes(batch: pa.RecordBatch, position: int) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch.slice(position, 1))
    return sink.getvalue()


def _sample_ids(batch: pa.RecordBatch, rows: np.ndarray) -> list[int | None]:
    ids = S.sample_ids_or_none(batch)
    return [ids[int(r)] for r in rows]


def dead_letters(batch: pa.RecordBatch, refusals: list[S.Refusal], ids: list[int | None] | None = None) -> pa.Table:
    """The dead-letter table of `refusals` (rows of `batch`); `ids`: each row's sample_id where `batch`'s own column
    does not say it as int64 (one a gate cast)."""
    ids = S.sample_ids_or_none(batch) if ids is None else ids
    records: dict[str, list] = {f.name: [] for f in DEAD_LETTER_SCHEMA}
    for refusal in refusals:
        rows = refusal.rows
        records[S.SAMPLE_ID] += [ids[int(r)] for r in rows]
        records["position"] += [int(r) for r in rows]
        records["reason"] += [refusal.error.reason] * len(rows)
        records["column"] += [refusal.error.column] * len(rows)
        records["message"] += [str(refusal.error)] * len(rows)
        records["row"] += [_row_bytes(batch, int(r)) for r in rows]
        records["split"] += [None] * len(rows)
        records["origin"] += [None] * len(rows)
    return pa.table(records, schema=DEAD_LETTER_SCHEMA)


def with_origin(dead: pa.Table, split: str, origin: str, first_row: int) -> pa.Table:
    """`dead` with its rows' split and origin filled in, positions counted from the origin's start (`first_row`:
    the batch's first row in it), so each dead letter says which file and row it was."""
    n = dead.num_rows
    return (dead.set_column(dead.schema.get_field_index("position"), DEAD_LETTER_SCHEMA.field("position"),
                            pa.array(np.asarray(dead.column("position"), np.int64) + first_row, pa.int64()))
            .set_column(dead.schema.get_field_index("split"), DEAD_LETTER_SCHEMA.field("split"),
                        pa.array([split] * n, pa.string()))
            .set_column(dead.schema.get_field_index("origin"), DEAD_LETTER_SCHEMA.field("origin"),
                        pa.array([origin] * n, pa.string())))


def _payload_refusals(batch: pa.RecordBatch, payload: str) -> list[S.Refusal]:
    """Rows whose raw payload cannot be decoded: null, wrong image size, invalid UTF-8 text."""
    column = batch.column(payload)
    bad = column.is_null().to_numpy(zero_copy_only=False).copy()
    reason = "undecodable"
    if payload == S.IMAGE:
        shape = S.schema_info(batch.schema).get("image_shape")
        typ = column.type
        size = typ.list_size if pa.types.is_fixed_size_list(typ) else None
        if not shape or size != int(np.prod(shape)) or typ.value_type != pa.uint8():
            return [S.Refusal(S.BatchError(
                f"image column {typ} does not match image_shape {shape} (expected fixed_size_list<uint8, H*W[*C]>)",
                column=payload, sample_ids=[i for i in _sample_ids(batch, np.arange(batch.num_rows)) if i is not None],
                reason=reason), np.arange(batch.num_rows))]
    elif payload == S.TEXT:
        typ = column.type
        if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            for i, value in enumerate(column.to_pylist()):
                if value is not None:
                    try:
                        value.decode("utf-8")
                    except UnicodeDecodeError:
                        bad[i] = True
        elif not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            bad[:] = True
    if not bad.any():
        return []
    rows = np.flatnonzero(bad)
    ids = [i for i in _sample_ids(batch, rows) if i is not None]
    return [S.Refusal(S.BatchError(f"{len(rows)} undecodable {payload} value(s)", column=payload, sample_ids=ids,
                                   reason=reason), rows)]


def gate(batch: pa.RecordBatch, contract: S.Contract, refused: list[S.Refusal] = ()
         ) -> tuple[pa.RecordBatch | None, pa.Table]:
    """(rows that pass, cast to the contract's types; dead letters, each row as it came). Each row is judged on its
    own (`S.judge`); raw batches are checked for a decodable payload as well. `refused`: rows the caller refuses
    besides (a stream's repeated sample ids), each kept under its own fault first."""
    conformed, refusals = S.judge(batch, contract)
    if contract.payload is not None and S.batch_problem(conformed, contract) is None:
        refusals += _payload_refusals(conformed, contract.payload)
    good, unique = S.split(conformed, [*refusals, *refused])
    return good, dead_letters(batch, unique, S.sample_ids_or_none(conformed))
