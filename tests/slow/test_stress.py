"""Long horizon through the real actor pipeline (run with `pytest -m stress`): memory stays bounded, every sample is
learned exactly once, and SGSE's slot bound, which the method as specified does not meet on recurring tasks."""

import csv
from pathlib import Path

import pytest

from pipeline.stress import stress

pytestmark = [pytest.mark.stress, pytest.mark.ray]


@pytest.fixture(scope="module", params=[False, True], ids=["task-aware", "task-free"])
def long_run(request, actors, tmp_path_factory):
    return stress(300, request.param, {"runtime.out": str(tmp_path_factory.mktemp("stress"))}, actors=actors)


def test_long_drift_stream_keeps_memory_bounded_and_learns_every_sample_once(long_run):
    assert long_run["rss_holds"], long_run["rss_growth_10_to_100pct"]
    assert long_run["slots"]["final"] > long_run["slots"]["initial"]  # it did grow for the injected novelty
    with open(Path(long_run["run_dir"]) / "stress.csv") as f:
        rows = list(csv.DictReader(f))
    # sampled every few rounds (task-free rounds hold several visits), enough to see tenths of the stream
    assert len(rows) >= 20 and int(rows[-1]["samples"]) == long_run["samples"]["stream"]
    samples = long_run["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"]


@pytest.mark.xfail(strict=True, reason="SGSE's bound fails on recurring tasks (155 > 125.8 at 300 visits); "
                                       "benchmarks/RESULTS.md, 'Long horizon', says why and what was tried")
def test_slot_count_stays_within_the_sgse_bound(long_run):
    slots = long_run["slots"]
    assert slots["final"] <= slots["bound"], slots  # SGSE: E[S_T] <= S0 + N_T + alpha*M
