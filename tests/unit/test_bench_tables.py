"""`memcl bench` without Ray: the table arithmetic, the goal lines, method selection and the suites' configs.
(A real shrunken bench runs through the actors in tests/integration/test_methods_pipeline.py.)"""

import pytest

from memcl.pipeline import bench
from memcl.pipeline.config import load_config
from memcl.pipeline.suites import SUITES, suite
from memcl_ops.methods import METHODS, family_methods


def row(method, a_last, seed=0):
    return bench.RunRow(method, seed, {"a_last": a_last, "a_mean": a_last, "forgetting": 0.0, "bwt": 0.0},
                        [a_last], 1.0, 10, "")


def test_verdict_names_the_best_overall_and_per_role_and_where_mars_stands():
    rows = [row("mars", 0.70), row("mars", 0.72, 1), row("derpp", 0.75), row("derpp", 0.75, 1),
            row("simplecil", 0.77), row("simplecil", 0.77, 1), row("ewc", 0.5), row("ewc", 0.5, 1),
            row("joint", 0.74), row("joint", 0.74, 1)]
    lines = bench.verdict_lines(bench.aggregate(rows))
    assert lines[0] == ("- best overall: simplecil (A_last 77.00, baseline), 2.00 points ahead of derpp: more than one "
                        "seed std")
    assert lines[1] == "- best per role: baseline simplecil (77.00), upper-bound joint (74.00), memcl mars (71.00)"
    assert lines[2] == "- mars is 4 of 5; -6.00 points against the best baseline (simplecil)"


def test_table_sorts_by_a_last_and_shows_spread_only_with_two_seeds_or_more():
    one = bench.markdown(suite("fmnist-5x2"), bench.aggregate([row("mars", 0.70), row("derpp", 0.75)]), 1)
    body = [line for line in one.splitlines() if line.startswith("| ") and "method" not in line]
    assert [line.split("|")[1].strip() for line in body] == ["derpp", "mars"]
    assert not any("±" in line for line in body)
    two = bench.markdown(suite("fmnist-5x2"), bench.aggregate([row("mars", 0.70), row("mars", 0.72, 1)]), 2)
    assert "71.00 ± 1.41" in two


def test_default_methods_are_the_head_learners_and_unknown_ones_are_refused():
    chosen = suite("fmnist-5x2")
    config = load_config(overrides=chosen.overrides)
    assert bench.suite_methods(chosen, config) == family_methods("features")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        bench.suite_methods(chosen, config, ["mars", "nope"])
    with pytest.raises(ValueError, match="unknown bench suite 'cifar'"):
        suite("cifar")
    needs_tasks = [n for n, s in METHODS.items() if not s.task_free]
    if needs_tasks:
        task_free = load_config(overrides={"stream.task_free": True})
        assert bench.suite_methods(chosen, task_free, ["mars", *needs_tasks]) == ["mars"]


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_suite_override_lands_in_the_run_config(name):
    config = load_config(overrides=SUITES[name].overrides)
    for key, value in SUITES[name].overrides.items():
        node = config
        for part in key.split("."):
            node = getattr(node, part)
        assert node == value, key


def test_test_then_train_columns_and_their_verdict_beside_a_last():
    """The blind baseline wins next-batch accuracy and loses near-future: the verdict names each winner; a run
    without test-then-train figures shows '-'."""
    online = lambda method, a_last, preq, near: bench.RunRow(  # noqa: E731
        method, 0, {"a_last": a_last, "a_mean": a_last, "forgetting": 0.0, "bwt": 0.0, "prequential": preq,
                    "near_future": near, "let_go": 0.25}, [a_last], 1.0, 10, "")
    table = bench.aggregate([online("blind", 0.1, 0.9, 0.2), online("mars", 0.8, 0.6, 0.55), row("slda", 0.7)])
    assert "- test-then-train: best prequential blind (90.00), best near-future mars (55.00)" in bench.verdict_lines(
        table)
    zero = bench.aggregate([online("mars", 0.8, 0.0, 0.0), online("slda", 0.7, 0.0, 0.0)])
    assert not any("test-then-train" in line for line in bench.verdict_lines(zero))  # nothing to tell apart
    body = {line.split("|")[1].strip(): line for line in bench.markdown(suite("fmnist-5x2"), table, 1).splitlines()
            if line.startswith("| ") and "method" not in line}
    assert body["mars"].endswith("| 60.00 | 55.00 | 25.00 | 1.0 | 10 |")
    assert body["slda"].endswith("| - | - | - | 1.0 | 10 |")
