"""The compiled chain (`runtime.transport: compiled`, pipeline/compiled_chain.py) is a transport, not a method
change: every wiring it builds (memory and monitor, reference signal, no memory, two encoder replicas with a
padded last step, statistics summed in the encoders, cached features) gives the classic path's run exactly, and
the accounting of samples is the same (dead letters: tests/integration/test_bad_input.py draws both transports)."""

import threading

import numpy as np
import pytest

from memcl.pipeline import runner
from memcl.pipeline.config import load_config
from memcl_ops.methods import method_spec

pytestmark = pytest.mark.ray


def config(tmp_path, transport: str, **extra):
    return load_config(overrides={
        "data.dataset": "digits", "stream.tasks": 5, "stream.batch_size": 30, "stream.train_per_class": 45,
        "stream.test_per_class": 10, "encoder.spec.name": "tiny", "encoder.spec.dim": 32, "encoder.threads": 1,
        "method.router.initial_slots": 4, "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 3,
        "runtime.cache_dir": "", "runtime.out": str(tmp_path), "runtime.progress": False,
        "runtime.actor_threads": 1, "runtime.checkpoint": False, "runtime.transport": transport, **extra})


# digits in 5 tasks of 2 classes, 45 rows per class, batches of 30: 3 batches a visit, so two encoder
# replicas leave an empty place in the last step of every round.
CASES = {
    "mars-memcl": {},
    "mars over cached features": {"runtime.cache_dir": "CACHE"},
    "mars, two replicas, one batch in flight": {"encoder.replicas": 2, "runtime.max_in_flight": 1},
    "mars-memcl-paper-signal": {"method.name": "mars-memcl-paper-signal"},
    "mars-no-sgse, two replicas": {"method.name": "mars-no-sgse", "encoder.replicas": 2},
    "derpp, no memory": {"method.name": "derpp"},
    "analytic-rp, statistics in two replicas": {"method.name": "analytic-rp", "encoder.replicas": 2,
                                                "method.analytic.expansion_dim": 128},
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_chain_gives_the_classic_run(actors, tmp_path, case):
    extra = {k: str(tmp_path / "cache") if v == "CACHE" else v for k, v in CASES[case].items()}
    run_config = config(tmp_path, "actors", **extra)
    classic = runner.run(run_config, actors=actors).metrics
    compiled = runner.run(config(tmp_path, "compiled", **extra), actors=actors).metrics
    assert classic["summary"]["a_mean"] > 0.15  # above the 10 % of chance: the runs learned (not two NaN runs)
    np.testing.assert_array_equal(np.array(compiled["acc_matrix"]), np.array(classic["acc_matrix"]))
    assert compiled["slots"]["history"] == classic["slots"]["history"]
    spec = method_spec(run_config.method.name)
    if spec.sgse and spec.resolve(run_config.method).sgse.signal == "reference":
        # SGSE's reference signal adds slots mid-stream on this stream (the MARS paper's signal does not): batches were
        # routed after expansions, across replicas and past an empty place
        assert classic["slots"]["history"][-1][1] > classic["slots"]["history"][0][1]
    assert compiled["samples"] == classic["samples"]
    assert compiled["memory_bytes"] == classic["memory_bytes"]
    # test-then-train, batch by batch (the compiled chain's block keeps where each batch begins)
    assert compiled["prequential"] == classic["prequential"] and classic["prequential"]["rows"]


def test_batches_larger_than_rays_default_channel_end_the_run(actors, tmp_path):
    """Six feature batches of 1.3 MB a round, past the 1 MB Ray gives a channel: a channel that had to grow mid-run
    never let the graph's teardown finish (the cached-features bench hung there; with one batch a round it did
    not). The run ends, and gives the classic run."""
    extra = {"data.dataset": "drift", "data.drift.visits": 3, "data.drift.tasks": 3, "data.drift.dim": 640,
             "data.drift.train_per_visit": 3120, "data.drift.batch_size": 520, "data.drift.test_per_task": 20,
             "data.drift.shifts": 0, "method.stage1.optim.epochs": 1, "method.stage2.optim.epochs": 1}
    runs: dict[str, dict] = {}

    def compiled_run():
        runs["compiled"] = runner.run(config(tmp_path, "compiled", **extra), actors=actors).metrics

    thread = threading.Thread(target=compiled_run, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the compiled run did not end within 300 s (its graph's teardown hung)"
    classic = runner.run(config(tmp_path, "actors", **extra), actors=actors).metrics
    np.testing.assert_array_equal(np.array(runs["compiled"]["acc_matrix"]), np.array(classic["acc_matrix"]))
    assert runs["compiled"]["samples"] == classic["samples"]
