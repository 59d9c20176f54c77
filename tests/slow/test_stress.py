"""Long horizon through the real actor pipeline (run with `pytest -m stress`): memory stays bounded, every sample is
learned exactly once, and the default method's SGSE keeps its guarantees (its reference signal; the MARS paper's
signal, `mars-memcl-paper-signal`, does not on recurring tasks: kept as a measured expected failure)."""

import csv
from pathlib import Path

import pytest

from memcl.pipeline.stress import compare, stress

pytestmark = [pytest.mark.stress, pytest.mark.ray, pytest.mark.timeout(3600)]  # 300 visits per run


def long_run(task_free: bool, actors, tmp_path_factory, **overrides) -> dict:
    return stress(300, task_free, {"runtime.out": str(tmp_path_factory.mktemp("stress")), **overrides},
                  actors=actors)


@pytest.fixture(scope="module", params=[False, True], ids=["task-aware", "task-free"])
def default_run(request, actors, tmp_path_factory):
    """The default method, no signal named: what a user who stress-tests `memcl stress` gets."""
    return long_run(request.param, actors, tmp_path_factory)


@pytest.fixture(scope="module")
def paper_run(actors, tmp_path_factory):
    return long_run(False, actors, tmp_path_factory, **{"method.name": "mars-memcl-paper-signal"})


def test_long_drift_stream_keeps_memory_bounded_and_learns_every_sample_once(default_run):
    assert default_run["rss_holds"], default_run["rss_growth_10_to_100pct"]
    with open(Path(default_run["run_dir"]) / "stress.csv") as f:
        rows = list(csv.DictReader(f))
    # sampled every few rounds (task-free rounds hold several visits), enough to see tenths of the stream
    assert len(rows) >= 20 and int(rows[-1]["samples"]) == default_run["samples"]["stream"]
    samples = default_run["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"]


def test_default_method_keeps_the_bound_the_level_and_detects_every_novel_event(default_run):
    assert default_run["signal"] == "reference"
    slots, novelty = default_run["slots"], default_run["novelty"]
    assert slots["initial"] < slots["final"] <= slots["bound"], slots  # E[S_T] <= S0 + N_T + alpha*M
    assert novelty["false_rate"] <= 0.05, novelty
    assert novelty["detection_rate"] >= 0.95, novelty


@pytest.mark.xfail(strict=True, reason="the MARS paper's confidence signal breaks SGSE's bound on recurring tasks "
                                       "(benchmarks/RESULTS.md, 'Long horizon'; docs/methods.md, SGSE)")
def test_paper_signal_keeps_the_bound(paper_run):
    assert paper_run["signal"] == "paper"
    slots = paper_run["slots"]
    assert slots["final"] <= slots["bound"], slots


def test_chaos_mode_survives_its_kills_and_ends_with_the_fault_free_result(tmp_path):
    # a kill every 5 s: slower than a revival and its replayed round here (kills every 3 s land in most replays, and
    # six faults in a row stop the run by design: benchmarks/RESULTS.md, "Chaos mode")
    fault_free, chaos = compare(300, False, {"runtime.out": str(tmp_path)}, ["reference"], chaos=5)
    assert "same_as_fault_free" not in fault_free and fault_free["kills"] == 0
    assert chaos["kills"] >= 5 and chaos["recoveries"] >= 1, chaos
    assert chaos["same_as_fault_free"] and chaos["slots"]["holds"]
    samples = chaos["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"]
