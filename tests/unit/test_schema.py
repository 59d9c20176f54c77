import numpy as np
import pyarrow as pa
import pytest
import torch

from memcl_ops.arrow import schema as S


def _batch(n=6, d=4, labels=None, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.arange(100, 100 + n)
    labels = np.arange(n) % 3 if labels is None else labels
    return S.feature_batch(ids, rng.normal(size=(n, d)), labels, np.zeros(n, int), stream="s", encoder="e")


def test_feature_batch_roundtrip_and_metadata():
    b = _batch()
    assert b.schema.field(S.FEATURES).type == pa.list_(pa.float32(), 4)
    info = S.schema_info(b.schema)
    assert info == {"stream": "s", "encoder": "e", "feature_dim": 4}
    feats = S.features_to_numpy(b)
    assert feats.shape == (6, 4) and feats.dtype == np.float32
    np.testing.assert_array_equal(S.labels_to_numpy(b), np.arange(6) % 3)
    S.validate(b, feature_dim=4, known_labels=frozenset({0, 1, 2}))


def test_numpy_view_is_zero_copy_and_torch_copies_only_when_asked():
    b = _batch()
    view = S.features_to_numpy(b)
    assert not view.flags.writeable  # Arrow buffers are immutable
    shared = S.features_to_torch(b)
    assert shared.data_ptr() == view.ctypes.data
    own = S.features_to_torch(b, writable=True)
    assert own.data_ptr() != view.ctypes.data
    own.add_(1.0)
    np.testing.assert_allclose(S.features_to_numpy(b) + 1.0, own.numpy())


def test_slice_offset_is_honoured():
    b = _batch(8)
    sliced = b.slice(3, 4)
    np.testing.assert_array_equal(S.features_to_numpy(sliced), S.features_to_numpy(b)[3:7])
    assert isinstance(S.features_to_torch(sliced), torch.Tensor)


def test_nan_rows_are_named_by_sample_id():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(5, 3))
    feats[1, 2] = np.nan
    feats[4, 0] = np.inf
    b = S.feature_batch(np.arange(10, 15), feats, np.zeros(5, int))
    with pytest.raises(S.BatchError) as err:
        S.validate(b, feature_dim=3)
    assert err.value.column == S.FEATURES and err.value.sample_ids == [11, 14]
    assert "NaN/Inf" in str(err.value) and "11" in str(err.value)


@pytest.mark.parametrize("labels, reason, bad", [
    (np.array([0, -1, 2, 1]), "negative_label", [1]),
    (np.array([0, 7, 2, 9]), "unknown_label", [1, 3]),
])
def test_bad_labels(labels, reason, bad):
    b = S.feature_batch(np.arange(4), np.ones((4, 2)), labels)
    with pytest.raises(S.BatchError) as err:
        S.validate(b, feature_dim=2, known_labels=frozenset({0, 1, 2}))
    assert err.value.reason == reason and err.value.column == S.LABEL
    assert err.value.sample_ids == bad


def test_wrong_dim_wrong_type_missing_column_empty_oversized():
    b = _batch(d=4)
    with pytest.raises(S.BatchError, match="feature dim 4 != expected 8"):
        S.validate(b, feature_dim=8)
    wrong = b.set_column(0, pa.field(S.SAMPLE_ID, pa.int32()), pa.array(np.arange(6), pa.int32()))
    with pytest.raises(S.BatchError, match="wrong type int32") as err:
        S.validate(wrong)
    assert err.value.column == S.SAMPLE_ID
    missing = b.drop_columns([S.LABEL])
    with pytest.raises(S.BatchError, match="missing column") as err:
        S.validate(missing)
    assert err.value.column == S.LABEL
    with pytest.raises(S.BatchError, match="empty"):
        S.validate(b.slice(0, 0))
    with pytest.raises(S.BatchError, match="exceed") as err:
        S.validate(b, max_rows=5)
    assert err.value.sample_ids == list(range(100, 106))
    as_doubles = pa.RecordBatch.from_arrays(
        [b.column(0), b.column(1), b.column(2),
         pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(24)), 4)],
        names=[S.SAMPLE_ID, S.TASK_ID, S.LABEL, S.FEATURES])
    with pytest.raises(S.BatchError, match="fixed_size_list<float32"):
        S.validate(as_doubles, feature_dim=4)


def test_partition_keeps_every_row_exactly_once():
    rng = np.random.default_rng(1)
    feats = rng.normal(size=(8, 3))
    feats[2, 0] = np.nan
    labels = np.array([0, 1, -3, 5, 1, 0, 1, 0])  # row 2 is both NaN and negative: refused once
    b = S.feature_batch(np.arange(8), feats, labels)
    good, refused = S.partition(b, S.Contract(feature_dim=3, known_labels=frozenset({0, 1})))
    refused_ids = sorted(i for r in refused for i in S.sample_ids_to_numpy(b.take(pa.array(r.rows))).tolist())
    kept = S.sample_ids_to_numpy(good).tolist()
    assert refused_ids == [2, 3] and sorted(kept + refused_ids) == list(range(8))
    assert {r.error.reason for r in refused} == {"non_finite", "unknown_label"}


def test_raw_batches_for_each_payload():
    imgs = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    b = S.raw_batch(np.arange(2), S.IMAGE, imgs, np.array([0, 1]), image_shape=(4, 4))
    assert S.schema_info(b.schema)["image_shape"] == [4, 4]
    np.testing.assert_array_equal(S.column_matrix(b, S.IMAGE).reshape(2, 4, 4), imgs)
    t = S.raw_batch(np.arange(2), S.TEXT, ["a", "b"])
    S.validate(t, payload=S.TEXT)
    with pytest.raises(S.BatchError, match="missing payload column"):
        S.validate(t, payload=S.IMAGE)
