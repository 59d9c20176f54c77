"""Hypothesis strategies for malformed Arrow batches (shared by the gate and the pipeline property tests)."""

import numpy as np
import pyarrow as pa
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
