"""End to end through real Ray actors: real Arrow batches, a real (tiny) encoder actor, real files."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from memcl.pipeline import checkpoint, report, runner
from memcl.pipeline.config import ConfigError, load_config
from memcl_ops import metrics as metrics_lib
from tests.killing import kill_driver_at_checkpoint, memcl

pytestmark = pytest.mark.ray


def digits_tiny(tmp_path, **extra):
    overrides = {
        "data.dataset": "digits", "stream.tasks": 5, "stream.batch_size": 64, "stream.train_per_class": 60,
        "stream.test_per_class": 30, "encoder.spec.name": "tiny", "encoder.spec.dim": 48, "encoder.threads": 1,
        "method.router.initial_slots": 4, "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 5,
        "runtime.cache_dir": "", "runtime.out": str(tmp_path), "runtime.progress": False,
        "runtime.actor_threads": 1, **extra}
    return load_config(overrides=overrides)


def test_digits_through_inline_encoder_actor(actors, tmp_path):
    metrics = runner.run(digits_tiny(tmp_path), actors=actors).metrics
    run_dir = Path(metrics["run_dir"])
    acc = np.array(metrics["acc_matrix"])
    assert acc.shape == (5, 5)
    assert np.isnan(acc[np.triu_indices(5, 1)]).all() and not np.isnan(acc[np.tril_indices(5)]).any()
    # every sample of the stream learned exactly once
    assert metrics["samples"]["stream"] == 5 * 2 * 60
    assert metrics["samples"]["learned"] == metrics["samples"]["unique_learned"] == metrics["samples"]["stream"]
    for name in report.RUN_FILES:
        assert (run_dir / name).stat().st_size > 0, name
    on_disk = json.loads((run_dir / "metrics.json").read_text())
    np.testing.assert_array_equal(np.array(on_disk["acc_matrix"], float), acc)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["method"]["name"] == "mars-memcl"
    assert metrics["slots"]["history"][0] == [0, 4]
    assert set(metrics["wall_seconds"]) >= {"stream", "consolidate", "evaluate", "checkpoint"}


def synthetic(tmp_path, **extra):
    overrides = {
        "data.dataset": "synthetic", "data.synthetic.classes": 8, "data.synthetic.dim": 16,
        "data.synthetic.train_per_class": 80, "data.synthetic.test_per_class": 40, "stream.tasks": 4,
        "stream.batch_size": 40, "method.router.initial_slots": 4, "method.stage1.optim.epochs": 3,
        "method.stage2.optim.epochs": 10, "runtime.out": str(tmp_path), "runtime.progress": False,
        "runtime.actor_threads": 1, **extra}
    return load_config(overrides=overrides)


def test_learnable_stream_beats_chance_by_a_wide_margin(actors, tmp_path):
    metrics = runner.run(synthetic(tmp_path), actors=actors).metrics
    acc = np.array(metrics["acc_matrix"])
    chance = 1 / 8
    assert np.nanmean(acc[-1]) > chance + 0.45, acc
    assert metrics["summary"]["a_last"] == pytest.approx(np.mean(acc[-1]))


def test_result_does_not_depend_on_calls_in_flight(actors, tmp_path):
    a = runner.run(synthetic(tmp_path, **{"runtime.max_in_flight": 1}), actors=actors).metrics
    b = runner.run(synthetic(tmp_path, **{"runtime.max_in_flight": 16}), actors=actors).metrics
    np.testing.assert_array_equal(np.array(a["acc_matrix"]), np.array(b["acc_matrix"]))
    assert a["slots"]["history"] == b["slots"]["history"]


def test_killed_driver_resumes_to_the_same_accuracy_matrix(actors, tmp_path):
    """SIGKILL the driver once the checkpoint after task 2 is on disk; `memcl run --resume` must finish with the
    accuracy matrix of an uninterrupted run with the same seed."""
    slow = {"stream.tasks": 4, "method.stage1.optim.epochs": 40}
    reference = runner.run(synthetic(tmp_path / "ref", **slow), actors=actors).metrics

    config_path = tmp_path / "killed.yaml"
    cfg = synthetic(tmp_path / "killed", **slow)
    from memcl.pipeline.config import dump_config

    dump_config(cfg, config_path)
    run_dir = kill_driver_at_checkpoint(["run", "--config", str(config_path), "--set", "runtime.num_cpus=1"],
                                        tmp_path / "killed", "checkpoints/ckpt-000001.sha256")

    resumed = memcl("run", "--resume", str(run_dir))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    metrics = json.loads((run_dir / "metrics.json").read_text())
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], float), np.array(reference["acc_matrix"]))
    # exactly-once: the resumed run learned every sample once (task 1-2 from the checkpoint, 3-4 after)
    assert metrics["samples"]["learned"] == metrics["samples"]["unique_learned"] == metrics["samples"]["stream"]


def test_task_free_has_a_row_per_evaluation_point_and_says_so(actors, tmp_path):
    # 4 tasks x 160 rows in batches of 40: 16 batches, 4 per visit; every 3 batches -> 6 rounds, each evaluated
    metrics = runner.run(synthetic(tmp_path, **{"stream.task_free": True, "method.consolidate_every": 3}),
                         actors=actors).metrics
    assert metrics["consolidations"] == 6
    assert [r["batches"] for r in metrics["round_log"]] == [3, 3, 3, 3, 3, 1]
    acc = np.array(metrics["acc_matrix"], dtype=float)
    assert acc.shape == (6, 4) and [row["round"] for row in metrics["rows"]] == list(range(6))  # no copied rows
    arrived = [(4 * task) // 3 for task in range(4)]  # the round holding each task's first batch
    assert (np.isnan(acc) == (np.arange(6)[:, None] < np.array(arrived)[None, :])).all()
    ended = [(4 * task + 3) // 3 for task in range(4)]  # the round in which each visit ends
    assert [r["visits_ended"] for r in metrics["round_log"]] == [[v for v in range(4) if ended[v] == r]
                                                                 for r in range(6)]
    assert metrics["summary"] == metrics_lib.Summary.over_points(acc, ended).as_dict()
    assert metrics["task_free"] and "taskfree" in Path(metrics["run_dir"]).name
    assert "task-free" in report.summary_table(metrics) and np.nanmean(acc[-1]) > 1 / 8 + 0.3
    assert metrics["samples"]["learned"] == metrics["samples"]["unique_learned"] == metrics["samples"]["stream"]


def test_a_task_free_run_writes_strict_json_and_prints_no_nan(actors, tmp_path, capsys):
    """The entries a task-free run never evaluated (tasks not arrived yet) are null in metrics.json, which any strict
    JSON parser reads, and "-" in every table printed of it (from the run, and from the file)."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    result = runner.run(synthetic(tmp_path, **{"stream.task_free": True, "method.consolidate_every": 3}),
                        actors=actors)
    text = (result.run_dir / "metrics.json").read_text()
    on_disk = json.loads(text, parse_constant=refuse)
    acc = np.array(result.metrics["acc_matrix"], dtype=float)
    assert np.isnan(acc).any()  # there is something undefined to write
    assert [[v is None for v in row] for row in on_disk["acc_matrix"]] == np.isnan(acc).tolist()
    assert memcl_report(result.run_dir) == 0
    for table in (report.summary_table(result.metrics), report.summary_table(on_disk), capsys.readouterr().out):
        assert "nan" not in table.lower() and "    -   " in table


def memcl_report(run_dir: Path) -> int:
    from memcl.pipeline import cli

    return cli.main(["report", str(run_dir)])


def test_a_checkpoint_without_a_state_key_is_refused_in_one_line(actors, tmp_path):
    """A checkpoint of an older memcl (the analytic head before its reservoir) names the role and the missing key
    in one line instead of an actor's traceback."""
    done = runner.run(synthetic(tmp_path, **{"method.name": "analytic", "stream.tasks": 2}), actors=actors).metrics
    run_dir = Path(done["run_dir"])
    path = sorted((run_dir / "checkpoints").glob("ckpt-*.npz"))[-1]
    parts, meta = checkpoint.read(path)
    parts["predictor"] = {k: v for k, v in parts["predictor"].items() if "reservoir" not in k}
    checkpoint.write(path.parent, int(path.stem.split("-")[1]), parts, meta)
    with pytest.raises(ConfigError, match=r"older memcl \(the predictor state lacks 'features'\)"):
        runner.run(resume=run_dir, actors=actors)
