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
