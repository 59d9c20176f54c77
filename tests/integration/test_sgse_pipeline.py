"""SGSE's reference signal in the real actor pipeline: the monitor gets the frozen features with each routed batch,
its decisions do not depend on how DCDA stage 1 retrains the router, and its references are reported memory."""

import pytest

from pipeline import runner
from pipeline.config import load_config

pytestmark = pytest.mark.ray

DRIFT = {"method.name": "mars-reference", "data.dataset": "drift", "data.drift.visits": 10, "data.drift.tasks": 4,
         "data.drift.dim": 16,
         "data.drift.train_per_visit": 100, "data.drift.test_per_task": 20, "data.drift.batch_size": 50,
         "data.drift.shifts": 1, "method.router.initial_slots": 4, "method.stage2.optim.epochs": 2,
         "runtime.progress": False, "runtime.checkpoint": False}


def test_expansions_are_invariant_to_stage1_and_references_are_reported(actors, tmp_path):
    runs = [runner.run(load_config(overrides={**DRIFT, "method.stage1.optim.epochs": epochs,
                                              "runtime.out": str(tmp_path)}), actors=actors)
            for epochs in (1, 4)]
    steps = [[e["test_step"] for e in m["slots"]["expansions"]] for m in runs]
    assert steps[0] == steps[1] and len(steps[0]) >= 4  # each of the 4 tasks expands once at least
    assert runs[0]["slots"]["monitor"] == runs[1]["slots"]["monitor"]
    # the stage-1 epochs did change the router (so the equality above is not vacuous)
    assert runs[0]["acc_matrix"] != runs[1]["acc_matrix"]
    # 16-d float32 rows, at most 64 per expanded slot, plus a counter each
    assert 0 < runs[0]["memory_bytes"]["monitor"] <= len(steps[0]) * (64 * 16 * 4 + 8)
