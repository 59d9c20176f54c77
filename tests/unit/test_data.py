"""Real offline datasets, stream plans and the feature cache."""

import numpy as np
import pytest

from memcl_ops.data import datasets as D
from memcl_ops.data.feature_cache import FeatureCache
from memcl_ops.data.streams import StreamSpec, make_plan, task_classes


@pytest.mark.parametrize("name, payload, classes, shape", [
    ("fashion-mnist", "image", 10, (28, 28)), ("mnist", "image", 10, (28, 28)), ("digits", "image", 10, (28, 28)),
    ("bbc-news", "text", 5, None)])
def test_real_datasets_load_offline(name, payload, classes, shape):
    ds = D.load_dataset(name)
    assert ds.payload == payload and ds.num_classes == classes and ds.image_shape == shape
    assert set(np.unique(ds.train_y)) == set(range(classes)) == set(np.unique(ds.test_y))
    assert len(ds.train_x) == len(ds.train_y) > len(ds.test_y) > 0
    if payload == "image":
        assert ds.train_x.dtype == np.uint8 and ds.train_x.shape[1:] == shape and ds.train_x.max() > 200
    else:
        assert all(isinstance(t, str) and len(t) > 50 for t in ds.train_x[:20])


def test_fashion_mnist_is_the_official_split():
    ds = D.load_fashion_mnist()
    assert ds.train_x.shape == (60000, 28, 28) and ds.test_x.shape == (10000, 28, 28)
    assert np.bincount(ds.test_y).tolist() == [1000] * 10


def test_missing_files_name_the_package(tmp_path):
    with pytest.raises(D.DatasetUnavailable, match="apt-get install -y dataset-fashion-mnist"):
        D.load_fashion_mnist(tmp_path)
    with pytest.raises(ValueError, match="unknown dataset"):
        D.load_dataset("imagenet-22k")


def test_concatenated_datasets_keep_their_own_classes():
    ds = D.load_dataset("digits-mnist-fmnist")
    assert ds.num_classes == 30 and ds.class_names[0] == "digits/0" and ds.class_names[-1].startswith("fashion")
    digits = D.load_digits()
    np.testing.assert_array_equal(ds.train_y[: len(digits.train_y)], digits.train_y)
    assert ds.train_y.max() == 29


def test_class_order_is_seeded_and_split_in_tasks():
    spec = StreamSpec(tasks=5)
    a, b = task_classes(10, spec), task_classes(10, spec)
    assert a == b and sorted(c for t in a for c in t) == list(range(10)) and all(len(t) == 2 for t in a)
    assert a != task_classes(10, StreamSpec(tasks=5, class_order_seed=7))
    assert task_classes(5, StreamSpec(tasks=4, first_task_classes=2, shuffle_classes=False)) == [[0, 1], [2], [3], [4]]
    with pytest.raises(ValueError, match="do not split evenly"):
        task_classes(10, StreamSpec(tasks=3))


def test_plan_streams_every_row_once_per_visit_with_increasing_ids():
    rng = np.random.default_rng(0)
    train, test = rng.integers(0, 6, 600), rng.integers(0, 6, 300)
    plan = make_plan(train, test, 6, StreamSpec(tasks=3, batch_size=32, train_per_class=50, visits=(0, 1, 2, 0)))
    batches = list(plan.all_batches())
    ids = np.concatenate([b.sample_ids for b in batches])
    np.testing.assert_array_equal(ids, np.arange(plan.num_samples))
    assert plan.num_samples == 4 * 100
    for v, task in enumerate(plan.visits):
        rows = np.concatenate([b.rows for b in batches if b.visit == v])
        assert sorted(rows.tolist()) == sorted(plan.train_rows[task].tolist())
        assert set(train[rows]) == set(plan.classes[task])


def test_drift_blends_boundaries_but_keeps_rows_and_true_tasks():
    rng = np.random.default_rng(1)
    train, test = rng.integers(0, 4, 800), rng.integers(0, 4, 100)
    plan = make_plan(train, test, 4, StreamSpec(tasks=2, drift=0.5, batch_size=50))
    first, second = plan.visit_tasks
    assert (first == 1).any() and (second == 0).any()  # rows crossed the boundary
    assert (first[: len(first) // 2] == 0).all()  # but only in the blended tail
    all_rows = np.concatenate(plan.visit_rows)
    assert sorted(all_rows.tolist()) == sorted(np.concatenate(plan.train_rows).tolist())
    for rows, tasks in zip(plan.visit_rows, plan.visit_tasks):
        for r, t in zip(rows, tasks):
            assert train[r] in plan.classes[t]


def test_feature_cache_merges_and_reuses(tmp_path):
    cache = FeatureCache(tmp_path)
    key = FeatureCache.key("enc@64px", "f0", "ds", "train")
    assert key != FeatureCache.key("enc@32px", "f0", "ds", "train") != FeatureCache.key("enc@64px", "f1", "ds", "train")
    feats, missing = cache.lookup(key, np.array([3, 1]))
    assert feats is None and missing.tolist() == [1, 3]
    cache.add(key, np.array([3, 1]), np.array([[3.0, 3.0], [1.0, 1.0]], np.float32))
    feats, missing = cache.lookup(key, np.array([1, 3, 1]))
    assert missing.size == 0 and feats[:, 0].tolist() == [1.0, 3.0, 1.0]
    _, missing = cache.lookup(key, np.array([1, 7]))
    assert missing.tolist() == [7]
    cache.add(key, np.array([7]), np.array([[7.0, 7.0]], np.float32))
    feats, _ = cache.lookup(key, np.array([7, 3]))
    assert feats[:, 1].tolist() == [7.0, 3.0]
    assert not list(tmp_path.glob("*.tmp*"))  # writes are atomic: no temp files left
