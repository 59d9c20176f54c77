"""Long horizon through the real actor pipeline: memory stays bounded (run with `pytest -m stress`)."""

import csv
from pathlib import Path

import pytest

from pipeline.stress import stress

pytestmark = [pytest.mark.stress, pytest.mark.ray]


@pytest.mark.parametrize("task_free", [False, True])
def test_long_drift_stream_keeps_slots_and_memory_bounded(actors, tmp_path, task_free):
    result = stress(300, task_free, {"runtime.out": str(tmp_path)}, actors=actors)
    slots = result["slots"]
    assert slots["final"] <= slots["bound"], slots  # SGSE: E[S_T] <= S0 + N_T + alpha*M
    assert slots["final"] > slots["initial"]  # and it did grow for the injected novelty
    assert result["rss_holds"], result["rss_growth_10_to_100pct"]
    with open(Path(result["run_dir"]) / "stress.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 100 and int(rows[-1]["samples"]) == result["samples"]["stream"]
    assert result["samples"]["learned"] == result["samples"]["unique_learned"] == result["samples"]["stream"]
