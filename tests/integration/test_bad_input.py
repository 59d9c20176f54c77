"""Malformed batches thrown at the running pipeline: the run never crashes and never drops a row silently
(every input row is learned, in the dead-letter files, or, without a label, in the predictions sink); a bad row
never takes the good rows beside it along."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memcl.pipeline import cli, runner
from memcl.pipeline.config import load_config
from memcl_ops.arrow import schema as S
from tests.malformed import DIM, LABELS, feature_batches, mixed_folder

pytestmark = pytest.mark.ray


def write_stream(root, batches, tests):
    for folder, items in (("train", batches), ("test", tests)):
        (root / folder).mkdir(parents=True)
        for i, batch in enumerate(items):
            with pa.ipc.new_file(root / folder / f"{i:05d}.arrow", batch.schema) as writer:
                writer.write_batch(batch)


def clean_test_batch(task, seed):
    rng = np.random.default_rng(seed)
    labels = rng.choice(LABELS, 8)
    return S.feature_batch(np.arange(8), rng.normal(size=(8, DIM)) + labels[:, None], labels, np.full(8, task))


@st.composite
def streams(draw):
    batches, next_id = [], 0
    for task in (0, 0, 0, 1, 1, 1):
        batch = draw(feature_batches(first_id=next_id, task=task))
        next_id += max(batch.num_rows, 1)
        batches.append(batch)
    return batches


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.parametrize("transport", ["actors", "compiled"])
@given(batches=streams(), method=st.sampled_from(["mars-memcl", "finetune"]))
def test_pipeline_survives_malformed_batches(actors, tmp_path_factory, batches, method, transport):
    root = tmp_path_factory.mktemp("stream")
    write_stream(root / "data", batches, [clean_test_batch(0, 1), clean_test_batch(1, 2)])
    config = load_config(overrides={
        "data.dataset": f"arrow:{root / 'data'}", "data.payload": "features", "data.feature_dim": DIM,
        "data.labels": list(LABELS), "method.name": method, "method.router.initial_slots": 2,
        "method.stage1.optim.epochs": 1, "method.stage2.optim.epochs": 2, "runtime.max_batch_rows": 12,
        "runtime.out": str(root / "runs"), "runtime.progress": False, "runtime.actor_threads": 1,
        "runtime.transport": transport})
    metrics = runner.run(config, actors=actors).metrics

    dead_dir = root / "runs" / next((root / "runs").iterdir()).name / "dead_letters"
    dead = pq.read_table(dead_dir) if dead_dir.exists() else pa.table({S.SAMPLE_ID: pa.array([], pa.int64())})
    predicted_dir = dead_dir.parent / "predictions"
    predicted = (pq.read_table(predicted_dir) if predicted_dir.exists()
                 else pa.table({S.SAMPLE_ID: pa.array([], pa.int64())}))
    inputs = sum(b.num_rows for b in batches)
    assert metrics["samples"]["predicted_unlabelled"] == predicted.num_rows
    assert metrics["samples"]["learned"] + dead.num_rows + predicted.num_rows == inputs  # every row accounted for
    learned_ids = set(ray.get(actors.handle("predictor").learned_ids.remote()).tolist())  # the learner's own record
    dead_ids = {i for i in dead.column(S.SAMPLE_ID).to_pylist() if i is not None}
    assert not learned_ids & dead_ids and not learned_ids & set(predicted.column(S.SAMPLE_ID).to_pylist())
    assert metrics["samples"]["refused"] == dead.num_rows
    assert sum(metrics["samples"]["refused_by_reason"].values()) == dead.num_rows


def finished(rc, run_dir, capsys):
    """(exit status, metrics.json, dead letters as (split, file, row, reason), the closing line) of a `memcl run`."""
    err = capsys.readouterr().err.strip().splitlines()
    dead_dir = run_dir / "dead_letters"
    dead = pq.read_table(dead_dir).to_pylist() if dead_dir.exists() else []
    letters = sorted((d["split"], d["origin"], d["position"], d["reason"]) for d in dead)
    return rc, json.loads((run_dir / "metrics.json").read_text()), letters, err[-1] if err else ""


def memcl_run(root, out, method, capsys):
    """`memcl run` on an `arrow:` folder of 16-d features, each file one batch: its run folder and `finished`."""
    rc = cli.main(["run", "--set", f"data.dataset=arrow:{root}", "--set", "data.payload=features",
                   "--set", "data.feature_dim=16", "--set", f"method.name={method}", "--set", "stream.batch_size=64",
                   "--set", "method.router.initial_slots=2", "--set", "method.stage1.optim.epochs=1",
                   "--set", "method.stage2.optim.epochs=2", "--set", "runtime.progress=false",
                   "--set", "runtime.actor_threads=1", "--out", str(out)])
    run_dir = next(out.iterdir())
    return run_dir, finished(rc, run_dir, capsys)


@pytest.mark.parametrize("method", ["analytic", "mars-memcl"])
def test_bad_rows_never_take_good_rows_with_them(ray_session, tmp_path, capsys, method):
    """A folder mixing good rows with one of every fault (features of 1e8 and 1e30, NaN and Inf, a null sample_id,
    rows of 15 and 17 values, sample ids that came before with other labels, a truncated Parquet file, a file of
    garbage bytes, and a NaN among the test rows): the run ends, every good row is learned once,
    every broken row is a dead letter with its own reason, and the accuracy matrix is the one of the same folder
    without the broken rows. Resumed after its first round, the run refuses the same repeats: the first rows with
    those ids were streamed before the resume."""
    expected = mixed_folder(tmp_path / "mixed", broken=True)
    mixed_folder(tmp_path / "clean", broken=False)
    run_dir, (rc, broken, letters, closing) = memcl_run(tmp_path / "mixed", tmp_path / "runs-mixed", method, capsys)
    assert rc == 0 and letters == expected
    _, (clean_rc, clean, none, _) = memcl_run(tmp_path / "clean", tmp_path / "runs-clean", method, capsys)
    assert clean_rc == 0 and not none
    np.testing.assert_array_equal(broken["acc_matrix"], clean["acc_matrix"])
    assert 0.3 < broken["summary"]["a_last"] < 1  # classes that overlap: a row learned wrongly would show
    good = clean["samples"]["stream"]
    assert broken["samples"]["learned"] == broken["samples"]["unique_learned"] == clean["samples"]["learned"] == good
    train_refused = sum(1 for split, *_ in expected if split == "train")
    assert broken["samples"]["stream"] == good + train_refused and broken["samples"]["refused"] == train_refused
    assert closing.startswith(f"memcl: warning: {train_refused} of {good + train_refused} training rows refused")

    resumed = tmp_path / "resumed"  # as if killed once its first round (task 0) was committed
    shutil.copytree(run_dir, resumed)
    for name in ("checkpoints/ckpt-000001.npz", "checkpoints/ckpt-000001.sha256", "dead_letters/round-000001.parquet",
                 "metrics.json"):
        (resumed / name).unlink()
    rc, again, letters, _ = finished(cli.main(["run", "--resume", str(resumed)]), resumed, capsys)
    assert rc == 0 and letters == expected
    assert again["acc_matrix"] == broken["acc_matrix"] and again["samples"] == broken["samples"]
