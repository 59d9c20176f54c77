"""The boundary gate never crashes and never drops a row silently."""

import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcl_ops.arrow import schema as S
from memcl_ops.arrow.gate import DEAD_LETTER_SCHEMA, gate
from tests.malformed import DIM, LABELS, feature_batches

CONTRACT = S.Contract(feature_dim=DIM, known_labels=frozenset(LABELS), max_rows=12, require_labels=True)


@settings(max_examples=150, deadline=None)
@given(feature_batches(first_id=1000))
def test_every_row_is_kept_or_dead_lettered_once(batch):
    good, dead = gate(batch, CONTRACT)
    assert dead.schema == DEAD_LETTER_SCHEMA
    kept = 0 if good is None else good.num_rows
    assert kept + dead.num_rows == batch.num_rows
    assert sorted(dead.column("position").to_pylist()) == sorted(set(dead.column("position").to_pylist()))
    if good is not None:
        S.validate(good, CONTRACT)  # what passes satisfies the contract
        refused = set(dead.column(S.SAMPLE_ID).to_pylist())
        assert not refused & set(S.sample_ids_to_numpy(good).tolist())
    for position, row in zip(dead.column("position").to_pylist(), dead.column("row").to_pylist()):
        original = pa.ipc.open_stream(row).read_all()  # the refused row, exactly as it came (repr: NaN == NaN)
        assert original.schema == batch.schema
        assert repr(original.to_pylist()) == repr(batch.slice(position, 1).to_pylist())


def test_reasons_and_messages_name_the_problem():
    feats = np.zeros((4, DIM), np.float32)
    feats[1, 0] = np.nan
    batch = S.feature_batch(np.arange(10, 14), feats, np.array([0, 1, 7, -1]))
    good, dead = gate(batch, CONTRACT)
    assert S.sample_ids_to_numpy(good).tolist() == [10]
    reasons = dict(zip(dead.column(S.SAMPLE_ID).to_pylist(), dead.column("reason").to_pylist()))
    assert reasons == {11: "non_finite", 12: "unknown_label", 13: "negative_label"}
    message = dead.column("message").to_pylist()[0]
    assert "NaN/Inf" in message and "11" in message


def test_undecodable_images_and_texts():
    imgs = np.zeros((3, 4, 4), np.uint8)
    batch = S.raw_batch(np.arange(3), S.IMAGE, imgs, np.zeros(3, int), image_shape=(4, 4))
    batch = batch.replace_schema_metadata({b"image_shape": b"[4, 5]"})  # the metadata lies about the size
    good, dead = gate(batch, S.Contract(payload=S.IMAGE))
    assert good is None and set(dead.column("reason").to_pylist()) == {"undecodable"}
    texts = pa.array([b"fine", b"\xff\xfe broken", None], pa.binary())
    batch = pa.RecordBatch.from_pydict({S.SAMPLE_ID: pa.array([5, 6, 7], pa.int64()),
                                        S.TASK_ID: pa.nulls(3, pa.int32()), S.LABEL: pa.array([0, 0, 0], pa.int32()),
                                        S.TEXT: texts})
    good, dead = gate(batch, S.Contract(payload=S.TEXT))
    assert S.sample_ids_to_numpy(good).tolist() == [5]
    assert sorted(dead.column(S.SAMPLE_ID).to_pylist()) == [6, 7]


@pytest.mark.parametrize("n", [0])
def test_empty_batch_has_nothing_to_lose(n):
    batch = S.feature_batch(np.arange(n), np.zeros((n, DIM)), np.zeros(n, int))
    good, dead = gate(batch, CONTRACT)
    assert good is None and dead.num_rows == 0


@given(st.data())
@settings(max_examples=30, deadline=None)
def test_validate_raises_batch_error_or_nothing(data):
    batch = data.draw(feature_batches(first_id=0))
    try:
        S.validate(batch, CONTRACT)
    except S.BatchError as err:
        assert err.reason and str(err).startswith(f"[{err.reason}]")


def test_each_row_is_judged_on_its_own():
    """A file's types that differ from the contract's are cast row by row: only the rows that cannot be cast, or
    that break the contract themselves, are refused, each for its own reason; the rest pass in the contract's
    types."""
    batch = pa.RecordBatch.from_pydict({
        S.SAMPLE_ID: pa.array([1, None, 3, 4, 5, 6, 7, 8, 9], pa.int64()),
        S.TASK_ID: pa.array([0] * 9, pa.int64()),
        S.LABEL: pa.array([0, 1, 0, 1.5, 1, 0, 1, 2, 3], pa.float64()),
        S.FEATURES: pa.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4], [1, None, 3, 4], [1, 2, 3, 4, 5],
                              [np.nan, 0, 0, 0], [5, 6, 7, 8], [0.5, 0, 0, 0]], pa.list_(pa.float64()))})
    good, dead = gate(batch, CONTRACT)
    assert good.schema.field(S.FEATURES).type == pa.list_(pa.float32(), DIM)
    assert good.schema.field(S.LABEL).type == good.schema.field(S.TASK_ID).type == pa.int32()
    assert S.sample_ids_to_numpy(good).tolist() == [1, 8, 9]
    np.testing.assert_array_equal(S.features_to_numpy(good), [[1, 2, 3, 4], [5, 6, 7, 8], [0.5, 0, 0, 0]])
    reasons = dict(zip(dead.column("position").to_pylist(), dead.column("reason").to_pylist()))
    assert reasons == {1: "null", 2: "feature_dim", 3: "schema", 4: "null", 5: "feature_dim", 6: "non_finite"}
    messages = dict(zip(dead.column("position").to_pylist(), dead.column("message").to_pylist()))
    assert "rows of [3, 5] values, expected 4" in messages[2] and "[1.5] are not int32" in messages[3]
    assert messages[3].endswith("sample_ids=[4]")


def test_null_rows_do_not_hide_the_non_finite_ones_beside_them():
    feats = pa.FixedSizeListArray.from_arrays(pa.array(np.r_[np.ones(4), np.full(4, np.nan), np.ones(4)],
                                                       pa.float32()), DIM, mask=pa.array([False, False, True]))
    batch = pa.RecordBatch.from_pydict({S.SAMPLE_ID: pa.array([0, 1, 2], pa.int64()),
                                        S.TASK_ID: pa.nulls(3, pa.int32()), S.LABEL: pa.array([0, 1, 2], pa.int32()),
                                        S.FEATURES: feats})
    good, dead = gate(batch, CONTRACT)
    assert S.sample_ids_to_numpy(good).tolist() == [0]
    assert dict(zip(dead.column(S.SAMPLE_ID).to_pylist(), dead.column("reason").to_pylist())) == {
        1: "non_finite", 2: "null"}


def test_features_beyond_the_bound_are_refused_naming_it():
    feats = np.ones((4, DIM), np.float32)
    feats[1, 2], feats[2, 0], feats[3, 3] = 1e8, -1e30, S.FEATURE_BOUND  # the bound itself is taken
    good, dead = gate(S.feature_batch(np.arange(4), feats, np.zeros(4, int)), CONTRACT)
    assert S.sample_ids_to_numpy(good).tolist() == [0, 3]
    assert dead.column("reason").to_pylist() == ["magnitude"] * 2
    assert "magnitude 1e+30 is beyond the bound 1024" in dead.column("message")[0].as_py()
    bound = S.FeatureBound(max_abs=10.0, max_l1=4.5 * DIM, why="a test's")
    rows = np.array([[9.0] * DIM, [4.0] * DIM, [11.0] + [0.0] * (DIM - 1)], np.float32)
    good, dead = gate(S.feature_batch(np.arange(3), rows, np.zeros(3, int)),
                      S.Contract(feature_dim=DIM, feature_bound=bound))
    assert S.sample_ids_to_numpy(good).tolist() == [1]
    assert dead.column(S.SAMPLE_ID).to_pylist() == [2, 0]
    assert "L1 norm 36 is beyond the bound 18 (a test's)" in dead.column("message")[1].as_py()
    assert gate(S.feature_batch(np.arange(4), feats, np.zeros(4, int)),
                S.Contract(feature_dim=DIM, feature_bound=None))[0].num_rows == 4  # no bound: any finite value


def test_every_refusal_reason_is_in_the_guide():
    """docs/guide.md's table of reasons (its first column) names every reason the gate gives."""
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text()
    table = guide.split("| reason |", 1)[1].split("\n\n", 1)[0]
    documented = {name for line in table.splitlines() for name in re.findall(r"`(\w+)`", line.split(" | ")[0])}
    assert set(S.REASONS) <= documented, set(S.REASONS) - documented
