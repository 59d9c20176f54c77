"""Stream kinds: the drift generator and the user's Arrow folder."""

import numpy as np
import pyarrow as pa
import pytest

from memcl_ops.arrow import schema as S
from memcl_ops.arrow.gate import gate
from memcl_ops.data.sources import ArrowDirStream, DriftSpec, DriftStream


def test_drift_schedule_recurs_and_counts_novel_events():
    spec = DriftSpec(visits=300, tasks=10, shifts=4, seed=3)
    stream = DriftStream(spec)
    info = stream.describe()
    assert info.visits[0] == 0 and len(info.visits) == 300
    first = [info.visits.index(t) for t in sorted(set(info.visits))]
    assert first == sorted(first)  # tasks are introduced in order
    assert len(set(info.visits)) == 10 and len(info.visits) - len(set(info.visits)) > 200  # mostly recurrences
    assert info.novel_shifts == 10 + 4 and len(stream.shift_visits) == 4
    again = DriftStream(spec)
    np.testing.assert_array_equal(S.features_to_numpy(again.train_batch(7, 0)),
                                  S.features_to_numpy(stream.train_batch(7, 0)))


def test_drift_moves_means_gradually_and_shifts_abruptly():
    spec = DriftSpec(visits=200, tasks=4, shifts=1, drift_step=0.05, shift_size=12.0, seed=1)
    stream = DriftStream(spec)
    shift = stream.shift_visits[0]
    moved = np.linalg.norm(stream.means[1:] - stream.means[:-1], axis=2)  # (visits-1, classes)
    shifted = stream.classes(stream.visits[shift])
    assert np.all(moved[shift - 1, shifted] > 10)  # the shift: a jump of ~shift_size
    calm = np.delete(moved, shift - 1, axis=0)
    assert calm.max() < 1.5 and calm.mean() == pytest.approx(0.05 * np.sqrt(spec.dim), rel=0.2)


def test_drift_task_free_hides_task_ids_and_labels_match_the_visit():
    stream = DriftStream(DriftSpec(visits=20, tasks=3), task_free=True)
    batch = stream.train_batch(5, 0)
    assert batch.column(S.TASK_ID).null_count == batch.num_rows
    assert set(S.labels_to_numpy(batch)) <= set(stream.classes(stream.visits[5]))


def test_real_drift_swaps_a_returning_tasks_labels_from_its_change_on():
    """At each concept change the revisited task's two classes trade places: rows labelled a now lie where b's
    were, in training and test alike, from that visit on; before it, nothing differs from the same stream without."""
    spec = DriftSpec(visits=40, tasks=4, recurrence=0.6, drift_step=0.0, shifts=0, concept_changes=2,
                     train_per_visit=400, test_per_task=400, batch_size=400, seed=2)
    stream, plain = DriftStream(spec), DriftStream(DriftSpec(**{**spec.__dict__, "concept_changes": 0}))
    assert len(stream.concept_visits) == 2 and not plain.concept_visits
    for v in stream.concept_visits:
        task = stream.visits[v]
        assert task in stream.visits[:v]  # a revisit
        a, b = stream.classes(task)

        def class_mean(batch, label):
            return S.features_to_numpy(batch)[S.labels_to_numpy(batch) == label].mean(axis=0)

        now, then, trained = stream.test_batch(task, 0, v), stream.test_batch(task, 0, v - 1), stream.train_batch(v, 0)
        for label, other in ((a, b), (b, a)):
            np.testing.assert_allclose(class_mean(now, label), class_mean(then, other), atol=0.3)
            np.testing.assert_allclose(class_mean(trained, label), class_mean(then, other), atol=0.3)
    first = stream.concept_visits[0]
    np.testing.assert_array_equal(S.features_to_numpy(stream.train_batch(first - 1, 0)),
                                  S.features_to_numpy(plain.train_batch(first - 1, 0)))
    assert stream.describe().fingerprint != plain.describe().fingerprint


def _write(path, batch):
    with pa.ipc.new_file(path, batch.schema) as writer:
        writer.write_batch(batch)


def test_arrow_folder_visits_follow_task_ids_and_bad_files_become_batches(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    for i, task in enumerate([7, 7, 3, 3, 7]):
        _write(tmp_path / "train" / f"{i:03d}.arrow", S.feature_batch(np.arange(i * 4, i * 4 + 4), np.zeros((4, 2)),
                                                                      np.zeros(4, int), np.full(4, task)))
    (tmp_path / "train" / "005.arrow").write_bytes(b"not arrow at all")
    _write(tmp_path / "test" / "000.arrow", S.feature_batch(np.arange(3), np.ones((3, 2)), np.zeros(3, int),
                                                            np.full(3, 3)))
    stream = ArrowDirStream(tmp_path, "features", feature_dim=2)
    info = stream.describe()
    assert info.visits == [0, 1, 0] and info.visit_batches == [2, 2, 2]  # the unreadable file joins the last visit
    assert info.extra["task_ids"] == [7, 3] and info.test_batches == [0, 1]
    broken = stream.train_batch(2, 1)
    assert broken.schema.names == ["unreadable_file", "error"]
    with pytest.raises(ValueError, match="feature_dim"):
        ArrowDirStream(tmp_path, "features")


def test_arrow_folder_rebatches_files_and_takes_numpy_feature_lists(tmp_path):
    import pyarrow.parquet as pq

    (tmp_path / "train").mkdir()
    feats = np.arange(10 * 3, dtype=np.float64).reshape(10, 3)
    table = pa.table({S.SAMPLE_ID: np.arange(10), S.TASK_ID: pa.array([0] * 10, pa.int32()),
                      S.LABEL: pa.array([0, 1] * 5, pa.int32()), S.FEATURES: list(feats)},  # list<double>
                     metadata={b"class_names": b'["no", "yes"]'})
    pq.write_table(table, tmp_path / "train" / "a.parquet", row_group_size=3)
    stream = ArrowDirStream(tmp_path, "features", feature_dim=3, batch_size=4)
    info = stream.describe()
    assert info.visit_batches == [3] and info.num_samples == 10 and info.extra["class_names"] == ["no", "yes"]
    batches = [gate(stream.train_batch(0, i), S.Contract(feature_dim=3))[0] for i in range(3)]  # the gate casts
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert batches[0].schema.field(S.FEATURES).type == pa.list_(pa.float32(), 3)
    np.testing.assert_array_equal(np.concatenate([S.features_to_numpy(b) for b in batches]), feats)


def test_arrow_folder_leaves_features_of_another_width_to_the_gate(tmp_path):
    (tmp_path / "train").mkdir()
    batch = S.feature_batch(np.arange(4), np.ones((4, 5), dtype=np.float64), np.zeros(4, int), np.zeros(4, int))
    fields = [*list(batch.schema)[:3], pa.field(S.FEATURES, pa.list_(pa.float64(), 5))]
    wide = pa.Table.from_batches([batch]).cast(pa.schema(fields))  # float64 and 5 wide: no cast makes it 3 wide
    _write(tmp_path / "train" / "a.arrow", wide.to_batches()[0])
    out = ArrowDirStream(tmp_path, "features", feature_dim=3).train_batch(0, 0)
    assert out.schema.field(S.FEATURES).type == pa.list_(pa.float64(), 5)  # unchanged: the gate refuses it


def test_an_unreadable_file_is_one_dead_letter_naming_it_and_the_readers_error(tmp_path):
    import pyarrow.parquet as pq

    from memcl_ops.data.sources import SourceSpec
    from memcl_ops.data.streams import StreamSpec
    from memcl_ops.roles.stream_source import StreamSource

    (tmp_path / "train").mkdir()
    good = pa.Table.from_batches([S.feature_batch(np.arange(6), np.ones((6, 2)), np.zeros(6, int), np.zeros(6, int))])
    pq.write_table(good, tmp_path / "train" / "a.parquet")
    whole = (tmp_path / "train" / "a.parquet").read_bytes()
    (tmp_path / "train" / "b.parquet").write_bytes(whole[:len(whole) // 2])  # truncated: no footer
    (tmp_path / "train" / "c.arrow").write_bytes(bytes(range(256)) * 3)
    pq.write_table(good.set_column(0, S.SAMPLE_ID, pa.array(np.arange(6, 12))), tmp_path / "train" / "d.parquet")
    source = StreamSource(SourceSpec(dataset=f"arrow:{tmp_path}", feature_dim=2), StreamSpec(batch_size=4), None)
    info = source.describe()
    outcomes = [source.train_batch(0, i) for i in range(info.visit_batches[0])]
    learned = [i for good_rows, _ in outcomes if good_rows is not None for i in S.sample_ids_to_numpy(good_rows)]
    assert learned == list(range(12))
    dead = pa.concat_tables([letters for _, letters in outcomes])
    assert dead.column("origin").to_pylist() == ["train/b.parquet", "train/c.arrow"]
    assert dead.column("reason").to_pylist() == ["unreadable"] * 2 and dead.column(S.SAMPLE_ID).null_count == 2
    truncated, garbage = dead.column("message").to_pylist()
    assert "b.parquet" in truncated and "Parquet magic bytes not found" in truncated
    assert "c.arrow" in garbage and "neither an Arrow IPC file" in garbage


def test_a_repeated_sample_id_is_refused_as_duplicate_and_the_first_row_keeps_it(tmp_path):
    """Rows already streamed come again with other labels: each is refused as `duplicate` naming where the first
    was; an unlabelled row's late label settles the first row, not its repeat; test rows, never learned, keep
    theirs (the same ids as training rows, or twice)."""
    import pyarrow.parquet as pq

    from memcl_ops.data.sources import SourceSpec
    from memcl_ops.data.streams import StreamSpec
    from memcl_ops.roles.stream_source import StreamSource

    def table(ids, labels, values=None):
        values = ids if values is None else values
        return pa.Table.from_batches([S.feature_batch(np.array(ids), np.outer(values, np.ones(2)),
                                                      pa.array(labels, pa.int32()), np.zeros(len(ids), int))])

    for split in ("train", "test"):
        (tmp_path / split).mkdir()
    pq.write_table(table(range(7), [0, 1, 0, 1, 0, 1, None]), tmp_path / "train" / "a.parquet")
    pq.write_table(table([3, 4, 6, 7, 7], [0, 0, 1, 1, 0], [3, 4, 99, 7, 7]), tmp_path / "train" / "b.parquet")
    pq.write_table(pa.table({S.SAMPLE_ID: pa.array([6], pa.int64()), S.LABEL: pa.array([1], pa.int32())}),
                   tmp_path / "train" / "c.parquet")  # a label file: row 6 of a.parquet is class 1
    pq.write_table(table([0, 1, 2, 0], [0, 1, 0, 1]), tmp_path / "test" / "a.parquet")
    source = StreamSource(SourceSpec(dataset=f"arrow:{tmp_path}", feature_dim=2), StreamSpec(batch_size=4), None,
                          unlabelled=True)
    info = source.describe()
    assert info.late_labels == [6]
    outcomes = [source.train_batch(0, i) for i in range(info.visit_batches[0])]
    passed = pa.concat_tables([pa.Table.from_batches([b]) for b, _ in outcomes if b is not None])
    assert passed.column(S.SAMPLE_ID).to_pylist() == [0, 1, 2, 3, 4, 5, 6, 7, 6]
    assert passed.column(S.FEATURES)[8].as_py() == [6, 6]  # the late label carries the first row's payload
    dead = pa.concat_tables([d for _, d in outcomes])
    assert dead.column(S.SAMPLE_ID).to_pylist() == [3, 4, 6, 7] and set(dead.column("reason").to_pylist()) == {
        "duplicate"}
    assert dead.column("position").to_pylist() == [0, 1, 2, 4]  # rows of b.parquet
    messages = dead.column("message").to_pylist()
    assert "earlier training row (train/a.parquet row 3, train/a.parquet row 4, train/a.parquet row 6)" in messages[0]
    assert "earlier training row (train/b.parquet row 3)" in messages[3]
    good, test_dead = source.test_batch(0, 0, 0)
    assert S.sample_ids_to_numpy(good).tolist() == [0, 1, 2, 0] and not test_dead.num_rows
