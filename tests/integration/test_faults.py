"""Actor faults at seeded random points and at the start of every step of a run (commit, evaluation, checkpoint,
restore, report): the run recovers, learns every sample exactly once, and ends with the accuracy matrix of an
uninterrupted run; a kill storm stops it with one line and a checkpoint that --resume completes."""


import numpy as np
import pytest
import ray

from memcl.pipeline import checkpoint, report, runner
from memcl.pipeline.config import dump_config, load_config
from memcl.pipeline.encoder_pool import EncoderPool
from memcl.pipeline.errors import RunStopped
from tests.killing import AIMS, kill_driver_at_checkpoint, killer, memcl, phase_killer, restarted_quietly

pytestmark = pytest.mark.ray


def config(tmp_path, **extra):
    overrides = {
        "data.dataset": "digits", "stream.tasks": 5, "stream.batch_size": 30, "stream.train_per_class": 30,
        "stream.test_per_class": 20, "encoder.spec.name": "tiny", "encoder.spec.dim": 32, "encoder.threads": 1,
        "method.router.initial_slots": 4, "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 4,
        "runtime.cache_dir": "", "runtime.out": str(tmp_path), "runtime.progress": False,
        "runtime.actor_threads": 1, "runtime.checkpoint": False, **extra}
    return load_config(overrides=overrides)


@pytest.fixture(scope="module")
def reference(actors, tmp_path_factory):
    return runner.run(config(tmp_path_factory.mktemp("ref")), actors=actors).metrics


POINTS = np.random.default_rng(8).integers(0, [5, 2], size=(3, 2)).tolist()  # seeded (visit, batch) points


ROLES = ["encoder0", "memory", "stage2", "stage1", "monitor"]
# One point per role and transport in the default tier (alternating the two ways an actor comes back; the compiled
# chain at another point than the classic one); every point in `slow`.
CASES = [pytest.param(role, point, transport,
                      marks=() if point == (i + shift) % len(POINTS) else pytest.mark.slow)
         for shift, transport in enumerate(("actors", "compiled"))
         for i, role in enumerate(ROLES) for point in range(len(POINTS))]


@pytest.mark.parametrize("role, point, transport", CASES)
def test_killed_actor_is_recovered_exactly_once(actors, reference, tmp_path, role, point, transport):
    at = tuple(POINTS[point])
    hook, done = killer(actors, role, at, restart=point % 2 == 1)  # alternate Ray restarts and fresh actors
    metrics = runner.run(config(tmp_path, **{"runtime.transport": transport}), actors=actors, on_batch=hook).metrics
    assert done and metrics["recoveries"] >= 1
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(reference["acc_matrix"]))
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == reference["samples"]["stream"]
    assert metrics["slots"]["history"] == reference["slots"]["history"]


CHAOS_ROLES = ["source", "encoder0", "memory", "monitor", "stage1", "stage2"]


@pytest.mark.parametrize("transport, seed", [("actors", 1), ("compiled", 2)])
def test_kills_aimed_at_every_step_of_the_run_give_the_uninterrupted_run(actors, reference, tmp_path, transport, seed):
    """An actor dies as the run starts, evaluates, commits, checkpoints, restores after a fault and reports."""
    hook, done = phase_killer(actors, CHAOS_ROLES, seed)
    metrics = runner.run(config(tmp_path, **{"runtime.transport": transport, "runtime.checkpoint": True}),
                         actors=actors, on_phase=hook).metrics
    assert sorted(phase for phase, _ in done) == sorted(AIMS) and metrics["recoveries"] >= 3
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(reference["acc_matrix"]))
    assert metrics["slots"]["history"] == reference["slots"]["history"]
    assert metrics["memory_bytes"] == reference["memory_bytes"]
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == reference["samples"]["stream"]


@pytest.mark.parametrize("role", ["memory", "stage2"])
def test_an_actor_restarted_between_calls_is_caught_and_replayed(actors, reference, tmp_path, role):
    """Ray restarts a killed actor before the runner calls it again: no call fails, but the actor has lost its
    state; the run notices the new process and replays from the last committed state."""
    seen = {"checkpoint": 0}

    def hook(phase: str) -> None:
        seen["checkpoint"] += phase == "checkpoint"
        if phase == "checkpoint" and seen["checkpoint"] == 2:
            restarted_quietly(actors.handle(role))
    metrics = runner.run(config(tmp_path), actors=actors, on_phase=hook).metrics
    assert metrics["recoveries"] == 1
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(reference["acc_matrix"]))
    assert metrics["slots"]["history"] == reference["slots"]["history"]
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == reference["samples"]["stream"]


def test_a_kill_storm_stops_the_run_at_its_checkpoint_and_resume_completes_it(actors, reference, tmp_path):
    """Kills at every step once two rounds are committed, faster than any step can finish: the run stops after
    runtime.max_recoveries faults in a row, naming the role, and --resume from its checkpoint gives the
    uninterrupted run."""
    seen = {"checkpoint": 0, "kills": 0}

    def storm(phase: str) -> None:
        seen["checkpoint"] += phase == "checkpoint"
        if seen["checkpoint"] > 2:
            ray.kill(actors.handle(CHAOS_ROLES[seen["kills"] % len(CHAOS_ROLES)]), no_restart=False)
            seen["kills"] += 1
    cfg = config(tmp_path, **{"runtime.checkpoint": True, "runtime.max_recoveries": 2})
    with pytest.raises(RunStopped) as stop:
        runner.run(cfg, actors=actors, on_phase=storm)
    message = str(stop.value)
    assert "3 actor faults in a row" in message and any(f"the {role} actor" in message for role in CHAOS_ROLES)
    assert "\n" not in message and (stop.value.run_dir / "checkpoints" / "ckpt-000002.sha256").is_file()
    assert not (stop.value.run_dir / "metrics.json").exists()
    metrics = runner.run(resume=stop.value.run_dir, actors=actors).metrics
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(reference["acc_matrix"]))
    assert metrics["slots"]["history"] == reference["slots"]["history"]
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == reference["samples"]["stream"]


def test_chaos_mode_storm_on_the_command_line_is_one_line_naming_the_command_that_goes_on(tmp_path):
    """`memcl run --chaos` killing faster than a step can finish, from set-up on: exit 1, one line that names the
    command that goes on: `--resume` of a folder with a checkpoint, or (stopped in set-up) the same command again,
    with no folder left behind."""
    cfg = config(tmp_path, **{"runtime.max_recoveries": 1, "runtime.checkpoint": True})
    dump_config(cfg, tmp_path / "storm.yaml")
    proc = memcl("run", "--config", str(tmp_path / "storm.yaml"), "--chaos", "0.01")
    out, _ = proc.communicate(timeout=300)
    errors = [line for line in out.splitlines() if line.startswith("memcl: error:")]
    assert proc.returncode == 1, out
    assert len(errors) == 1 and "actor faults in a row" in errors[0], out
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    if "setting up the run" in errors[0]:
        assert errors[0].endswith("run the same command again") and not folders, out
    else:
        (folder,) = folders
        assert errors[0].endswith(f"memcl run --resume {folder}") and any(folder.rglob("ckpt-*.sha256")), out


# The stream does not wait: task-free rounds of 2 batches, one batch per pass; a consolidation of stage 1's 2 and
# stage 2's 4 epochs keeps the trainers busy 6 passes per batch it takes, so the first runs from the end of round 0
# past the stream's last batch, while the stream, its encoder included, goes on.
BACKGROUND = {"stream.realtime.mode": "simulated", "stream.task_free": True, "method.consolidate_every": 2}


@pytest.fixture(scope="module")
def background(actors, tmp_path_factory):
    return runner.run(config(tmp_path_factory.mktemp("background"), **BACKGROUND), actors=actors).metrics


def assert_same_background_run(metrics, reference) -> None:
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(reference["acc_matrix"]))
    for key in ("prequential", "realtime", "slots", "memory_bytes"):
        assert metrics[key] == reference[key], key
    timeless = ("encoder_busy_s", "encoder_busy_consolidating_s")
    assert ({k: v for k, v in metrics["consolidation"].items() if k not in timeless}
            == {k: v for k, v in reference["consolidation"].items() if k not in timeless})
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == reference["samples"]["stream"]


def test_the_encoder_keeps_encoding_while_the_trainers_consolidate(background, actors, tmp_path):
    """On actors the next batches are encoded while a consolidation runs in the background; when the stream waits,
    none are."""
    done = background["consolidation"]
    assert 0 < done["encoder_busy_consolidating_s"] < done["encoder_busy_s"], done
    waits = runner.run(config(tmp_path, **{**BACKGROUND, "stream.realtime.mode": "off"}), actors=actors).metrics
    assert waits["consolidation"]["encoder_busy_consolidating_s"] == 0 < waits["consolidation"]["encoder_busy_s"]


@pytest.mark.parametrize("role", ["stage2", pytest.param("stage1", marks=pytest.mark.slow),
                                  pytest.param("predictor", marks=pytest.mark.slow)])
def test_an_actor_killed_while_a_consolidation_runs_in_the_background_is_recovered_exactly(
        actors, background, tmp_path, role):
    """The kill lands after round 0 has ended and its consolidation was handed to the trainers: the round is
    replayed from the last commit, whose predictor holds the consolidation's inputs, and the consolidation starts
    again: the uninterrupted run, version for version."""
    hook, done = killer(actors, role, (2, 0), restart=role != "stage1")
    metrics = runner.run(config(tmp_path, **BACKGROUND), actors=actors, on_batch=hook).metrics
    assert done and metrics["recoveries"] >= 1
    assert_same_background_run(metrics, background)


def test_a_driver_killed_while_a_consolidation_runs_in_the_background_resumes_to_the_same_run(background, tmp_path):
    """SIGKILL of the driver after round 1's checkpoint, which records a consolidation in flight; `--resume` starts
    it again from the inputs the checkpoint holds and ends where the uninterrupted run did."""
    path = tmp_path / "killed.yaml"
    dump_config(config(tmp_path / "killed", **{**BACKGROUND, "runtime.checkpoint": True}), path)
    run_dir = kill_driver_at_checkpoint(["run", "--config", str(path), "--set", "runtime.num_cpus=2"],
                                        tmp_path / "killed", "checkpoints/ckpt-000001.sha256")
    parts, meta = checkpoint.read(run_dir / "checkpoints" / "ckpt-000001.npz")
    assert meta["realtime"]["job"] is not None and "in_flight.running" in parts["predictor"]
    resumed = memcl("run", "--resume", str(run_dir))
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert_same_background_run(report.read_metrics(run_dir / "metrics.json"), background)


def test_an_encoder_killed_while_the_feature_cache_fills_is_replayed(actors, tmp_path, monkeypatch, caplog):
    """Set-up replays an actor fault as a round does: the encoder, killed for good while the stream is encoded into
    the feature cache, starts anew; only the rows not yet cached are encoded again, and the run ends as the
    fault-free one."""
    fault_free = runner.run(config(tmp_path / "a", **{"runtime.cache_dir": str(tmp_path / "cache_a")}),
                            actors=actors).metrics
    submitted = []
    encode = EncoderPool.encode

    def encode_then_kill(pool, rows):
        refs = encode(pool, rows)
        submitted.append(len(ray.get(rows)))
        if len(submitted) == 13:  # the third of the test split's chunks (the 300 training rows are cached already)
            ray.kill(actors.handle(pool.roles[0]), no_restart=True)
        return refs

    monkeypatch.setattr(EncoderPool, "encode", encode_then_kill)
    with caplog.at_level("WARNING", logger="memcl"):
        metrics = runner.run(config(tmp_path / "b", **{"runtime.cache_dir": str(tmp_path / "cache_b")}),
                             actors=actors).metrics
    assert sum("actor fault setting up the run" in r.getMessage() for r in caplog.records) == 1
    assert 500 < sum(submitted) < 500 + 200  # rows encoded: those lost with the actor again, not the whole split
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(fault_free["acc_matrix"]))
    assert metrics["prequential"] == fault_free["prequential"] and metrics["samples"] == fault_free["samples"]
