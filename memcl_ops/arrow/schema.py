"""The Arrow batch contract every actor speaks (docs/architecture.md, "The Arrow contract").

One `pyarrow.RecordBatch` per call. Columns:

* ``sample_id`` int64: unique, increasing position in the stream (resume, exactly-once, dead letters)
* ``task_id`` int32, nullable: task the sample came from (null in task-free streams)
* ``label`` int32, nullable: global class id (null for unlabelled data)
* a raw payload before encoding: ``image`` fixed_size_list<uint8> (shape in schema metadata),
  ``text`` string or ``tokens`` list<int32>
* ``features`` fixed_size_list<float32, D>: frozen-encoder output
* supervised text pairs (small LMs): ``text`` is the prompt and ``answer`` string its target text;
  the LM encoder turns them into ``key`` and ``direction`` fixed_size_list<float32, H> (MIITA's semantic key
  and unnormalised correction R_m) plus ``correction_norm`` float32

Schema metadata carries ``stream``, ``encoder``, ``feature_dim`` and ``image_shape``.
`validate` refuses a batch with a `BatchError` that names the column and the offending
``sample_id``s; `partition` splits a batch into the rows that pass and the refused rows with their
reasons, so nothing is dropped silently (the runner writes refused rows to a dead-letter file).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

SAMPLE_ID = "sample_id"
TASK_ID = "task_id"
LABEL = "label"
IMAGE = "image"
TEXT = "text"
TOKENS = "tokens"
FEATURES = "features"
PAYLOADS = (IMAGE, TEXT, TOKENS)
ANSWER = "answer"  # target text of a supervised (prompt = `text`, answer) pair
KEY = "key"
DIRECTION = "direction"
CORRECTION_NORM = "correction_norm"
ANSWER_TOKENS = "answer_tokens"  # list<int32>: an answer's token ids, end-of-answer token last
MODEL_TOKENS = "model_tokens"  # list<int32>: the frozen model's own greedy token at each of those positions

_META_STREAM = b"stream"
_META_ENCODER = b"encoder"
_META_FEATURE_DIM = b"feature_dim"
_META_IMAGE_SHAPE = b"image_shape"

_ID_FIELDS = [
    pa.field(SAMPLE_ID, pa.int64(), nullable=False),
    pa.field(TASK_ID, pa.int32(), nullable=True),
    pa.field(LABEL, pa.int32(), nullable=True),
]


def _metadata(**values: object) -> dict[bytes, bytes]:
    return {k.encode(): (v if isinstance(v, str) else json.dumps(v)).encode()
            for k, v in values.items() if v is not None}


def raw_schema(payload: str, *, image_shape: Sequence[int] | None = None, stream: str = "") -> pa.Schema:
    """Schema of a raw batch (before encoding) carrying one payload column."""
    if payload == IMAGE:
        if image_shape is None:
            raise ValueError("an image schema needs image_shape (e.g. (28, 28) or (32, 32, 3))")
        size = int(np.prod(image_shape))
        field = pa.field(IMAGE, pa.list_(pa.uint8(), size), nullable=False)
    elif payload == TEXT:
        field = pa.field(TEXT, pa.string(), nullable=False)
    elif payload == TOKENS:
        field = pa.field(TOKENS, pa.list_(pa.int32()), nullable=False)
    else:
        raise ValueError(f"unknown payload column {payload!r}; expected one of {PAYLOADS}")
    meta = _metadata(stream=stream, image_shape=list(image_shape) if image_shape else None)
    return pa.schema([*_ID_FIELDS, field], metadata=meta)


def feature_schema(dim: int, *, stream: str = "", encoder: str = "") -> pa.Schema:
    """Schema of an encoded batch: ids, labels and one FixedSizeList<float32, dim> column."""
    if dim <= 0:
        raise ValueError(f"feature dim must be positive, got {dim}")
    field = pa.field(FEATURES, pa.list_(pa.float32(), dim), nullable=False)
    return pa.schema([*_ID_FIELDS, field],
                     metadata=_metadata(stream=stream, encoder=encoder, feature_dim=dim))


def schema_info(schema: pa.Schema) -> dict[str, object]:
    """The metadata of a memcl schema as plain values."""
    meta = schema.metadata or {}
    out: dict[str, object] = {}
    for key in (_META_STREAM, _META_ENCODER):
        if key in meta:
            out[key.decode()] = meta[key].decode()
    for key in (_META_FEATURE_DIM, _META_IMAGE_SHAPE):
        if key in meta:
            out[key.decode()] = json.loads(meta[key])
    return out


def feature_batch(sample_ids: np.ndarray, features: np.ndarray, labels: np.ndarray | None = None,
                  task_ids: np.ndarray | None = None, *, stream: str = "", encoder: str = "") -> pa.RecordBatch:
    """Build an encoded batch from numpy arrays (features as float32, one FixedSizeList column)."""
    feats = np.ascontiguousarray(features, dtype=np.float32)
    if feats.ndim != 2:
        raise ValueError(f"features must be 2-D (rows, dim), got shape {feats.shape}")
    schema = feature_schema(feats.shape[1], stream=stream, encoder=encoder)
    return pa.RecordBatch.from_arrays(
        [pa.array(np.asarray(sample_ids, dtype=np.int64)),
         _nullable_int32(task_ids, len(feats)),
         _nullable_int32(labels, len(feats)),
         matrix_to_arrow(feats)],
        schema=schema)


def raw_batch(sample_ids: np.ndarray, payload: str, values: object, labels: np.ndarray | None = None,
              task_ids: np.ndarray | None = None, *, image_shape: Sequence[int] | None = None,
              stream: str = "") -> pa.RecordBatch:
    """Build a raw batch: images as a uint8 array (rows, *image_shape), texts as str, tokens as lists."""
    schema = raw_schema(payload, image_shape=image_shape, stream=stream)
    n = len(sample_ids)
    if payload == IMAGE:
        pixels = np.ascontiguousarray(values, dtype=np.uint8).reshape(n, -1)
        column = pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), pixels.shape[1])
    else:
        column = pa.array(list(values), type=schema.field(payload).type)
    return pa.RecordBatch.from_arrays(
        [pa.array(np.asarray(sample_ids, dtype=np.int64)), _nullable_int32(task_ids, n),
         _nullable_int32(labels, n), column], schema=schema)


def text_pair_batch(sample_ids: np.ndarray, prompts: Sequence[str], answers: Sequence[str],
                    task_ids: np.ndarray | None = None, labels: np.ndarray | None = None, *,
                    stream: str = "") -> pa.RecordBatch:
    """A raw text batch whose rows are supervised pairs: `text` holds the prompt, `answer` the target."""
    base = raw_batch(sample_ids, TEXT, prompts, labels, task_ids, stream=stream)
    return base.append_column(pa.field(ANSWER, pa.string(), nullable=False), pa.array(list(answers), pa.string()))


def text_pairs(batch: pa.RecordBatch) -> tuple[list[str], list[str]]:
    """(prompts, answers) of a text-pair batch; refuses missing columns, nulls and empty answers by sample id."""
    ids = _ids(batch)
    for column in (TEXT, ANSWER):
        if batch.schema.get_field_index(column) < 0:
            raise BatchError("missing column (a text-pair batch needs text and answer)", column=column,
                             sample_ids=ids, reason="schema")
        if not pa.types.is_string(batch.schema.field(column).type):
            raise BatchError(f"wrong type {batch.schema.field(column).type}, expected string", column=column,
                             sample_ids=ids, reason="schema")
    prompts, answers = batch.column(TEXT).to_pylist(), batch.column(ANSWER).to_pylist()
    for column, values in ((TEXT, prompts), (ANSWER, answers)):
        bad = [i for i, v in enumerate(values) if v is None or not v.strip()]
        if bad:
            raise BatchError("null or blank text", column=column, sample_ids=_ids(batch, bad), reason="null")
    return prompts, answers


def direction_batch(sample_ids: np.ndarray, keys: np.ndarray, directions: np.ndarray, norms: np.ndarray,
                    task_ids: np.ndarray | None = None, *, stream: str = "", encoder: str = "",
                    answer_tokens: list[list[int]] | None = None, answer_nll: np.ndarray | None = None,
                    model_tokens: list[list[int]] | None = None) -> pa.RecordBatch:
    """MIITA's write-side batch: per pair its semantic key, its correction R_m and ‖R_m‖, and (when given) its
    answer's token ids, the frozen model's mean NLL of that answer and the model's own token at each answer position
    (teacher-forced)."""
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    directions = np.ascontiguousarray(directions, dtype=np.float32)
    if keys.ndim != 2 or directions.ndim != 2 or len(keys) != len(directions):
        raise ValueError(f"keys {keys.shape} and directions {directions.shape} must be 2-D with the same rows")
    n = len(keys)
    arrays = [pa.array(np.asarray(sample_ids, dtype=np.int64)), _nullable_int32(task_ids, n), pa.nulls(n, pa.int32()),
              matrix_to_arrow(keys), matrix_to_arrow(directions), pa.array(np.asarray(norms, dtype=np.float32))]
    fields = [*_ID_FIELDS, pa.field(KEY, pa.list_(pa.float32(), keys.shape[1]), nullable=False),
              pa.field(DIRECTION, pa.list_(pa.float32(), directions.shape[1]), nullable=False),
              pa.field(CORRECTION_NORM, pa.float32(), nullable=False)]
    if answer_tokens is not None:
        if len(answer_tokens) != n:
            raise ValueError(f"{len(answer_tokens)} answer token lists for {n} rows")
        arrays.append(pa.array(answer_tokens, type=pa.list_(pa.int32())))
        fields.append(pa.field(ANSWER_TOKENS, pa.list_(pa.int32()), nullable=False))
    if answer_nll is not None:
        arrays.append(pa.array(np.asarray(answer_nll, dtype=np.float32)))
        fields.append(pa.field(ANSWER_NLL, pa.float32(), nullable=False))
    if model_tokens is not None:
        if len(model_tokens) != n:
            raise ValueError(f"{len(model_tokens)} model token lists for {n} rows")
        arrays.append(pa.array(model_tokens, type=pa.list_(pa.int32())))
        fields.append(pa.field(MODEL_TOKENS, pa.list_(pa.int32()), nullable=False))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(
        fields, metadata=_metadata(stream=stream, encoder=encoder, feature_dim=keys.shape[1])))


def _nullable_int32(values: np.ndarray | pa.Array | None, n: int) -> pa.Array:
    if values is None:
        return pa.nulls(n, pa.int32())
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.cast(pa.int32())
    return pa.array(np.asarray(values), type=pa.int32())


def matrix_to_arrow(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """A (rows, dim) float32 matrix as one FixedSizeList column (zero-copy for contiguous input)."""
    m = np.ascontiguousarray(matrix, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), m.shape[1])


def column_matrix(batch: pa.RecordBatch, column: str = FEATURES) -> np.ndarray:
    """A FixedSizeList column as a (rows, width) numpy view.

    Zero-copy when the column has no offset/nulls; the view is read-only (Arrow buffers are immutable),
    so callers that write in place must copy (or use `features_to_torch(..., writable=True)`).
    """
    col = batch.column(column)
    if not pa.types.is_fixed_size_list(col.type):
        raise BatchError(f"column {column!r} must be a fixed_size_list, got {col.type}", column=column,
                         sample_ids=_ids(batch))
    width = col.type.list_size
    values = col.flatten()  # honours the array offset
    flat = values.to_numpy(zero_copy_only=values.null_count == 0)
    return flat.reshape(len(col), width)


def features_to_numpy(batch: pa.RecordBatch) -> np.ndarray:
    return column_matrix(batch, FEATURES)


def features_to_torch(batch: pa.RecordBatch, *, writable: bool = False) -> torch.Tensor:
    """Features as a float32 tensor, sharing the Arrow buffer where it can.

    Arrow/Ray buffers are read-only: with ``writable=True`` such a buffer is copied (in-place torch work
    needs its own memory); otherwise the tensor shares it and must be treated as read-only.
    """
    array = features_to_numpy(batch)
    if array.flags.writeable:
        return torch.from_numpy(array)
    if writable:
        return torch.from_numpy(array.copy())
    with warnings.catch_warnings():  # torch warns on any read-only buffer; reads are safe
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def labels_to_numpy(batch: pa.RecordBatch) -> np.ndarray:
    """Labels as int64 (nulls become -1: "unlabelled")."""
    return pc.fill_null(batch.column(LABEL), -1).to_numpy().astype(np.int64)


def task_ids_to_numpy(batch: pa.RecordBatch) -> np.ndarray:
    return pc.fill_null(batch.column(TASK_ID), -1).to_numpy().astype(np.int64)


def sample_ids_to_numpy(batch: pa.RecordBatch) -> np.ndarray:
    return batch.column(SAMPLE_ID).to_numpy()


def sample_ids_or_none(batch: pa.RecordBatch) -> list[int | None]:
    """Each row's sample_id, None where it is null or the column is missing or not of integers."""
    idx = batch.schema.get_field_index(SAMPLE_ID)
    if idx < 0 or not pa.types.is_integer(batch.schema.field(idx).type):
        return [None] * batch.num_rows
    return batch.column(idx).to_pylist()


def _ids(batch: pa.RecordBatch, rows: Iterable[int] | None = None) -> list[int]:
    if batch.schema.get_field_index(SAMPLE_ID) < 0:
        return []
    ids = batch.column(SAMPLE_ID)
    if rows is None:
        return [v for v in ids.to_pylist() if v is not None]
    return [ids[int(i)].as_py() for i in rows]


class BatchError(ValueError):
    """A batch (or some of its rows) broke the contract. Names the column and the sample ids."""

    def __init__(self, message: str, *, column: str | None = None, sample_ids: Sequence[int] = (),
                 reason: str = "invalid"):
        self.column = column
        self.sample_ids = list(sample_ids)
        self.reason = reason
        self.detail = message
        shown = self.sample_ids[:10]
        more = f" (+{len(self.sample_ids) - 10} more)" if len(self.sample_ids) > 10 else ""
        where = f" column {column!r}:" if column else ""
        super().__init__(f"[{reason}]{where} {message}; sample_ids={shown}{more}")


FEATURE_BOUND = 2.0**10  # |feature| every method takes: what the analytic heads square exactly at fraction_bits 16


@dataclass(frozen=True)
class FeatureBound:
    """The largest features a learner takes: |x_i| <= `max_abs` for every value, and sum_i |x_i| <= `max_l1` per row
    (None: no bound on the row); `why` says where the numbers come from (a refusal's message quotes it)."""

    max_abs: float = FEATURE_BOUND
    max_l1: float | None = None
    why: str = "the bound of every method, docs/guide.md"


# what each refusal reason means, in words (docs/guide.md lists them; the closing summary names the commonest)
REASONS = {
    "schema": "a column is missing or holds a type that does not convert to the contract's",
    "null": "a null where the contract needs a value (sample_id, features, a text)",
    "feature_dim": "the features do not have data.feature_dim values",
    "non_finite": "NaN or Inf in the features",
    "magnitude": "a feature beyond the bound the method takes",
    "missing_label": "no label where one is needed (test rows; methods that cannot predict unlabelled rows)",
    "negative_label": "a label below 0",
    "unknown_label": "a label outside data.labels",
    "duplicate": "a sample_id an earlier training row already used",
    "unreadable": "a file that cannot be read as Parquet or Arrow IPC",
    "undecodable": "a raw payload that cannot be decoded (image size, UTF-8)",
    "empty": "an empty batch",
    "oversized": "a batch above runtime.max_batch_rows",
}


@dataclass(frozen=True)
class Contract:
    """What a batch must satisfy at one boundary of the pipeline."""

    feature_dim: int | None = None  # required FixedSizeList width of `features`, if the batch has them
    payload: str | None = None  # required raw payload column, if any
    known_labels: frozenset[int] | None = None  # labels outside this set are refused (None: any >= 0)
    max_rows: int | None = None  # oversized batches are refused
    require_labels: bool = False
    feature_bound: FeatureBound | None = FeatureBound()  # features beyond it are refused (None: any finite value)


@dataclass(frozen=True)
class Refusal:
    """Rows refused for one reason."""

    error: BatchError
    rows: np.ndarray  # row indices into the checked batch


_EXPECTED_TYPES = {SAMPLE_ID: pa.int64(), TASK_ID: pa.int32(), LABEL: pa.int32()}
UNREADABLE_FILE = "unreadable_file"  # the one column of the row a reader emits for a file it cannot read (and `error`)


def batch_problem(batch: pa.RecordBatch, contract: Contract) -> BatchError | None:
    """A violation that makes every row of `batch` unusable (an unreadable file, a missing column or one of another
    kind of type, empty, oversized), if any."""
    ids = _ids(batch)
    if batch.schema.get_field_index(UNREADABLE_FILE) >= 0 and batch.num_rows:
        error = batch.column("error")[0].as_py() if "error" in batch.schema.names else "unreadable"
        return BatchError(f"{batch.column(UNREADABLE_FILE)[0].as_py()}: {error}", reason="unreadable")
    for name, typ in _EXPECTED_TYPES.items():
        idx = batch.schema.get_field_index(name)
        if idx < 0:
            return BatchError("missing column", column=name, sample_ids=ids, reason="schema")
        if batch.schema.field(name).type != typ:
            return BatchError(f"wrong type {batch.schema.field(name).type}, expected {typ}", column=name,
                              sample_ids=ids, reason="schema")
    if batch.num_rows == 0:
        return BatchError("empty batch", reason="empty")
    if contract.max_rows is not None and batch.num_rows > contract.max_rows:
        return BatchError(f"{batch.num_rows} rows exceed the configured maximum {contract.max_rows}",
                          sample_ids=ids, reason="oversized")
    if contract.payload is not None and batch.schema.get_field_index(contract.payload) < 0:
        return BatchError("missing payload column", column=contract.payload, sample_ids=ids, reason="schema")
    if contract.feature_dim is not None:
        idx = batch.schema.get_field_index(FEATURES)
        if idx < 0:
            return BatchError("missing column", column=FEATURES, sample_ids=ids, reason="schema")
        typ = batch.schema.field(FEATURES).type
        if not (pa.types.is_fixed_size_list(typ) and typ.value_type == pa.float32()):
            return BatchError(f"wrong type {typ}, expected fixed_size_list<float32, {contract.feature_dim}>",
                              column=FEATURES, sample_ids=ids, reason="schema")
        if typ.list_size != contract.feature_dim:
            return BatchError(f"feature dim {typ.list_size} != expected {contract.feature_dim}",
                              column=FEATURES, sample_ids=ids, reason="feature_dim")
    return None


def _refusal(batch: pa.RecordBatch, mask: np.ndarray, message: str, column: str, reason: str) -> list[Refusal]:
    """The rows of `mask` refused for one reason (none if the mask is empty)."""
    rows = np.flatnonzero(mask)
    if not len(rows):
        return []
    return [Refusal(BatchError(message, column=column, sample_ids=[i for i in _ids(batch, rows) if i is not None],
                               reason=reason), rows)]


def _feature_refusals(batch: pa.RecordBatch, contract: Contract) -> list[Refusal]:
    """Feature rows that are null, hold NaN/Inf, or go beyond the contract's bound; each row judged on its own."""
    col = batch.column(FEATURES)
    dim = col.type.list_size
    nulls = col.is_null().to_numpy(zero_copy_only=False)
    values = col.values.slice(col.offset * dim, len(col) * dim)  # null rows included, so rows stay aligned
    feats = values.to_numpy(zero_copy_only=values.null_count == 0).reshape(len(col), dim)
    finite = np.isfinite(feats).all(axis=1) | nulls
    out = _refusal(batch, nulls, "null feature rows", FEATURES, "null")
    out += _refusal(batch, ~finite, "NaN/Inf in features", FEATURES, "non_finite")
    bound = contract.feature_bound
    if bound is not None:
        size = np.abs(feats)
        worst = np.where(finite & ~nulls, size.max(axis=1, initial=0.0), 0.0)
        l1 = np.where(finite & ~nulls, size.sum(axis=1, dtype=np.float64), 0.0)
        beyond = worst > bound.max_abs
        if beyond.any():
            out += _refusal(batch, beyond, f"a feature of magnitude {worst[beyond].max():.3g} is beyond the bound "
                            f"{bound.max_abs:g} ({bound.why})", FEATURES, "magnitude")
        if bound.max_l1 is not None and (over := (l1 > bound.max_l1) & ~beyond).any():
            out += _refusal(batch, over, f"a feature row of L1 norm {l1[over].max():.3g} is beyond the bound "
                            f"{bound.max_l1:.4g} ({bound.why})", FEATURES, "magnitude")
    return out


def check(batch: pa.RecordBatch, contract: Contract) -> list[Refusal]:
    """Every contract violation in `batch`, grouped by reason, with the refused row indices: each row is judged on
    its own, except for what no row of the batch can satisfy (`batch_problem`). Types must be the contract's
    (`conform` casts a batch to them first)."""
    problem = batch_problem(batch, contract)
    if problem is not None:
        return [Refusal(problem, np.arange(batch.num_rows))]
    refusals = _refusal(batch, batch.column(SAMPLE_ID).is_null().to_numpy(zero_copy_only=False),
                        "null sample_id", SAMPLE_ID, "null")
    if contract.feature_dim is not None:
        refusals += _feature_refusals(batch, contract)
    labels = batch.column(LABEL)
    missing = labels.is_null().to_numpy(zero_copy_only=False)
    if contract.require_labels:
        refusals += _refusal(batch, missing, "missing label", LABEL, "missing_label")
    values = labels_to_numpy(batch)
    negative = ~missing & (values < 0)
    refusals += _refusal(batch, negative, "negative label", LABEL, "negative_label")
    if contract.known_labels is not None:
        known = np.fromiter(contract.known_labels, dtype=np.int64)
        unknown = ~missing & (values >= 0) & ~np.isin(values, known)
        refusals += _refusal(batch, unknown, f"unknown label(s) {sorted(set(values[unknown].tolist()))[:10]}", LABEL,
                             "unknown_label")
    return refusals


def integers(column: pa.Array | pa.ChunkedArray, target: pa.DataType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An integer or float column's values in `target`'s numpy type, row by row: (values, the null rows (NaN counts as
    null), the rows whose value is no integer or does not fit `target`); the values of those rows are 0."""
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    raw = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    info = np.iinfo(target.to_pandas_dtype())
    if raw.dtype.kind == "f":
        nan = np.isnan(raw)
        nulls, raw = nulls | nan, np.where(nan, 0.0, raw)
        fits = (raw >= info.min) & (raw < -float(info.min)) & (np.floor(raw) == raw)  # -min: 2^(bits-1), exact
    else:
        fits = (raw >= info.min) & (raw <= info.max)
    bad = ~fits & ~nulls
    return np.where(fits, raw, 0).astype(info.dtype), nulls, bad


def _conform_integers(batch: pa.RecordBatch, name: str, target: pa.DataType) -> tuple[pa.Array, list[Refusal]]:
    """An integer or float column as `target`, row by row (`integers`): a value that is no integer, or that `target`
    cannot hold, is refused (its place left null)."""
    values, nulls, bad = integers(batch.column(name), target)
    examples = sorted(set(batch.column(name).filter(pa.array(bad)).to_pylist()))[:5]
    return pa.array(values, type=target, mask=nulls | bad), _refusal(
        batch, bad, f"{len(np.flatnonzero(bad))} value(s) such as {examples} are not {target}", name, "schema")


def _conform_features(batch: pa.RecordBatch, dim: int) -> tuple[pa.Array, list[Refusal]]:
    """A list column of numbers (any list kind, any width) as fixed_size_list<float32, dim>, row by row: a row of
    another length, holding a null value, or a finite value float32 cannot hold, is refused (its place left null)."""
    column = batch.column(FEATURES)
    n = len(column)
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = column.flatten()  # the values of the non-null rows, in row order
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    wrong = ~nulls & (lengths != dim)
    holed = np.zeros(n, bool)
    if values.null_count:
        null_values = np.concatenate([[0], np.cumsum(values.is_null().to_numpy(zero_copy_only=False))])
        holed = ~nulls & ~wrong & (null_values[starts + lengths] > null_values[starts])
    take = ~nulls & ~wrong & ~holed
    flat = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if take.all():  # every row dim long: the values are the matrix already, without a copy
        matrix = flat.reshape(n, dim)
    else:
        matrix = np.zeros((n, dim), np.float64)
        matrix[take] = flat[starts[take][:, None] + np.arange(dim)[None, :]]
    with np.errstate(invalid="ignore", over="ignore"):
        huge = take & (np.abs(matrix) > np.finfo(np.float32).max).any(axis=1) & np.isfinite(matrix).all(axis=1)
        single = matrix.astype(np.float32)
    refused = nulls | wrong | holed | huge
    single[refused] = 0.0
    array = pa.FixedSizeListArray.from_arrays(pa.array(single.ravel()), dim, mask=pa.array(refused))
    found = sorted(set(lengths[wrong].tolist()))[:5]
    largest = float(np.abs(matrix[huge]).max(initial=0.0))
    return array, (_refusal(batch, wrong, f"rows of {found} values, expected {dim}", FEATURES, "feature_dim")
                   + _refusal(batch, holed, "null values inside feature rows", FEATURES, "null")
                   + _refusal(batch, huge, f"a feature of magnitude {largest:.3g} does not fit float32", FEATURES,
                              "magnitude"))


def conform(batch: pa.RecordBatch, contract: Contract) -> tuple[pa.RecordBatch, list[Refusal]]:
    """`batch` with its id, task and label columns and its features cast to the contract's types where the file's
    types differ, row by row (another integer width, integral floats, a list of numbers of any kind), and the rows
    that cannot be cast, refused for that alone (their places left null). A column of another kind (text labels),
    or missing, is left as it is: `check` refuses the batch for it."""
    refusals: list[Refusal] = []
    columns, fields = list(batch.columns), list(batch.schema)
    cast = []
    for name, typ in _EXPECTED_TYPES.items():
        idx = batch.schema.get_field_index(name)
        if idx >= 0 and fields[idx].type != typ and _is_number(fields[idx].type):
            columns[idx], refused = _conform_integers(batch, name, typ)
            cast.append((idx, typ))
            refusals += refused
    idx = batch.schema.get_field_index(FEATURES)
    if contract.feature_dim is not None and idx >= 0:
        typ, target = fields[idx].type, pa.list_(pa.float32(), contract.feature_dim)
        lists = pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
        if typ != target and lists and _is_number(typ.value_type):
            columns[idx], refused = _conform_features(batch, contract.feature_dim)
            cast.append((idx, target))
            refusals += refused
    if not cast:
        return batch, []
    for idx, typ in cast:
        fields[idx] = fields[idx].with_type(typ)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields, metadata=batch.schema.metadata)), refusals


def _is_number(typ: pa.DataType) -> bool:
    return pa.types.is_integer(typ) or pa.types.is_floating(typ)


def validate(batch: pa.RecordBatch, contract: Contract | None = None, **kwargs: object) -> None:
    """Raise the first `BatchError` found in `batch` (see `Contract` for the keyword arguments)."""
    refusals = check(batch, contract or Contract(**kwargs))  # type: ignore[arg-type]
    if refusals:
        raise refusals[0].error


def split(batch: pa.RecordBatch, refusals: list[Refusal]) -> tuple[pa.RecordBatch | None, list[Refusal]]:
    """The rows no refusal names, and the refusals with each row kept only under the first reason that caught it."""
    if not refusals:
        return batch, []
    taken = np.zeros(batch.num_rows, dtype=bool)
    unique: list[Refusal] = []
    for refusal in refusals:
        rows = refusal.rows[~taken[refusal.rows]]
        if len(rows):
            taken[rows] = True
            error = refusal.error
            if len(rows) < len(refusal.rows):  # the message names only the rows refused for this reason
                error = BatchError(error.detail, column=error.column, reason=error.reason,
                                   sample_ids=[i for i in _ids(batch, rows) if i is not None])
            unique.append(Refusal(error, rows))
    keep = np.flatnonzero(~taken)
    return (batch.take(pa.array(keep)) if len(keep) else None), unique


def judge(batch: pa.RecordBatch, contract: Contract) -> tuple[pa.RecordBatch, list[Refusal]]:
    """`batch` cast to the contract's types row by row (`conform`), and every refusal of its rows: those that could
    not be cast, then what `check` finds in the rest."""
    conformed, refusals = conform(batch, contract)
    return conformed, refusals + check(conformed, contract)


def partition(batch: pa.RecordBatch, contract: Contract) -> tuple[pa.RecordBatch | None, list[Refusal]]:
    """Split `batch` into the rows that satisfy the contract (in its types) and the refusals (each row refused
    once)."""
    return split(*judge(batch, contract))


PREDICTION = "prediction"
ANSWER_NLL = "answer_nll"
PROMPT_TOKENS = "prompt_tokens"  # tokens the model read for one answer (demonstrations included)


def with_predictions(pairs: pa.RecordBatch, texts: list[str], answer_nll: torch.Tensor, prompt_tokens: list[int]
                     ) -> pa.RecordBatch:
    """The text-pair batch with each row's generated text, the teacher-forced NLL of its answer and the prompt
    tokens the model read for it appended."""
    out = pairs.append_column(pa.field(PREDICTION, pa.string(), nullable=False), pa.array(texts, pa.string()))
    out = out.append_column(pa.field(ANSWER_NLL, pa.float32(), nullable=False),
                            pa.array(answer_nll.numpy().astype("float32")))
    return out.append_column(pa.field(PROMPT_TOKENS, pa.int32(), nullable=False), pa.array(prompt_tokens, pa.int32()))


STREAM_BATCH = "stream_batch"  # a block kept as one batch (a compiled chain's): each row's batch within it


def stream_batches(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """The stream's batches in `batch`: itself, or its `STREAM_BATCH` runs in order (the column dropped)."""
    index = batch.schema.get_field_index(STREAM_BATCH)
    if index < 0:
        return [batch]
    runs = batch.column(index).to_numpy()
    starts = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1]]) if len(runs) else np.zeros(0, np.int64)
    body = batch.remove_column(index)
    return [body.slice(a, b - a) for a, b in zip(starts, [*starts[1:], len(runs)])]


def labelled_block(batches: tuple[pa.RecordBatch | None, ...]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(features, labels, sample_ids) of the labelled rows of `batches`, concatenated in stream order
    (None stands for a batch the gate refused entirely)."""
    feats, labels, ids = [], [], []
    for b in batches:
        if b is None:
            continue
        y = labels_to_numpy(b)
        keep = y >= 0
        feats.append(features_to_numpy(b)[keep])
        labels.append(y[keep])
        ids.append(sample_ids_to_numpy(b)[keep])
    if not feats:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), np.zeros(0, np.int64)
    return (torch.from_numpy(np.concatenate(feats)), torch.from_numpy(np.concatenate(labels)),
            np.concatenate(ids))
