"""The distributed analytic head through real Ray actors: two encoder replicas each sum the statistics of the batches
they encode, the MemoryManager merges them, and the head solved from the merge is bit for bit the head a single
learner gets by summing every batch itself; a replica killed mid-stream changes nothing."""

from pathlib import Path

import numpy as np
import pytest

from memcl.pipeline import checkpoint, runner
from memcl.pipeline.config import load_config
from tests.killing import killer

pytestmark = pytest.mark.ray

TASKS = 5


def config(tmp_path, **extra):
    return load_config(overrides={
        "data.dataset": "digits", "stream.tasks": TASKS, "stream.batch_size": 20, "stream.train_per_class": 20,
        "stream.test_per_class": 20, "encoder.spec.name": "tiny", "encoder.spec.dim": 32, "encoder.threads": 1,
        "encoder.replicas": 2, "method.name": "analytic-rp", "method.analytic.expansion_dim": 256,
        "runtime.cache_dir": "", "runtime.out": str(tmp_path), "runtime.progress": False, "runtime.actor_threads": 1,
        **extra})


def last_checkpoint(metrics: dict) -> dict:
    return checkpoint.read(Path(metrics["run_dir"]) / "checkpoints" / f"ckpt-{TASKS - 1:06d}.npz")[0]


# the exact joint head, and one that forgets (the MemoryManager decays the merged total), λ and the nearest-mean
# weight chosen on the reservoir either way
VARIANTS = {"joint": {}, "forgetting": {"method.analytic.half_life": 60,
                                        "method.analytic.mean_weight_grid": [0.0, 1.0, 10.0]}}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request):
    return VARIANTS[request.param]


@pytest.fixture(scope="module")
def single(actors, tmp_path_factory, variant):
    """The reference: the same replicas encode, the head learner sums every batch itself."""
    return runner.run(config(tmp_path_factory.mktemp("single"), **{"method.analytic.accumulate_in": "learner"},
                             **variant), actors=actors).metrics


def assert_same_head(merged: dict, single: dict) -> None:
    """The final statistics and W bit for bit, and the same prediction after every task (the accuracy matrix)."""
    m, s = last_checkpoint(merged), last_checkpoint(single)
    for key in ("gram_upper", "targets", "classes", "count"):
        np.testing.assert_array_equal(m["memory"][f"statistics.{key}"], s["stage2"][f"learner.head.stats.{key}"],
                                      err_msg=key)
    for key in ("weight", "weight_classes", "lambda", "mean_weight"):
        np.testing.assert_array_equal(m["stage2"][f"learner.head.{key}"], s["stage2"][f"learner.head.{key}"],
                                      err_msg=key)
    np.testing.assert_array_equal(np.array(merged["acc_matrix"]), np.array(single["acc_matrix"]))


def test_statistics_summed_by_two_replicas_and_merged_give_the_single_learner_head_bit_for_bit(actors, tmp_path,
                                                                                             single, variant):
    merged = runner.run(config(tmp_path, **variant), actors=actors).metrics
    busy = merged["actor_busy_seconds"]
    assert {"encoder0.accumulate", "encoder1.accumulate"} <= set(busy), busy  # both replicas summed a share
    assert not any(k.endswith(".accumulate") for k in single["actor_busy_seconds"])
    assert_same_head(merged, single)
    assert merged["summary"]["a_last"] > 0.3
    # the MemoryManager owns (and reports) the statistics; the learner keeps only W
    assert merged["memory_bytes"]["analytic_statistics"] == single["memory_bytes"]["head.statistics"] > 0
    assert merged["memory_bytes"]["head.statistics"] == 0 and "analytic_statistics" not in single["memory_bytes"]


@pytest.mark.slow  # one more run through the actor pipeline; the recovery machinery has its own default-tier tests
def test_a_replica_killed_mid_stream_is_recovered_and_the_head_is_unchanged(actors, tmp_path, single, variant):
    kill_second_replica, done = killer(actors, "encoder1", (2, 1), restart=True)
    merged = runner.run(config(tmp_path, **variant), actors=actors, on_batch=kill_second_replica).metrics
    assert done and merged["recoveries"] >= 1
    assert_same_head(merged, single)
