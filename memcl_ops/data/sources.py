"""Where a stream's batches come from. One protocol, three kinds:

* `DatasetStream`: a real dataset cut into class-incremental tasks by a `StreamPlan` (raw payload, or
  features once the encoder/cache has provided them);
* `ArrowDirStream`: the user's own stream, a folder of Parquet or Arrow IPC files read in name order
  (`train/`, optional `test/`), re-batched by the stream's batch size; files may hold anything, malformed
  batches included; the boundary gate sorts them out;
* `DriftStream`: a long-horizon non-stationary stream generated in feature space (stress tests):
  recurring tasks, gradual drift of every class mean, and abrupt shifts into new regions.

Visits are the units the runner consolidates and evaluates after (a task's stretch of the stream).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import (
    DATASETS,
    Dataset,
    DatasetUnavailable,
    SyntheticSpec,
    load_dataset,
    make_synthetic,
    missing_parts,
)
from memcl_ops.data.streams import StreamPlan, StreamSpec, make_plan, task_classes


@dataclass
class StreamInfo:
    name: str
    payload: str  # "image", "text" or "features"
    task_classes: list[list[int]]
    visits: list[int]  # task index of each visit
    visit_batches: list[int]
    test_batches: list[int]  # per task
    num_samples: int
    labels: list[int] | None  # the label set the gate accepts (None: any label >= 0)
    fingerprint: str
    image_shape: tuple[int, ...] | None = None
    feature_dim: int | None = None
    novel_shifts: int | None = None  # generated streams: the true novel events injected (N_T)
    cacheable: bool = False  # raw rows of a fixed dataset: their features can go to the feature cache
    # sample ids a label file labels after their rows came unlabelled (an `arrow:` folder's late labels)
    late_labels: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


class Stream(Protocol):
    def describe(self) -> StreamInfo: ...

    def train_batch(self, visit: int, index: int) -> pa.RecordBatch: ...

    def test_batch(self, task: int, index: int, after_visit: int) -> pa.RecordBatch: ...

    def visit_tasks(self, visit: int) -> list[int]: ...

    # where a batch's rows come from, for its dead letters: (a file of the folder or the stream's name, the row of
    # it the batch starts at); `key` is the visit of a "train" batch, the task of a "test" one
    def origin(self, split: str, key: int, index: int) -> tuple[str, int]: ...

    # rows of a training batch whose sample_id an earlier training row had (only an `arrow:` folder repeats one)
    def repeated(self, split: str, key: int, index: int) -> list[S.Refusal]: ...


def _fingerprint(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class DatasetStream:
    def __init__(self, dataset: Dataset, spec: StreamSpec):
        self.dataset, self.spec = dataset, spec
        self.plan: StreamPlan = make_plan(dataset.train_y, dataset.test_y, dataset.num_classes, spec)
        self.drop_cached_features()

    def drop_cached_features(self) -> None:
        """Forget the features `set_features` handed over: raw rows again, as a new run without a cache needs."""
        dataset = self.dataset
        self.features: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # split -> (sorted rows, features)
        if dataset.payload == "features":
            self.features = {"train": (np.arange(len(dataset.train_y)), dataset.train_x),
                             "test": (np.arange(len(dataset.test_y)), dataset.test_x)}

    def describe(self) -> StreamInfo:
        plan, bs = self.plan, self.spec.batch_size
        ds = self.dataset
        return StreamInfo(
            name=ds.name, payload=ds.payload, task_classes=plan.classes, visits=plan.visits,
            visit_batches=[len(plan.batches_of_visit(v)) for v in range(len(plan.visits))],
            test_batches=[int(np.ceil(len(r) / bs)) for r in plan.test_rows], num_samples=plan.num_samples,
            labels=sorted(plan.label_set), fingerprint=_fingerprint([*plan.visit_rows, *plan.test_rows]),
            image_shape=ds.image_shape,
            feature_dim=int(ds.train_x.shape[1]) if ds.payload == "features" else None,
            cacheable=ds.payload != "features", extra={"class_names": list(ds.class_names)})

    def needed_rows(self, split: str) -> np.ndarray:
        rows = self.plan.train_rows if split == "train" else self.plan.test_rows
        return np.unique(np.concatenate(rows))

    def raw_rows(self, split: str, rows: np.ndarray) -> pa.RecordBatch:
        """Raw rows of a split (sample_id = dataset row), for encoding into the feature cache."""
        _, y = self.dataset.split(split)
        return self._raw(split, rows, rows, y[rows], None)

    def set_features(self, split: str, rows: np.ndarray, features: np.ndarray) -> None:
        order = np.argsort(rows)
        self.features[split] = (np.asarray(rows)[order], np.asarray(features)[order])

    def train_batch(self, visit: int, index: int) -> pa.RecordBatch:
        batch = self.plan.batches_of_visit(visit)[index]
        return self._emit("train", batch.sample_ids, batch.rows, None if self.spec.task_free else batch.tasks)

    def test_batch(self, task: int, index: int, after_visit: int) -> pa.RecordBatch:
        bs = self.spec.batch_size
        rows = self.plan.test_rows[task][index * bs:(index + 1) * bs]
        return self._emit("test", rows, rows, np.full(len(rows), task))

    def visit_tasks(self, visit: int) -> list[int]:
        return sorted(set(self.plan.visit_tasks[visit].tolist()))

    def origin(self, split: str, key: int, index: int) -> tuple[str, int]:
        return f"{self.dataset.name} {split}", 0  # rows are drawn across the dataset; sample_id is the dataset row

    def repeated(self, split: str, key: int, index: int) -> list[S.Refusal]:
        return []

    def _emit(self, split: str, ids: np.ndarray, rows: np.ndarray, tasks: np.ndarray | None) -> pa.RecordBatch:
        _, y = self.dataset.split(split)
        if split in self.features:
            have, feats = self.features[split]
            return S.feature_batch(ids, feats[np.searchsorted(have, rows)], y[rows], tasks, stream=self.dataset.name)
        return self._raw(split, ids, rows, y[rows], tasks)

    def _raw(self, split: str, ids: np.ndarray, rows: np.ndarray, labels: np.ndarray,
             tasks: np.ndarray | None) -> pa.RecordBatch:
        x, _ = self.dataset.split(split)
        return S.raw_batch(ids, self.dataset.payload, x[rows], labels, tasks, image_shape=self.dataset.image_shape,
                           stream=self.dataset.name)


ARROW_SUFFIXES = (".arrow", ".ipc", ".feather", ".parquet")  # the file kinds an arrow:<folder> stream reads
CLASS_NAMES_KEY = b"class_names"  # schema metadata: a JSON list, name of label i at position i
CLASS_NAMES_FILE = "classes.txt"  # or a sidecar in the folder: one name per line, line i names label i


def _read_table(path: Path) -> pa.Table:
    """One Parquet or Arrow IPC (file or stream format) file; an unreadable one (truncated, not Arrow at all) becomes
    a one-row table naming the file and the reader's error, which the gate refuses as one dead letter (`unreadable`)."""
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        try:
            return pa.ipc.open_file(path).read_all()
        except pa.ArrowInvalid as as_file:
            try:
                return pa.ipc.open_stream(path.read_bytes()).read_all()
            except pa.ArrowInvalid as as_stream:
                raise pa.ArrowInvalid(f"neither an Arrow IPC file ({as_file}) nor stream ({as_stream})") from None
    except (pa.ArrowException, OSError) as err:
        return pa.table({S.UNREADABLE_FILE: [str(path)], "error": [str(err)]})


def _first_task(table: pa.Table) -> int | None:
    idx = table.schema.get_field_index(S.TASK_ID)
    if idx < 0 or not pa.types.is_integer(table.schema.field(idx).type):
        return None
    values = pc.drop_null(table.column(idx))
    return int(values[0].as_py()) if len(values) else None


def data_files(folder: Path) -> list[Path]:
    """The Parquet and Arrow IPC files of one split folder, in name order. A name that starts with a dot or ends in
    another suffix (`.tmp`, `.part`) is no data file: a writer writes under one and renames the file into place once
    whole, so a file still being written is never read."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in ARROW_SUFFIXES and not p.name.startswith("."))


@dataclass(frozen=True)
class Slice:
    """One batch of an Arrow folder stream: `length` rows of one file from row `offset`."""

    path: Path
    offset: int
    length: int


class ArrowDirStream:
    """A folder of Parquet or Arrow IPC files: `train/` in name order is the stream, `test/` the evaluation data
    (rows carry their `task_id`). Files hold any number of rows; each is cut into batches of `batch_size` rows
    (a batch never spans two files, which may differ in schema). A new visit starts where the first non-null
    task_id of a train file differs from the current one. Files are read lazily, one at a time.

    **Late labels**: a train file with `sample_id` and `label` columns and no payload column is a label file: at
    its place in the stream, each row it labels (an earlier training row whose label was null) comes again, with
    that label, to be learned there. A label for a sample_id no earlier row left unlabelled comes with a null
    payload, which the gate refuses."""

    def __init__(self, root: str | Path, payload: str, labels: list[int] | None = None,
                 feature_dim: int | None = None, batch_size: int = 256):
        self.root = Path(root)
        if not (self.root / "train").is_dir():
            raise FileNotFoundError(f"{self.root}: an Arrow stream folder needs a train/ sub-folder of "
                                    f"{'/'.join(ARROW_SUFFIXES)} files")
        if payload == "features" and feature_dim is None:
            raise ValueError(f"{self.root}: a feature stream needs data.feature_dim (the width the learner accepts)")
        self.payload, self.labels, self.feature_dim, self.batch_size = payload, labels, feature_dim, batch_size
        self.test_files = data_files(self.root / "test")
        self._open: tuple[Path, pa.Table] | None = None  # the file read last (its batches are asked for in order)
        self._tests: list[tuple[int | None, list[Slice]]] = []  # per test file: its first task id and its batches
        for path in self.test_files:
            table = self._table(path)
            self._tests.append((_first_task(table), self._slices(path, table.num_rows)))
        self._forget_train_files()
        self.take(data_files(self.root / "train"))

    def _forget_train_files(self) -> None:
        """The stream as it is before any train file is taken."""
        self.train_files: list[Path] = []
        self.sizes: dict[Path, int] = {}  # each train file's size when it was taken (the stream's fingerprint)
        self.task_order: dict[int, int] = {}  # task_id -> task index, in order of first appearance
        self.visit_slices: list[list[Slice]] = []
        self.visits: list[int] = []
        self.num_rows = 0
        self.class_names = self._sidecar_names()
        self.task_labels: dict[int, set[int]] = {}  # the labels each task's rows carry (for tables and plots)
        self.settles: dict[Path, list[tuple[Path, int] | None]] = {}  # per label file, per row: the row it labels
        self.late_labels: list[int] = []  # the sample ids the label files settle, in stream order
        self.ids: list[tuple[Path, pa.ChunkedArray]] = []  # the sample ids of each data file, in stream order
        self.awaiting: dict[int, tuple[Path, int]] = {}  # unlabelled training rows no label file has settled yet
        # per train file, its rows whose sample_id an earlier training row had, each with where that row is
        self.repeats: dict[Path, dict[int, tuple[Path, int]]] = {}
        self.task_ids: list[int] = []
        self.tests: dict[int, list[Slice]] = {}

    def take(self, paths: list[Path]) -> None:
        """Append train files to the stream, in the order given. What a file adds depends only on the files before
        it, so a stream that takes files as they land (`stream.follow`) keeps every batch where it was."""
        order: list[tuple[Path, list[int] | None, list[tuple[int, int]]]] = []  # label file ids, or unlabelled rows
        for path in paths:
            table = self._table(path)
            self.sizes[path] = path.stat().st_size
            self.num_rows += table.num_rows
            if self._label_file(table):
                order.append((path, table.column(S.SAMPLE_ID).to_pylist(), []))
                if not self.visits:
                    self.visits.append(0)
                    self.visit_slices.append([])
                self.visit_slices[-1] += self._slices(path, table.num_rows)
                self.task_labels.setdefault(self.visits[-1], set()).update(_labels(table))
                continue
            order.append((path, None, _unlabelled_rows(table)))
            self.ids.append((path, _sample_id_column(table)))
            self.class_names = self.class_names or _metadata_names(table.schema)
            task = _first_task(table)
            index = self.task_order.setdefault(task, len(self.task_order)) if task is not None else None
            if not self.visits or (index is not None and index != self.visits[-1]):
                self.visits.append(0 if index is None else index)
                self.visit_slices.append([])
            self.visit_slices[-1] += self._slices(path, table.num_rows)
            self.task_labels.setdefault(self.visits[-1], set()).update(_labels(table))
        self.train_files += paths
        self.repeats = _repeats(self.ids)
        self._settle(order)
        self.task_ids = sorted(self.task_order, key=self.task_order.get)
        self.tests = {}
        for task, slices in self._tests:
            if task is not None and task in self.task_order:
                self.tests.setdefault(self.task_order[task], []).extend(slices)

    def new_files(self) -> list[Path]:
        """The data files of train/ the stream has not taken, in name order (what landed in a followed folder)."""
        taken = set(self.train_files)
        return [p for p in data_files(self.root / "train") if p not in taken]

    def hold(self, names: list[str]) -> None:
        """Hold at least the train files `names`, in that order (the stream a checkpoint was taken over): nothing to
        do where they begin the stream already, else the stream is taken again from them."""
        held = [p.name for p in self.train_files]
        if held[:len(names)] == names:
            return
        gone = [name for name in names if not (self.root / "train" / name).is_file()]
        if gone:
            raise FileNotFoundError(f"{self.root}/train/{gone[0]}: the run streamed it and it is gone; a followed "
                                    "folder's files are the record a resume continues from: keep them")
        if names[:len(held)] != held:
            self._forget_train_files()
        self.take([self.root / "train" / name for name in names[len(self.train_files):]])

    def _settle(self, order: list[tuple[Path, list[int] | None, list[tuple[int, int]]]]) -> None:
        """Which earlier unlabelled row each label file's row labels (a repeated row is never one of them)."""
        awaiting = self.awaiting  # unlabelled training rows so far, by sample_id: where they are
        for path, labelled, unlabelled in order:
            if labelled is None:
                skip = self.repeats.get(path, {})
                awaiting.update({i: (path, row) for i, row in unlabelled if row not in skip})
                continue
            self.settles[path] = [awaiting.pop(i, None) for i in labelled]
            self.late_labels += [i for i, where in zip(labelled, self.settles[path], strict=True) if where is not None]

    def _slices(self, path: Path, rows: int) -> list[Slice]:
        # an empty file still yields one (empty) batch, so every file of the folder is accounted for
        return [Slice(path, a, min(self.batch_size, rows - a)) for a in range(0, max(rows, 1), self.batch_size)]

    def _table(self, path: Path) -> pa.Table:
        if self._open is None or self._open[0] != path:
            self._open = (path, _read_table(path))
        return self._open[1]

    @property
    def _payload_type(self) -> pa.DataType:
        """The payload column's type as the gate accepts it (a null row of it is refused as null, not as a schema
        error); an image's size is not known here."""
        if self.payload == "features":
            return pa.list_(pa.float32(), self.feature_dim)
        return pa.string() if self.payload == "text" else pa.null()

    def _label_file(self, table: pa.Table) -> bool:
        names = table.schema.names
        return S.SAMPLE_ID in names and S.LABEL in names and self.payload not in names

    def _batch(self, piece: Slice) -> pa.RecordBatch:
        if piece.path in self.settles:
            table = self._late_rows(piece)
        else:
            table = self._table(piece.path).slice(piece.offset, piece.length)
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)

    def _late_rows(self, piece: Slice) -> pa.Table:
        """The rows a label file's slice settles, each as it first came (its payload, its task) with the late label;
        a label that settles no row gets a null payload."""
        labels = self._table(piece.path).slice(piece.offset, piece.length)
        ids, values = labels.column(S.SAMPLE_ID).to_pylist(), labels.column(S.LABEL).to_pylist()
        where = self.settles[piece.path][piece.offset:piece.offset + piece.length]
        columns = [S.SAMPLE_ID, S.TASK_ID, S.LABEL, self.payload]
        files = {path: _read_table(path) for path in {origin[0] for origin in where if origin is not None}}
        rows: list[pa.Table] = []
        for k, origin in enumerate(where):
            source = None if origin is None else files[origin[0]]
            if source is None or not set(columns) <= set(source.schema.names):
                row = pa.table({S.SAMPLE_ID: pa.array([ids[k]], pa.int64()), S.TASK_ID: pa.nulls(1, pa.int32()),
                                S.LABEL: pa.array([values[k]], pa.int32()),
                                self.payload: pa.nulls(1, self._payload_type)})
            else:
                row = source.slice(origin[1], 1).select(columns)
                row = row.set_column(2, row.schema.field(2), pa.array([values[k]], row.schema.field(2).type))
            rows.append(row)
        # rows of files whose payload types differ meet in a type that holds them all; the gate casts it
        return pa.concat_tables(rows, promote_options="permissive") if rows else labels

    def _sidecar_names(self) -> list[str] | None:
        path = self.root / CLASS_NAMES_FILE
        return [line.strip() for line in path.read_text().splitlines()] if path.is_file() else None

    def describe(self) -> StreamInfo:
        tasks = max(len(self.task_ids), 1)
        allowed = set(self.labels) if self.labels is not None else None  # data.labels: the gate refuses the rest
        return StreamInfo(
            name=f"arrow:{self.root.name}", payload=self.payload,
            task_classes=[sorted(c for c in self.task_labels.get(t, ()) if allowed is None or c in allowed)
                          for t in range(tasks)],
            visits=self.visits, visit_batches=[len(s) for s in self.visit_slices],
            test_batches=[len(self.tests.get(t, [])) for t in range(tasks)],
            num_samples=self.num_rows, labels=self.labels, feature_dim=self.feature_dim, late_labels=self.late_labels,
            fingerprint=self.fingerprint(len(self.train_files)),
            extra={"task_ids": self.task_ids, "train_files": [p.name for p in self.train_files],
                   **({"class_names": self.class_names} if self.class_names else {})})

    def fingerprint(self, train_files: int) -> str:
        """A digest of the names and sizes of the first `train_files` train files and of the test files, and of the
        batch size: what a resume checks its checkpoint against."""
        listing = [f"{p.name}:{size}".encode() for p, size in
                   (*((p, self.sizes[p]) for p in self.train_files[:train_files]),
                    *((p, p.stat().st_size) for p in self.test_files))]
        return _fingerprint([np.frombuffer(b"".join(listing), np.uint8), np.array([self.batch_size])])

    def train_batch(self, visit: int, index: int) -> pa.RecordBatch:
        return self._batch(self.visit_slices[visit][index])

    def test_batch(self, task: int, index: int, after_visit: int) -> pa.RecordBatch:
        return self._batch(self.tests[task][index])

    def visit_tasks(self, visit: int) -> list[int]:
        return [self.visits[visit]]

    def _piece(self, split: str, key: int, index: int) -> Slice:
        return self.visit_slices[key][index] if split == "train" else self.tests[key][index]

    def origin(self, split: str, key: int, index: int) -> tuple[str, int]:
        piece = self._piece(split, key, index)
        return str(piece.path.relative_to(self.root)), piece.offset

    def repeated(self, split: str, key: int, index: int) -> list[S.Refusal]:
        """The rows of a training batch whose sample_id an earlier training row already had, refused as `duplicate`:
        the first row with a sample_id holds it, whatever becomes of it (a label file's rows come again by design).
        Test rows are evaluated, never learned: their ids may repeat (each task's test file numbered from 0)."""
        if split != "train":
            return []
        piece = self._piece(split, key, index)
        repeats = self.repeats.get(piece.path, {})
        rows = np.array(sorted(r - piece.offset for r in repeats if piece.offset <= r < piece.offset + piece.length),
                        np.int64)
        if not len(rows):
            return []
        firsts = [repeats[int(r) + piece.offset] for r in rows]
        shown = ", ".join(f"{p.relative_to(self.root)} row {r}" for p, r in firsts[:3])
        ids = S.integers(self._table(piece.path).column(S.SAMPLE_ID), pa.int64())[0]
        return [S.Refusal(S.BatchError(f"sample_id already used by an earlier training row ({shown}"
                                       f"{', ...' if len(firsts) > 3 else ''})", column=S.SAMPLE_ID,
                                       sample_ids=ids[rows + piece.offset].tolist(), reason="duplicate"), rows)]


def _unlabelled_rows(table: pa.Table) -> list[tuple[int, int]]:
    """(sample_id, row) of the rows of a train file whose label is null (a label file may settle them later)."""
    names = table.schema.names
    if S.SAMPLE_ID not in names or S.LABEL not in names:
        return []
    nulls = np.flatnonzero(table.column(S.LABEL).is_null().to_numpy(zero_copy_only=False))
    ids = table.column(S.SAMPLE_ID).to_pylist()
    return [(ids[r], int(r)) for r in nulls if ids[r] is not None]


def _sample_id_column(table: pa.Table) -> pa.ChunkedArray:
    """A table's sample ids (all null where it has none of a kind the gate can cast)."""
    idx = table.schema.get_field_index(S.SAMPLE_ID)
    if idx < 0 or not (pa.types.is_integer(table.schema.field(idx).type)
                       or pa.types.is_floating(table.schema.field(idx).type)):
        return pa.chunked_array([pa.nulls(table.num_rows, pa.int64())])
    return table.column(idx)


def _repeats(files: list[tuple[Path, pa.ChunkedArray]]) -> dict[Path, dict[int, tuple[Path, int]]]:
    """Per file, the rows whose sample_id an earlier row (in file, then row order) already had, each with the file
    and row of the first: the rule that keeps a sample_id learned once (docs/guide.md, "The duplicate rule")."""
    if not files:
        return {}
    values, nulls, bad = zip(*(S.integers(column, pa.int64()) for _, column in files), strict=True)
    where = np.repeat(np.arange(len(files)), [len(v) for v in values])
    rows = np.concatenate([np.arange(len(v)) for v in values])
    valid = np.flatnonzero(~np.concatenate(nulls) & ~np.concatenate(bad))
    _, first, inverse = np.unique(np.concatenate(values)[valid], return_index=True, return_inverse=True)
    out: dict[Path, dict[int, tuple[Path, int]]] = {}
    for k in np.flatnonzero(first[inverse] != np.arange(len(valid))):
        here, there = valid[k], valid[first[inverse[k]]]
        out.setdefault(files[where[here]][0], {})[int(rows[here])] = (files[where[there]][0], int(rows[there]))
    return out


def _labels(table: pa.Table) -> list[int]:
    """The distinct valid labels of a table (none if its label column is missing or not of numbers)."""
    idx = table.schema.get_field_index(S.LABEL)
    if idx < 0 or not (pa.types.is_integer(table.schema.field(idx).type)
                       or pa.types.is_floating(table.schema.field(idx).type)):
        return []
    values, nulls, bad = S.integers(table.column(idx), pa.int32())
    return sorted({int(v) for v in values[~nulls & ~bad] if v >= 0})


def _metadata_names(schema: pa.Schema) -> list[str] | None:
    raw = (schema.metadata or {}).get(CLASS_NAMES_KEY)
    return [str(n) for n in json.loads(raw)] if raw else None


@dataclass(frozen=True)
class DriftSpec:
    """A long-horizon non-stationary feature stream (see DriftStream)."""

    visits: int = 1000  # task visits in the stream (rounds of a task-aware run)
    tasks: int = 20  # distinct tasks; each owns `classes_per_task` classes
    classes_per_task: int = 2  # classes each task owns
    dim: int = 32  # feature width
    train_per_visit: int = 100  # training rows per visit
    test_per_task: int = 50  # test rows per task, drawn where its classes are at test time
    separation: float = 4.0  # std of the initial class means (noise std 1)
    drift_step: float = 0.05  # std of each class mean's random-walk step per visit (gradual drift)
    shifts: int = 5  # abrupt shifts: the current task's classes jump to a new region at evenly spaced visits
    shift_size: float = 12.0  # how far an abrupt shift moves the class means (noise std 1)
    recurrence: float = 0.8  # while tasks remain unseen, chance a visit revisits a seen task
    # real drift: at this many evenly spaced revisits, the revisited task's concept changes: its classes' labels
    # rotate (with two classes, swap) from that visit on, the features staying where they were
    concept_changes: int = 0
    batch_size: int = 100  # rows per batch of a visit
    seed: int = 0  # draws the schedule, the walks and the rows


class DriftStream:
    """Recurring tasks under gradual drift and abrupt shifts, generated deterministically in feature space.

    The visit schedule introduces the tasks one by one (a new one with probability 1 - recurrence) and
    otherwise revisits a seen task. Every class mean follows a Gaussian random walk; at `shifts` evenly
    spaced visits the classes of that visit's task jump by `shift_size` in a random direction. The true
    novel events are the first visit of each task plus each shift: N_T = tasks + shifts. Those are virtual drift
    (new inputs); `concept_changes` adds real drift: at evenly spaced revisits the revisited task's labels rotate
    among its classes (the same inputs now mean another class), for its training and test rows alike from then on.
    """

    def __init__(self, spec: DriftSpec, task_free: bool = False):
        self.spec, self.task_free = spec, task_free
        rng = np.random.default_rng(spec.seed)
        n_classes = spec.tasks * spec.classes_per_task
        self.visits = self._schedule(rng)
        start = rng.normal(scale=spec.separation, size=(n_classes, spec.dim))
        walk = np.cumsum(rng.normal(scale=spec.drift_step, size=(spec.visits, n_classes, spec.dim)), axis=0)
        jumps = np.zeros((spec.visits, n_classes, spec.dim))
        self.shift_visits = [int(v) for v in np.linspace(spec.visits / (spec.shifts + 1), spec.visits,
                                                         spec.shifts, endpoint=False)] if spec.shifts else []
        for v in self.shift_visits:
            direction = rng.normal(size=spec.dim)
            for c in self.classes(self.visits[v]):
                jumps[v:, c] += spec.shift_size * direction / np.linalg.norm(direction)
        self.means = (start[None] + walk + jumps).astype(np.float32)  # (visits, classes, dim)
        revisits = [v for v in range(1, spec.visits) if self.visits[v] in self.visits[:v]]
        n = min(spec.concept_changes, len(revisits))  # the middle revisit of each of n equal stretches
        self.concept_visits = [revisits[int((k + 0.5) * len(revisits) / n)] for k in range(n)]
        for v in self.concept_visits:  # class c's rows from now on come from where c+1's were (within its task)
            classes = self.classes(self.visits[v])
            self.means[v:, classes] = self.means[v:, np.roll(classes, -1)]

    def _schedule(self, rng: np.random.Generator) -> list[int]:
        visits, introduced = [0], 1
        for _ in range(self.spec.visits - 1):
            if introduced < self.spec.tasks and rng.random() >= self.spec.recurrence:
                visits.append(introduced)
                introduced += 1
            else:
                visits.append(int(rng.integers(introduced)))
        return visits

    def novel_visits(self) -> list[int]:
        """The visits that start a novel regime: each task's first visit and each abrupt shift."""
        first = {task: v for v, task in reversed(list(enumerate(self.visits)))}
        return sorted(set(first.values()) | set(self.shift_visits))

    def classes(self, task: int) -> list[int]:
        k = self.spec.classes_per_task
        return list(range(task * k, (task + 1) * k))

    def describe(self) -> StreamInfo:
        s = self.spec
        per_visit = int(np.ceil(s.train_per_visit / s.batch_size))
        return StreamInfo(
            name=f"drift-v{s.visits}-t{s.tasks}-d{s.dim}-s{s.seed}", payload="features",
            task_classes=[self.classes(t) for t in range(s.tasks)], visits=self.visits,
            visit_batches=[per_visit] * s.visits, test_batches=[int(np.ceil(s.test_per_task / s.batch_size))] * s.tasks,
            num_samples=s.visits * s.train_per_visit, labels=list(range(s.tasks * s.classes_per_task)),
            fingerprint=_fingerprint([np.asarray(self.visits), self.means[-1],
                                      *([np.asarray(self.concept_visits)] if self.concept_visits else [])]),
            feature_dim=s.dim,
            novel_shifts=len(self.novel_visits()),
            extra={"shift_visits": self.shift_visits, "concept_visits": self.concept_visits})

    def _draw(self, visit: int, task: int, n: int, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.spec.seed, *key])
        classes = np.array(self.classes(task))
        labels = classes[rng.integers(len(classes), size=n)]
        return self.means[visit, labels] + rng.normal(size=(n, self.spec.dim)).astype(np.float32), labels

    def batch_rows(self, index: int) -> int:
        """Rows in batch `index` of a visit."""
        return min(self.spec.batch_size, self.spec.train_per_visit - index * self.spec.batch_size)

    def train_batch(self, visit: int, index: int) -> pa.RecordBatch:
        s = self.spec
        start = index * s.batch_size
        n = self.batch_rows(index)
        x, y = self._draw(visit, self.visits[visit], n, (0, visit, index))
        ids = visit * s.train_per_visit + start + np.arange(n)
        tasks = None if self.task_free else np.full(n, self.visits[visit])
        return S.feature_batch(ids, x, y, tasks, stream="drift")

    def test_batch(self, task: int, index: int, after_visit: int) -> pa.RecordBatch:
        """Test rows of `task` drawn from the class means as they stand after `after_visit`."""
        s = self.spec
        n = min(s.batch_size, s.test_per_task - index * s.batch_size)
        x, y = self._draw(after_visit, task, n, (1, task, index))
        return S.feature_batch(index * s.batch_size + np.arange(n), x, y, np.full(n, task), stream="drift")

    def visit_tasks(self, visit: int) -> list[int]:
        return [self.visits[visit]]

    def origin(self, split: str, key: int, index: int) -> tuple[str, int]:
        return f"drift {split}", index * self.spec.batch_size

    def repeated(self, split: str, key: int, index: int) -> list[S.Refusal]:
        return []


@dataclass(frozen=True)
class SourceSpec:
    """Which stream a run reads."""

    # a memcl_ops.data.datasets name, image-folder:<path>, synthetic, drift, arrow:<folder>
    dataset: str = "fashion-mnist"
    synthetic: SyntheticSpec = SyntheticSpec()  # dataset == "synthetic"
    drift: DriftSpec = DriftSpec()  # dataset == "drift"
    payload: Literal["image", "text", "features"] = "features"  # arrow:<folder>: what the batches carry
    labels: tuple[int, ...] | None = None  # arrow:<folder>: the label set to accept (None: any label >= 0)
    feature_dim: int | None = None  # arrow:<folder> with features: the width to accept
    image_size: int | None = None  # image-folder:<path>: resize every image to this square (mixed sizes need it)


def build_stream(source: SourceSpec, stream: StreamSpec) -> Stream:
    if source.dataset == "drift":
        return DriftStream(source.drift, stream.task_free)
    if source.dataset.startswith("arrow:"):
        return ArrowDirStream(source.dataset.split(":", 1)[1], source.payload,
                              list(source.labels) if source.labels is not None else None, source.feature_dim,
                              stream.batch_size)
    dataset = (make_synthetic(source.synthetic) if source.dataset == "synthetic"
               else load_dataset(source.dataset, source.image_size))
    return DatasetStream(dataset, stream)


def check_source(source: SourceSpec, stream: StreamSpec) -> None:
    """What can be checked about a run's data without loading it (so a bad config is refused before any actor
    starts): the dataset name, that its files or packages are here, the folder layout of own data, and that the
    classes split into the asked-for tasks. Raises ValueError (DatasetUnavailable when something is not installed)
    naming the config key."""
    name = source.dataset
    kind, _, path = name.partition(":")
    if name == "drift":
        return
    if name == "synthetic":
        _check_split(source.synthetic.classes, stream, name)
    elif kind == "arrow":
        if not Path(path).is_dir():
            raise ValueError(f"data.dataset: {path}: no such folder (an arrow:<folder> stream needs <folder>/train/, "
                             "optional <folder>/test/)")
        files = data_files(Path(path) / "train")
        if stream.follow and not (Path(path) / "train").is_dir():
            raise ValueError(f"data.dataset: {path}/train/: no such folder (stream.follow takes the files renamed into "
                             "it: create it before the run starts)")
        if not files and not stream.follow:  # a followed folder may start empty
            raise ValueError(f"data.dataset: {path}/train/ holds no {', '.join(ARROW_SUFFIXES)} files "
                             "(an arrow:<folder> stream needs <folder>/train/, optional <folder>/test/; "
                             "stream.follow=true waits for files to land)")
        if source.payload == "features" and source.feature_dim is None:
            raise ValueError(f"data.feature_dim: {name} carries features (data.payload=features); set the width "
                             "the learner accepts, or data.payload=image / text for raw rows")
        _check_first_files(files, source, Path(path))
    elif kind == "image-folder":
        if not Path(path).is_dir():
            raise ValueError(f"data.dataset: {path}: no such folder (an image-folder:<folder> stream needs "
                             "train/<class>/ and test/<class>/ sub-folders)")
        if not all((Path(path) / split).is_dir() for split in ("train", "test")):
            raise ValueError(f"data.dataset: {path} must contain train/<class>/ and test/<class>/ sub-folders")
    elif name in DATASETS:
        missing = missing_parts(DATASETS[name])
        if missing:
            raise DatasetUnavailable(f"data.dataset: {name} needs {missing[0]}, which is not on this machine "
                                     "(scripts/setup.sh installs every built-in dataset)")
        _check_split(DATASETS[name].num_classes, stream, name)
    else:
        raise ValueError(f"data.dataset: unknown dataset {name!r}; accepted: {', '.join(DATASETS)}, synthetic, "
                         "drift, arrow:<folder>, image-folder:<folder>")


def _first_rows(path: Path) -> pa.Table:
    """The first rows of a Parquet or Arrow IPC file (its first row group or record batch), as cheaply as it reads."""
    if path.suffix == ".parquet":
        parquet = pq.ParquetFile(path)
        return parquet.read_row_group(0) if parquet.num_row_groups else parquet.schema_arrow.empty_table()
    try:
        reader = pa.ipc.open_file(path)
        return pa.Table.from_batches([reader.get_batch(0)] if reader.num_record_batches else [], reader.schema)
    except pa.ArrowInvalid:
        with pa.ipc.open_stream(path) as stream:
            return pa.Table.from_batches([stream.read_next_batch()])


def _feature_width(table: pa.Table, dim: int) -> int | None:
    """The commonest width of a table's features when none of its rows has `dim` values (None: one has, or the column
    holds no lists of numbers to tell)."""
    column = table.column(S.FEATURES)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            or pa.types.is_fixed_size_list(column.type)):
        return None
    widths = pc.drop_null(pc.list_value_length(column)).to_numpy(zero_copy_only=False)
    return int(np.bincount(widths).argmax()) if len(widths) and not (widths == dim).any() else None


PREFLIGHT_FILES = 8  # the data files `check_source` reads the first rows of, at most


def _check_first_files(files: list[Path], source: SourceSpec, root: Path) -> None:
    """The folder's first data files against data.payload and data.feature_dim: when none of them carries the payload
    but one carries another, or none has a feature row of the configured width, the config is wrong (every row would
    be refused), and one line says what to set. Unreadable files, label files and empty ones tell nothing and are
    passed over; rows that break the contract in other ways are the gate's to refuse, row by row."""
    other: tuple[Path, str] | None = None  # the first file carrying another payload, and that payload
    wide: tuple[Path, int] | None = None  # the first file whose features all have another width, and the commonest
    read = 0
    for path in files:
        try:
            table = _first_rows(path)
        except (pa.ArrowException, OSError, StopIteration):
            continue
        names, where = table.schema.names, path.relative_to(root)
        carried = [c for c in ("image", "text", "features") if c in names]
        if not len(table) or (not carried and {S.SAMPLE_ID, S.LABEL} <= set(names)):
            continue  # an empty file, or a label file
        read += 1
        if source.payload not in names:
            other = other or ((where, carried[0]) if carried else None)
        elif source.payload != "features" or (width := _feature_width(table, source.feature_dim)) is None:
            return
        else:
            wide = wide or (where, width)
        if read == PREFLIGHT_FILES:
            break
    if wide is not None:
        raise ValueError(f"data.feature_dim: {source.feature_dim}, but the features of {wide[0]} have {wide[1]} "
                         f"values: set data.feature_dim={wide[1]}")
    if other is not None:
        raise ValueError(f"data.payload: {source.payload}, but {other[0]} has no {source.payload} column; it carries "
                         f"{other[1]}: set data.payload={other[1]}")


def _check_split(num_classes: int, stream: StreamSpec, name: str) -> None:
    try:
        task_classes(num_classes, stream)
    except ValueError as err:
        raise ValueError(f"stream.tasks: {name}: {err}") from None
