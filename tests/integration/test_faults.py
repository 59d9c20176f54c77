"""Actor faults at seeded random points: the run recovers, learns every sample exactly once, and ends with the
accuracy matrix of an uninterrupted run."""

import numpy as np
import pytest

from memcl.pipeline import runner
from memcl.pipeline.config import load_config
from tests.killing import killer

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
