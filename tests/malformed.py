"""Malformed input: hypothesis strategies for malformed Arrow batches (shared by the gate and the pipeline property
tests), and a user's folder that mixes every fault of a row or a file with good rows (`mixed_folder`)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from memcl_ops.arrow import schema as S

DIM = 4
LABELS = (0, 1, 2, 3)
MUTATIONS = ("none", "none", "none", "drop_label", "wrong_dim", "float_labels", "int32_ids", "null_ids",
             "double_features", "no_sample_id", "empty", "oversized")


@st.composite
def feature_batches(draw, first_id: int, max_rows: int = 12, task: int | None = 0):
    """One batch of features with `first_id` as its first sample id, possibly broken in one of MUTATIONS
    and possibly with NaN/Inf values, negative, unknown or missing labels."""
    mutation = draw(st.sampled_from(MUTATIONS))
    n = 0 if mutation == "empty" else (max_rows + 3 if mutation == "oversized" else draw(st.integers(1, max_rows)))
    dim = DIM + 1 if mutation == "wrong_dim" else DIM
    values = draw(st.lists(st.one_of(st.floats(-5, 5, width=32), st.sampled_from([np.nan, np.inf, -np.inf])),
                           min_size=n * dim, max_size=n * dim))
    labels = draw(st.lists(st.one_of(st.sampled_from(LABELS), st.integers(-3, 9), st.none()), min_size=n, max_size=n))
    feats = np.array(values, dtype=np.float32).reshape(n, dim)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    columns = {
        S.SAMPLE_ID: pa.array(ids, pa.int32() if mutation == "int32_ids" else pa.int64()),
        S.TASK_ID: pa.array([task] * n, pa.int32()),
        S.LABEL: pa.array(labels, pa.float64() if mutation == "float_labels" else pa.int32()),
        S.FEATURES: pa.FixedSizeListArray.from_arrays(
            pa.array(feats.ravel(), pa.float64() if mutation == "double_features" else pa.float32()), dim),
    }
    if mutation == "null_ids" and n:
        columns[S.SAMPLE_ID] = pa.array([None, *ids[1:].tolist()], pa.int64())
    if mutation == "drop_label":
        del columns[S.LABEL]
    if mutation == "no_sample_id":
        del columns[S.SAMPLE_ID]
    return pa.RecordBatch.from_pydict(columns)


# One of each fault a user's folder of 16-d features may hold, as (how to break a good row, the reason it is refused)
ROW_FAULTS = {
    "huge": (lambda row: {**row, S.FEATURES: [v * 1e8 for v in row[S.FEATURES]]}, "magnitude"),
    "astronomic": (lambda row: {**row, S.FEATURES: [1e+30, *row[S.FEATURES][1:]]}, "magnitude"),
    "nan": (lambda row: {**row, S.FEATURES: [float("nan"), *row[S.FEATURES][1:]]}, "non_finite"),
    "inf": (lambda row: {**row, S.FEATURES: [*row[S.FEATURES][:-1], float("-inf")]}, "non_finite"),
    "null_id": (lambda row: {**row, S.SAMPLE_ID: None}, "null"),
    "short": (lambda row: {**row, S.FEATURES: row[S.FEATURES][:-1]}, "feature_dim"),
    "long": (lambda row: {**row, S.FEATURES: row[S.FEATURES] + [0.0]}, "feature_dim"),
}


def mixed_folder(root, *, broken: bool, dim: int = 16, rows: int = 40, seed: int = 0) -> list[tuple]:
    """A user's `arrow:` folder of two tasks of 16-d features (Parquet, a variable-size list column as pandas writes
    it). With `broken`, every fault of ROW_FAULTS sits between good rows of each task's train file, task 1's file
    also repeats five of task 0's sample ids with other labels, a truncated Parquet file and a file of garbage bytes
    lie among them, and a test file holds a NaN row; without, the same folder minus all of that.
    Returns the (split, file, row, reason) each broken row must be refused with."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=0.5, size=(4, dim))  # classes that overlap: accuracy that a wrong row would move
    expected: list[tuple] = []

    def good_rows(task: int, n: int, first_id: int) -> list[dict]:
        labels = rng.choice([2 * task, 2 * task + 1], n)
        feats = (means[labels] + rng.normal(size=(n, dim))).astype(np.float32)  # float32 values: casts are exact
        return [{S.SAMPLE_ID: first_id + i, S.TASK_ID: task, S.LABEL: int(y), S.FEATURES: x.astype(float).tolist()}
                for i, (x, y) in enumerate(zip(feats, labels, strict=True))]

    def write(split: str, name: str, rows_: list[dict], faults: list[tuple[int, dict, str]]) -> None:
        out = list(rows_)
        if broken:
            for at, row, reason in sorted(faults, key=lambda f: f[0]):
                out.insert(at, row)
                expected.append((split, f"{split}/{name}", at, reason))
        (root / split).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({S.SAMPLE_ID: pa.array([r[S.SAMPLE_ID] for r in out], pa.int64()),
                                 S.TASK_ID: pa.array([r[S.TASK_ID] for r in out], pa.int32()),
                                 S.LABEL: pa.array([r[S.LABEL] for r in out], pa.int32()),
                                 S.FEATURES: pa.array([r[S.FEATURES] for r in out], pa.list_(pa.float64()))}),
                       root / split / name)

    train0, train1 = good_rows(0, rows, 0), good_rows(1, rows, 1000)
    spare = good_rows(0, len(ROW_FAULTS), 500) + good_rows(1, len(ROW_FAULTS), 1500)
    faults0 = [(3 + 4 * k, make(spare[k]), reason) for k, (make, reason) in enumerate(ROW_FAULTS.values())]
    faults1 = [(2 + 5 * k, make(spare[len(ROW_FAULTS) + k]), reason)
               for k, (make, reason) in enumerate(ROW_FAULTS.values())]
    repeats = [(40 + k, {**train0[k * 7], S.TASK_ID: 1, S.LABEL: 2 + k % 2}, "duplicate") for k in range(5)]
    write("train", "0-task0.parquet", train0, faults0)
    write("train", "2-task1.parquet", train1, faults1 + repeats)
    write("test", "task0.parquet", good_rows(0, rows // 2, 0),
          [(1, {**good_rows(0, 1, 900)[0], S.FEATURES: [float("nan")] * dim}, "non_finite")])
    write("test", "task1.parquet", good_rows(1, rows // 2, 1000), [])
    if broken:
        whole = (root / "train" / "0-task0.parquet").read_bytes()
        (root / "train" / "1-truncated.parquet").write_bytes(whole[:len(whole) // 2])
        (root / "train" / "3-garbage.arrow").write_bytes(np.random.default_rng(seed).bytes(700))
        expected += [("train", "train/1-truncated.parquet", 0, "unreadable"),
                     ("train", "train/3-garbage.arrow", 0, "unreadable")]
    return sorted(expected)
