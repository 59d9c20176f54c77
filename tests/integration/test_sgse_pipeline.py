"""SGSE's reference signal in the real actor pipeline: the monitor gets the frozen features with each routed batch,
its decisions do not depend on how DCDA stage 1 retrains the router, its references are reported memory, and they
survive the monitor's death mid-visit (restored and replayed like every other actor's state)."""

import numpy as np
import pytest

from memcl.pipeline import runner
from memcl.pipeline.config import load_config
from tests.killing import killer

pytestmark = pytest.mark.ray

DRIFT = {"method.name": "mars-memcl", "data.dataset": "drift", "data.drift.visits": 10, "data.drift.tasks": 4,
         "data.drift.dim": 16, "data.drift.train_per_visit": 100, "data.drift.test_per_task": 20,
         "data.drift.batch_size": 50, "data.drift.shifts": 1, "method.router.initial_slots": 4,
         "method.stage2.optim.epochs": 2, "runtime.progress": False, "runtime.checkpoint": False}


def drift_run(actors, out, epochs: int, on_batch=None, **more) -> dict:
    config = load_config(overrides={**DRIFT, "method.stage1.optim.epochs": epochs, "runtime.out": str(out), **more})
    return runner.run(config, actors=actors, on_batch=on_batch).metrics


@pytest.fixture(scope="module")
def uninterrupted(actors, tmp_path_factory):
    return drift_run(actors, tmp_path_factory.mktemp("sgse"), 1)


def test_expansions_are_invariant_to_stage1_and_references_are_reported(actors, uninterrupted, tmp_path):
    runs = [uninterrupted, drift_run(actors, tmp_path, 4)]
    steps = [[e["test_step"] for e in m["slots"]["expansions"]] for m in runs]
    assert steps[0] == steps[1] and len(steps[0]) >= 4  # each of the 4 tasks expands once at least
    assert runs[0]["slots"]["monitor"] == runs[1]["slots"]["monitor"]
    # the stage-1 epochs did change the router (so the equality above is not vacuous)
    assert runs[0]["acc_matrix"] != runs[1]["acc_matrix"]
    # 16-d float32 rows, at most 64 per expanded slot; a counter each and when each was refreshed
    assert 0 < runs[0]["memory_bytes"]["monitor.rows"] <= len(steps[0]) * 64 * 16 * 4
    assert runs[0]["memory_bytes"]["monitor.aggregates"] == 16 * len(steps[0]) + 8


def test_a_byte_budget_of_zero_keeps_no_feature_row_in_the_report(actors, uninterrupted, tmp_path):
    """With `sgse.reference_bytes = 0` the memory report holds no reference row, only each slot's aggregates (a
    summary of 16 + 4 x 16 floats, a count and a trace, at most 32 distances), and the stream still expands for each
    of its 4 tasks."""
    metrics = drift_run(actors, tmp_path, 1, **{"method.sgse.reference_bytes": 0})
    expanded = len(metrics["slots"]["expansions"])
    assert metrics["memory_bytes"]["monitor.rows"] == 0 and expanded >= 4
    assert 0 < metrics["memory_bytes"]["monitor.aggregates"] <= expanded * (8 + 5 * 16 * 4 + 16 + 32 * 4 + 8) + 8


def test_monitor_killed_mid_visit_gives_the_uninterrupted_run(actors, uninterrupted, tmp_path):
    kill_monitor, killed = killer(actors, "monitor", (6, 1), restart=False)
    metrics = drift_run(actors, tmp_path, 1, kill_monitor)
    assert killed and metrics["recoveries"] >= 1
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"]), np.array(uninterrupted["acc_matrix"]))
    assert metrics["slots"]["expansions"] == uninterrupted["slots"]["expansions"]
    assert metrics["memory_bytes"] == uninterrupted["memory_bytes"]
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"]
