"""Every registered head-learner method through the real actor pipeline (Ray actors, Arrow batches, checkpoints
on disk) on a tiny synthetic stream: the pipeline half of the method conformance suite; then `memcl bench` on a
shrunken suite. One module, so both share one set of actors."""

import csv

import numpy as np
import pytest

from memcl.pipeline import bench, checkpoint, runner
from memcl.pipeline.config import load_config
from memcl_ops.methods import METHODS, family_methods
from memcl_ops.tensors import SampleIds, state_part

pytestmark = pytest.mark.ray

TASKS, CLASSES, TRAIN_PER_CLASS = 4, 8, 40


def tiny(tmp_path, method: str):
    return load_config(overrides={
        "data.dataset": "synthetic", "data.synthetic.classes": CLASSES, "data.synthetic.dim": 16,
        "data.synthetic.train_per_class": TRAIN_PER_CLASS, "data.synthetic.test_per_class": 20,
        "stream.tasks": TASKS, "stream.batch_size": 40, "method.name": method, "method.router.initial_slots": 4,
        "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 5, "method.derpp.buffer_size": 30,
        "method.analytic.expansion_dim": 64,
        "runtime.out": str(tmp_path), "runtime.progress": False, "runtime.actor_threads": 1})


@pytest.mark.parametrize("name", family_methods("features"))
def test_method_runs_through_the_actor_pipeline(actors, tmp_path, name):
    metrics = runner.run(tiny(tmp_path, name), actors=actors).metrics
    acc = np.array(metrics["acc_matrix"], dtype=float)
    assert acc.shape == (TASKS, TASKS)
    assert not np.isnan(acc[np.tril_indices(TASKS)]).any() and np.isnan(acc[np.triu_indices(TASKS, 1)]).all()
    if "input-blind" not in METHODS[name].tags:  # the blind baseline never reads the input it is tested on
        assert acc[-1, -1] > 0.5, f"{name} did not learn the task it just saw: {acc[-1]}"
    assert metrics["summary"]["a_last"] == pytest.approx(acc[-1].mean())
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == TASKS * 2 * TRAIN_PER_CLASS
    head_bytes = {k: v for k, v in metrics["memory_bytes"].items() if k.startswith("head.")}
    assert head_bytes and sum(head_bytes.values()) > 0, metrics["memory_bytes"]
    assert (metrics["slots"]["history"] != []) == METHODS[name].memory

    # The head learner's checkpoint after the third task: it has been given exactly the samples streamed up to
    # there (ids are stream positions), none of the fourth task's.
    parts, _ = checkpoint.read(next(tmp_path.glob("*/checkpoints/ckpt-000002.npz")))
    ids = SampleIds()
    ids.restore(state_part(parts["predictor"], "learned"))
    learned = ids.array()
    np.testing.assert_array_equal(learned, np.arange(3 * 2 * TRAIN_PER_CLASS))


SMALL_DRIFT = {"data.drift.visits": 3, "data.drift.tasks": 3, "data.drift.train_per_visit": 60,
               "data.drift.test_per_task": 40, "data.drift.batch_size": 30, "method.stage2.optim.epochs": 3,
               "runtime.actor_threads": 1}


def test_bench_runs_each_method_and_seed_once_and_tables_agree_with_the_runs(actors, tmp_path):
    methods = ["simplecil", "joint"]
    rows = bench.bench("synthetic-drift", seeds=2, methods=methods, out=tmp_path, overrides=SMALL_DRIFT,
                       actors=actors, log=lambda _: None)
    assert [(r.method, r.seed) for r in rows] == [(m, s) for m in methods for s in range(2)]
    folder = tmp_path / "synthetic-drift"
    with open(folder / "runs.csv") as f:
        runs = list(csv.DictReader(f))
    with open(folder / "results.csv") as f:
        table = {r["method"]: r for r in csv.DictReader(f)}
    assert len(runs) == 4 and list(table) == methods
    for method in methods:
        a_last = [float(r["a_last"]) for r in runs if r["method"] == method]
        assert float(table[method]["a_last_mean"]) == pytest.approx(np.mean(a_last), abs=1e-6)
        assert float(table[method]["a_last_std"]) == pytest.approx(np.std(a_last, ddof=1), abs=1e-6)
        assert table[method]["role"] == METHODS[method].role
    # what the runs themselves wrote agrees with the bench's rows
    for row in rows:
        assert len(row.curve) == 3 and 0 <= row.summary["a_last"] <= 1
        assert row.memory_bytes > 0
    # simplecil is seed-independent (no training); joint keeps every sample it saw
    simple = [r for r in rows if r.method == "simplecil"]
    assert simple[0].summary == simple[1].summary
    joint_bytes = next(r.memory_bytes for r in rows if r.method == "joint")
    assert joint_bytes > 3 * 60 * 32 * 4
    md = (folder / "results.md").read_text()
    assert "| joint | upper-bound |" in md and "best memcl method" not in md  # no memcl method was run
    assert (folder / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # `memcl bench --render` reads the runs back as they were
    for back, run in zip(bench.read_runs(folder), rows, strict=True):
        assert (back.method, back.seed, back.memory_bytes) == (run.method, run.seed, run.memory_bytes)
        assert back.summary == pytest.approx(run.summary, abs=1e-6)
        np.testing.assert_allclose(back.curve, run.curve, atol=1e-4)


def test_bench_fanned_out_over_bench_workers_gives_the_sequential_rows(actors, tmp_path):
    methods = ["mars-memcl", "derpp"]
    kwargs = {"seeds": 1, "methods": methods, "overrides": SMALL_DRIFT, "log": lambda _: None}
    sequential = bench.bench("synthetic-drift", out=tmp_path / "sequential", actors=actors, **kwargs)
    fanned = bench.bench("synthetic-drift", out=tmp_path / "fanned", fan_out=1.0, **kwargs)
    assert [(r.method, r.seed) for r in fanned] == [(m, 0) for m in methods]
    for one, other in zip(sequential, fanned, strict=True):
        assert (one.method, one.seed, one.summary, one.memory_bytes) == (other.method, other.seed, other.summary,
                                                                         other.memory_bytes)
        np.testing.assert_array_equal(one.curve, other.curve)
    for name in ("results.md", "results.csv"):  # the same tables, but for the train seconds column
        strip = lambda text: [line.rsplit("|", 3)[0] if "|" in line else line.rsplit(",", 2)[0]  # noqa: E731
                              for line in text.splitlines()]
        assert strip((tmp_path / "sequential/synthetic-drift" / name).read_text()) == \
            strip((tmp_path / "fanned/synthetic-drift" / name).read_text())
