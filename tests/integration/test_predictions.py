"""Predictions out, nothing lost: the unlabelled rows of an `arrow:` folder are predicted (never learned) and
written once each to the run's predictions/ sink, a SIGKILLed driver and `--resume` included; labels that come
later (a label-only file) are learned where they arrive and score the predictions they settle."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memcl.pipeline import runner
from memcl.pipeline.config import dump_config, load_config
from memcl_ops.arrow import schema as S
from tests.killing import kill_driver_at_checkpoint, memcl

pytestmark = pytest.mark.ray

DIM, ROWS = 8, 48


def write_folder(root, tasks: int = 3) -> tuple[np.ndarray, dict[int, int], dict[int, int]]:
    """`tasks` tasks of two classes; a third of the training rows have no label. A label file right after task 0's
    rows brings the labels of a few of them (in the same visit), one after task 1's rows the labels of the others
    and one for a sample id the stream never showed. Returns the unlabelled sample ids, the late labels that settle
    one, and of those the ones labelled in task 0's own visit."""
    rng = np.random.default_rng(3)
    means = rng.normal(scale=3, size=(2 * tasks, DIM))
    next_id, unlabelled = 0, []
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        for task in range(tasks):
            labels = rng.choice([2 * task, 2 * task + 1], ROWS)
            ids = np.arange(next_id, next_id + ROWS)
            next_id += ROWS
            batch = S.feature_batch(ids, means[labels] + rng.normal(size=(ROWS, DIM)), labels, np.full(ROWS, task))
            if split == "train":
                hidden = rng.random(ROWS) < 1 / 3
                unlabelled.append(ids[hidden])
                batch = batch.set_column(2, S.LABEL, pa.array(labels, pa.int32(), mask=hidden))
                if task == 0:
                    late = dict(zip(ids[hidden].tolist(), labels[hidden].tolist(), strict=True))
            pq.write_table(pa.Table.from_batches([batch]), root / split / f"{task}.parquet")
    same_visit = dict(list(late.items())[:3])
    later = {i: y for i, y in late.items() if i not in same_visit}
    for name, labels in (("0z-labels", same_visit), ("1z-labels", {**later, 10**6: 0})):
        table = pa.table({S.SAMPLE_ID: pa.array(list(labels), pa.int64()),
                          S.LABEL: pa.array(list(labels.values()), pa.int32())})
        pq.write_table(table, root / "train" / f"{name}.parquet")
    return np.concatenate(unlabelled), late, same_visit


def config(root, out):
    return load_config(overrides={
        "data.dataset": f"arrow:{root}", "data.payload": "features", "data.feature_dim": DIM, "stream.batch_size": 16,
        "method.router.initial_slots": 2, "method.stage1.optim.epochs": 40, "method.stage2.optim.epochs": 5,
        "runtime.out": str(out), "runtime.progress": False, "runtime.actor_threads": 1})


def sink(run_dir) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted((run_dir / "predictions").glob("round-*.parquet"))])


def test_unlabelled_rows_are_predicted_once_each_across_a_driver_kill_and_resume(actors, tmp_path):
    root = tmp_path / "data"
    hidden, late, same_visit = write_folder(root)
    reference = runner.run(config(root, tmp_path / "ref"), actors=actors)
    predicted = sink(reference.run_dir)
    np.testing.assert_array_equal(np.sort(predicted.column(S.SAMPLE_ID).to_numpy()), np.sort(hidden))
    assert set(predicted.column("prediction").to_pylist()) <= {-1, *range(6)}
    assert sorted(set(predicted.column("model_version").to_pylist())) == [0, 1, 2]  # each round's model
    samples = reference.samples
    # the late labels are learned where they arrive (task 0's and task 1's visits); the one for an unknown id is
    # refused
    assert samples.predicted_unlabelled == len(hidden) and samples.learned == 3 * ROWS - len(hidden) + len(late)
    assert samples.refused == 1 and samples.refused_by_reason == {"null": 1}
    prequential = reference.metrics["prequential"]
    settled = {i: p for i, p in zip(predicted.column(S.SAMPLE_ID).to_pylist(),
                                    predicted.column("prediction").to_pylist(), strict=True) if i in late}
    assert prequential["late_labels"] == len(late) > len(same_visit) > 0  # those of the visit they came in too
    assert prequential["late_label_accuracy"] == np.mean([settled[i] == y for i, y in late.items()])
    # with boundaries a visit is consolidated at its end; before that the model published has never seen the visit's
    # classes (class-incremental), and only the predictor's class prototypes name them, from their next batch on
    assert prequential["rows"] == samples.learned and 0.5 < prequential["per_task"]["2"] < 1

    path = tmp_path / "killed.yaml"
    dump_config(config(root, tmp_path / "killed"), path)
    run_dir = kill_driver_at_checkpoint(["run", "--config", str(path), "--set", "runtime.num_cpus=1"],
                                        tmp_path / "killed", "checkpoints/ckpt-000000.sha256")
    resumed = memcl("run", "--resume", str(run_dir))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert sink(run_dir).equals(predicted)  # every unlabelled row once, as the uninterrupted run predicted it
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["samples"]["predicted_unlabelled"] == len(hidden)
    assert metrics["prequential"] == prequential
