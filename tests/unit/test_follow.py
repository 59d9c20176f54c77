"""A followed `arrow:` folder (`stream.follow`) on its own, without Ray: new files taken in name order, files still
being written (a dot name, a temporary suffix) never read, the taken files restored from a checkpoint's state so
that a resumed stream skips them, and rounds planned open-ended as the same rounds a whole folder gives."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memcl_ops.arrow import schema as S
from memcl_ops.data.sources import SourceSpec
from memcl_ops.data.streams import StreamSpec
from memcl_ops.roles.stream_source import StreamSource
from memcl_ops.rounds import plan_rounds

DIM = 2


def land(train, name: str, first_id: int, rows: int, task: int, labels=None) -> None:
    """A file of `rows` rows written under a dot name and renamed into train/ as `name`, as a writer should."""
    labels = np.arange(rows) % 2 if labels is None else labels
    table = pa.Table.from_batches([S.feature_batch(np.arange(first_id, first_id + rows), np.full((rows, DIM), task),
                                                   pa.array(labels, pa.int32()), np.full(rows, task))])
    pq.write_table(table, train / f".{name}")
    os.rename(train / f".{name}", train / name)


def source(root, **stream) -> StreamSource:
    return StreamSource(SourceSpec(dataset=f"arrow:{root}", feature_dim=DIM),
                        StreamSpec(batch_size=4, follow=True, **stream), None, unlabelled=True)


def streamed_ids(src: StreamSource, rounds) -> list[int]:
    return [i for v, k in rounds for i in S.sample_ids_to_numpy(src.train_batch(v, k)[0]).tolist()]


def test_new_files_are_taken_in_name_order_and_unfinished_ones_never(tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    land(train, "b.parquet", 0, 6, task=0)
    src = source(tmp_path)
    info = src.describe()
    assert info.extra["train_files"] == ["b.parquet"] and src.follow(info.fingerprint) is None  # nothing new
    land(train, "d.parquet", 6, 4, task=1)
    land(train, "c.parquet", 10, 4, task=0)
    (train / ".e.parquet").write_bytes(b"PAR1 half written")  # still being written under a dot name
    (train / "e.parquet.tmp").write_bytes(b"PAR1 half written")  # or under a temporary suffix
    (train / "e.parquet.part").write_bytes(b"PAR1 half written")
    grown = src.follow(info.fingerprint)
    assert grown.extra["train_files"] == ["b.parquet", "c.parquet", "d.parquet"]
    assert grown.visits == [0, 1] and grown.visit_batches == [3, 1] and grown.num_samples == 14
    # the first file's batches keep their places; c joins task 0's visit, d begins the next
    assert streamed_ids(src, [(0, 0), (0, 1)]) == list(range(6))
    assert streamed_ids(src, [(0, 2), (1, 0)]) == [10, 11, 12, 13, 6, 7, 8, 9]
    assert src.follow(grown.fingerprint) is None


def test_restored_offsets_skip_the_consumed_files_and_keep_their_order(tmp_path):
    """A checkpoint's source state names the files taken, in order; a new source (a resumed run) restored from it
    holds them where they were, even when a file that sorts before one of them landed later, and takes only the
    files after them."""
    train = tmp_path / "train"
    train.mkdir()
    land(train, "1.parquet", 0, 4, task=0)
    land(train, "3.parquet", 4, 4, task=0)
    first = source(tmp_path)
    state = first.state()
    assert state["train_files"].item() == '["1.parquet", "3.parquet"]'
    land(train, "2.parquet", 8, 4, task=0)  # sorts between the files taken, but landed after them
    land(train, "4.parquet", 12, 4, task=1)
    again = source(tmp_path)  # the resumed run's source: the folder as it is now
    assert again.describe().extra["train_files"] == ["1.parquet", "2.parquet", "3.parquet", "4.parquet"]
    again.restore(state)
    assert again.describe().extra["train_files"] == ["1.parquet", "3.parquet"]
    assert streamed_ids(again, [(0, 0), (0, 1)]) == list(range(8))  # the consumed rows, where they were
    grown = again.follow(first.describe().fingerprint)
    assert grown.extra["train_files"] == ["1.parquet", "3.parquet", "2.parquet", "4.parquet"]
    assert streamed_ids(again, [(0, 2), (1, 0)]) == list(range(8, 16))  # only the files not consumed
    # a folder whose files are not the ones the checkpoint took is refused: other contents, or a file gone
    other = tmp_path / "other"
    (other / "train").mkdir(parents=True)
    land(other / "train", "1.parquet", 0, 5, task=0)
    land(other / "train", "3.parquet", 5, 4, task=0)
    with pytest.raises(ValueError, match="different stream"):
        source(other).restore(state)
    (train / "3.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"3\.parquet: the run streamed it and it is gone"):
        source(tmp_path).restore(state)


def test_late_labels_that_land_later_settle_rows_taken_before(tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    land(train, "1.parquet", 0, 4, task=0, labels=pa.array([0, None, 1, None], pa.int32()))
    src = source(tmp_path)
    assert src.describe().late_labels == []
    labels = pa.table({S.SAMPLE_ID: pa.array([3, 1], pa.int64()), S.LABEL: pa.array([1, 0], pa.int32())})
    pq.write_table(labels, train / "1z-labels.parquet.tmp")
    os.rename(train / "1z-labels.parquet.tmp", train / "1z-labels.parquet")
    grown = src.follow(src.describe().fingerprint)
    assert grown.late_labels == [3, 1] and grown.visit_batches == [2]
    late, _ = src.train_batch(0, 1)
    assert S.sample_ids_to_numpy(late).tolist() == [3, 1] and S.labels_to_numpy(late).tolist() == [1, 0]


def test_open_ended_rounds_are_the_whole_folders_rounds_as_they_become_known(tmp_path):
    """Planned while the folder grows, each round is one the whole folder's plan has, at the same place: with task
    boundaries a visit once the next has begun; task-free, K batches once a batch beyond them has come."""
    train = tmp_path / "train"
    train.mkdir()
    sizes, tasks = [6, 3, 9, 4, 5], [0, 0, 1, 2, 2]
    src, plans = None, {False: [], True: []}
    for k, (rows, task) in enumerate(zip(sizes, tasks)):
        land(train, f"{k}.parquet", sum(sizes[:k]), rows, task)
        if src is None:
            src = source(tmp_path)
        info = src.follow("") or src.describe()
        for task_free in (False, True):
            plans[task_free].append(plan_rounds(info, task_free, every=3, ended=False))
    whole = src.describe()
    for task_free in (False, True):
        final = plan_rounds(whole, task_free, every=3)
        for partial in plans[task_free]:
            assert partial == final[:len(partial)]
        assert len(plans[task_free][-1]) == len(final) - 1  # the last round waits for the stream's end
    assert plans[False][-1] == [[(0, 0), (0, 1), (0, 2)], [(1, 0), (1, 1), (1, 2)]]
