"""Which SGSE signals `memcl stress` compares (pipeline/stress.py `signals_to_compare`): the method's own first, and
no run whose label would not be the signal that runs. Checked before Ray starts."""

import pytest

from memcl.pipeline.config import ConfigError
from memcl.pipeline.stress import signals_to_compare


def signals(method: str | None = None, given: list[str] | None = None) -> list[str]:
    return signals_to_compare(10, False, {"method.name": method} if method else None, given)


def test_the_default_method_is_stressed_with_its_own_signal_first():
    assert signals() == ["reference", "paper"]


def test_a_method_that_fixes_its_signal_is_stressed_with_that_signal_only():
    assert signals("mars-memcl-paper-signal") == ["paper"]
    assert signals("mars") == ["paper"]


def test_a_given_list_runs_as_given_where_the_method_leaves_the_signal_open():
    assert signals("mars-memcl", ["paper"]) == ["paper"]


@pytest.mark.parametrize("method, given, names", [
    ("mars", ["reference"], ["mars", "method.sgse.signal = paper"]),
    ("derpp", None, ["derpp", "no SGSE"]),
])
def test_signals_that_would_not_run_are_refused_in_one_line(method, given, names):
    with pytest.raises(ConfigError) as err:
        signals(method, given)
    assert all(name in str(err.value) for name in names) and "\n" not in str(err.value)


def test_memory_growth_is_read_from_the_second_tenth_per_process_and_per_kind():
    """Growth runs from the tenth's sample (or from a restarted actor's first sample) to the last, for resident and
    unique memory alike; a process sampled once is left out."""
    from memcl.pipeline.stress import rss_growth

    rows = [{"pid.driver": 1, "rss.driver": 100 + i, "uss.driver": 50 + 2 * i,
             "pid.monitor": 7 if i < 6 else 8, "rss.monitor": 200 if i < 6 else 300 + i, "uss.monitor": 10,
             "pid.encoder": 3 if i < 9 else 4, "rss.encoder": 40, "uss.encoder": 20} for i in range(10)]
    rss, uss = rss_growth(rows, tenth=2), rss_growth(rows, tenth=2, kind="uss")
    assert rss["driver"] == pytest.approx(109 / 101 - 1) and uss["driver"] == pytest.approx(68 / 52 - 1)
    assert rss["monitor"] == pytest.approx(309 / 306 - 1) and uss["monitor"] == 0.0
    assert "encoder" not in rss and "encoder" not in uss
