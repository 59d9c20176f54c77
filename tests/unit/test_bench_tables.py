"""`memcl bench` without Ray: the table arithmetic, the goal lines, method selection and the suites' configs.
(A real shrunken bench runs through the actors in tests/integration/test_methods_pipeline.py.)"""

import pytest

from memcl.pipeline import bench
from memcl.pipeline.config import ConfigError, load_config
from memcl.pipeline.suites import SUITES, suite
from memcl_ops.methods import METHODS, family_methods


def row(method, a_last, seed=0, label="", memory=10):
    return bench.RunRow(method, seed, {"a_last": a_last, "a_mean": a_last, "forgetting": 0.0, "bwt": 0.0},
                        [a_last], 1.0, memory, "", label)


def test_verdict_names_the_best_overall_and_per_role_and_where_mars_stands():
    rows = [row("mars-memcl", 0.70), row("mars-memcl", 0.72, 1), row("derpp", 0.75), row("derpp", 0.75, 1),
            row("simplecil", 0.77), row("simplecil", 0.77, 1), row("ewc", 0.5), row("ewc", 0.5, 1),
            row("joint", 0.74), row("joint", 0.74, 1), row("mars", 0.6), row("mars", 0.6, 1)]
    lines = bench.verdict_lines(bench.aggregate(rows))
    assert lines[0] == ("- best overall: simplecil (A_last 77.00, baseline), 2.00 points ahead of derpp: more than one "
                        "seed std")
    assert lines[1] == ("- best per role: baseline simplecil (77.00), upper-bound joint (74.00), memcl mars-memcl "
                        "(71.00), paper mars (60.00)")
    assert lines[2] == "- mars is 5 of 6; -17.00 points against the best baseline (simplecil)"
    assert lines[3] == "- mars-memcl is 4 of 6; -6.00 points against the best baseline (simplecil)"


def test_at_equal_bytes_memcls_best_is_compared_with_every_baseline_and_the_buffered_one_at_its_bytes():
    """DER++ at memcl's best's bytes replaces the default DER++ in the comparison, and the shortfall is stated."""
    rows = [row("analytic", 0.80, memory=900), row("mars-memcl", 0.78, memory=2000), row("derpp", 0.79, memory=500),
            row("derpp", 0.83, label="derpp@analytic", memory=880), row("simplecil", 0.70, memory=50),
            row("derpp", 0.84, label="derpp@mars-memcl", memory=1990)]
    table = bench.aggregate(rows)
    assert table["derpp@analytic"]["method"] == "derpp" and bench.role(table, "derpp@analytic") == "baseline"
    line = bench.equal_bytes_lines(table, sorted(table, key=lambda m: -table[m]["a_last"][0]))
    assert line == ["- at equal bytes, memcl's best (analytic, 80.00 at 900 bytes) >= every baseline: false: "
                    "derpp@analytic ahead by 3.00"]
    rows[3] = row("derpp", 0.79, label="derpp@analytic", memory=880)
    table = bench.aggregate(rows)
    assert bench.equal_bytes_lines(table, sorted(table, key=lambda m: -table[m]["a_last"][0]))[0].endswith(": true")
    assert bench.equal_bytes_lines(bench.aggregate(rows[:3]), ["analytic", "derpp", "mars-memcl"]) == []


def test_the_buffer_within_a_byte_budget_is_the_largest_that_fits():
    """From a DER++ run's bytes: every buffered row costs the same, the rest stays; a buffer beyond the rows learned
    holds them all, and a budget below the rest is refused."""
    config = load_config(overrides={"method.name": "derpp", "method.derpp.buffer_size": 500})
    metrics = {"samples": {"learned": 2000}, "memory_bytes": {"head.head": 1000, "head.buffer": 500 * 40,
                                                                 "prototypes": 300}}
    assert bench.buffer_within(config, metrics, 1300 + 40 * 750 + 39) == (750, 1300 + 40 * 750)
    assert bench.buffer_within(config, metrics, 1e9) == (2000, 1300 + 40 * 2000)
    with pytest.raises(ConfigError, match="do not hold"):
        bench.buffer_within(config, metrics, 1339)
    small = {"samples": {"learned": 300}, "memory_bytes": {"head.head": 1000, "head.buffer": 300 * 40}}
    assert bench.buffer_within(config, small, 1000 + 40 * 100) == (100, 1000 + 40 * 100)
    sized = bench.with_setting(config.method, "derpp.buffer_size", 750)
    assert sized.derpp.buffer_size == 750 and sized.stage2 == config.method.stage2


def test_equal_bytes_needs_its_method_among_those_compared_and_a_buffered_one():
    assert bench.check_equal_bytes(["mars-memcl", "derpp"], ["mars-memcl"]) == ["derpp"]
    with pytest.raises(ConfigError, match="not among the methods compared"):
        bench.check_equal_bytes(["derpp"], ["mars-memcl"])
    with pytest.raises(ConfigError, match="rehearsal buffer"):
        bench.check_equal_bytes(["mars-memcl", "ewc"], ["mars-memcl"])


def test_table_sorts_by_a_last_and_shows_spread_only_with_two_seeds_or_more():
    one = bench.markdown(suite("fmnist-5x2"), bench.aggregate([row("mars-memcl", 0.70), row("derpp", 0.75)]), 1)
    body = [line for line in one.splitlines() if line.startswith("| ") and "method" not in line]
    assert [line.split("|")[1].strip() for line in body] == ["derpp", "mars-memcl"]
    assert not any("±" in line for line in body)
    two = bench.markdown(suite("fmnist-5x2"),
                         bench.aggregate([row("mars-memcl", 0.70), row("mars-memcl", 0.72, 1)]), 2)
    assert "71.00 ± 1.41" in two


def test_default_methods_are_the_head_learners_and_unknown_ones_are_refused():
    chosen = suite("fmnist-5x2")
    config = load_config(overrides=chosen.overrides)
    assert bench.suite_methods(chosen, config) == family_methods("features")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        bench.suite_methods(chosen, config, ["mars-memcl", "nope"])
    with pytest.raises(ValueError, match="unknown bench suite 'cifar'"):
        suite("cifar")
    needs_tasks = [n for n, s in METHODS.items() if not s.task_free]
    if needs_tasks:
        task_free = load_config(overrides={"stream.task_free": True})
        assert bench.suite_methods(chosen, task_free, ["mars-memcl", *needs_tasks]) == ["mars-memcl"]


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
    table = bench.aggregate([online("blind", 0.1, 0.9, 0.2), online("mars-memcl", 0.8, 0.6, 0.55), row("slda", 0.7)])
    assert ("- test-then-train: best prequential blind (90.00), best near-future mars-memcl (55.00)"
            in bench.verdict_lines(table))
    zero = bench.aggregate([online("mars-memcl", 0.8, 0.0, 0.0), online("slda", 0.7, 0.0, 0.0)])
    assert not any("test-then-train" in line for line in bench.verdict_lines(zero))  # nothing to tell apart
    body = {line.split("|")[1].strip(): line for line in bench.markdown(suite("fmnist-5x2"), table, 1).splitlines()
            if line.startswith("| ") and "method" not in line}
    assert body["mars-memcl"].endswith("| 60.00 | 55.00 | 25.00 | 1.0 | 10 |")
    assert body["slda"].endswith("| - | - | - | 1.0 | 10 |")
