from dataclasses import replace

import numpy as np
import pytest

from memcl_ops.mars.sgse import NoveltyMonitor, SGSEConfig, wilson_bounds

# The paper's confidence-quantile signal; the reference signal is tested in test_sgse_reference.py.
PAPER = SGSEConfig(signal="paper")

# docs/methods.md (SGSE), n = 20, z = 1.645
TABLE = {12: (.419, .758), 13: (.467, .798), 14: (.516, .836), 15: (.568, .873), 16: (.622, .907),
         17: (.678, .938), 18: (.738, .966), 19: (.804, .989), 20: (.881, 1.0)}


def test_wilson_matches_methods_table_and_closed_form():
    k = np.array(sorted(TABLE))
    lb, ub = wilson_bounds(k, 20, 1.645)
    # to 3 decimals: the table's LB(13) = .467 is 0.466497 rounded twice (via .4665), hence 5.1e-4
    np.testing.assert_allclose(lb, [TABLE[i][0] for i in k], atol=5.1e-4)
    np.testing.assert_allclose(ub, [TABLE[i][1] for i in k], atol=5.1e-4)
    # closed form at another z and n
    n, z, kk = 37, 2.576, 11
    p = kk / n
    centre, spread = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = wilson_bounds(kk, n, z)
    assert lo == pytest.approx((centre - spread) / (1 + z * z / n))
    assert hi == pytest.approx((centre + spread) / (1 + z * z / n))


def test_wilson_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for n in (5, 20, 50):
        for k in range(n + 1):
            for z, conf in ((1.645, 0.90), (1.96, 0.95)):
                ci = stats.binomtest(k, n).proportion_ci(method="wilson", confidence_level=conf)
                lo, hi = wilson_bounds(k, n, z)
                assert lo == pytest.approx(ci.low, abs=2e-4) and hi == pytest.approx(ci.high, abs=2e-4)


def test_default_decision_is_k_at_most_15_of_20():
    lb, _ = wilson_bounds(np.arange(21), 20, 1.645)
    assert np.flatnonzero(lb < SGSEConfig().tau_exp).max() == 15


DISTRIBUTIONS = {
    "beta82": lambda rng, n: rng.beta(8, 2, n),
    "uniform": lambda rng, n: rng.uniform(0, 1, n),
    "beta22": lambda rng, n: rng.beta(2, 2, n),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_false_expansion_rate_on_stationary_streams(name):
    """Cor. 1: per-test false expansion <= alpha = 0.05 (+ 3 binomial standard errors)."""
    tests = expansions = 0
    for seed in range(5):
        rng = np.random.default_rng(seed)
        monitor = NoveltyMonitor(PAPER)
        s = DISTRIBUTIONS[name](rng, 5000)
        monitor.observe(s, np.zeros((len(s), 2)))
        tests += monitor.tests
        expansions += monitor.expansions
    assert tests >= 300
    rate = expansions / tests
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / tests), (rate, tests)


def test_fast_lower_quantile_matches_numpy():
    rng = np.random.default_rng(2)
    fast = NoveltyMonitor(PAPER).signal.tracker
    for value in rng.uniform(size=50):
        fast.update(float(value))
        window = np.fromiter(fast.values, float)
        assert fast.window_quantile() == np.quantile(window, fast.level, method="lower")


def test_interpolated_window_quantile_breaks_the_guarantee():
    """The documented reason for the lower order statistic: w = 10 with interpolation over-fires."""
    rng = np.random.default_rng(0)
    s = rng.beta(8, 2, 20000)
    monitor = NoveltyMonitor(replace(PAPER, window_quantile="linear"))
    monitor.observe(s, np.zeros((len(s), 1)))
    assert monitor.expansions / monitor.tests > 0.1


def test_abrupt_drop_is_detected_within_three_blocks():
    trials, detected = 200, 0
    for seed in range(trials):
        rng = np.random.default_rng(1000 + seed)
        monitor = NoveltyMonitor(PAPER)
        monitor.observe(rng.beta(8, 2, 1000), np.zeros((1000, 2)))
        tests_before, expansions_before = monitor.tests, monitor.expansions
        after = rng.beta(2, 5, 400)
        for start in range(0, 400, 1):
            monitor.observe(after[start:start + 1], np.zeros((1, 2)))
            if monitor.expansions > expansions_before:
                break
        # the block open at the shift counts: it is the first test that sees post-shift trials
        detected += monitor.expansions > expansions_before and monitor.tests - tests_before <= 3
    assert detected / trials >= 0.95


def test_new_slot_centre_is_mean_of_low_confidence_features():
    cfg = replace(PAPER, window=1, beta=0.0, block_size=4, cooldown_blocks=0)
    monitor = NoveltyMonitor(cfg)
    # window 1, beta 0: the threshold before t is s_{t-1}; trials: 0.5>=0.9? no, 0.95>=0.5 yes, ...
    s = np.array([0.9, 0.5, 0.95, 0.2, 0.1])
    h = np.array([[9, 9], [1, 0], [5, 5], [0, 1], [0, 3]], dtype=float)
    found = monitor.observe(s, h)
    assert len(found) == 1 and found[0].successes == 1 and found[0].trials == 4
    low = (np.array([1, 0]) + np.array([0, 1]) + np.array([0, 3])) / 3
    np.testing.assert_allclose(found[0].centre, low, rtol=1e-6)


def test_cooldown_skips_one_block_after_expansion():
    monitor = NoveltyMonitor(replace(PAPER, block_size=5))
    rng = np.random.default_rng(0)
    monitor.observe(rng.beta(8, 2, 100), np.zeros((100, 1)))
    tests = monitor.tests
    monitor.observe(np.full(5 + 4, 0.01), np.zeros((9, 1)))
    assert monitor.expansions >= 1
    tests_after_expansion = monitor.tests
    # the next full block is a cooldown: no test
    monitor.observe(np.full(5, 0.01), np.zeros((5, 1)))
    assert monitor.tests == tests_after_expansion >= tests + 1


def test_quantile_orientations():
    rng = np.random.default_rng(0)
    s = rng.uniform(size=20000)
    rates = {}
    for mode in ("coverage", "upper"):
        monitor = NoveltyMonitor(replace(PAPER, quantile_mode=mode, window=200, block_size=10**9))
        monitor.observe(s, np.zeros((len(s), 1)))
        rates[mode] = np.mean(monitor.trials)
    assert abs(rates["coverage"] - 0.9) < 0.02 and abs(rates["upper"] - 0.1) < 0.02


def test_state_roundtrip_continues_identically():
    rng = np.random.default_rng(5)
    s = np.concatenate([rng.beta(8, 2, 537), rng.beta(2, 5, 300)])
    q = rng.normal(size=(len(s), 3))
    a = NoveltyMonitor(PAPER)
    a.observe(s[:401], q[:401])
    b = NoveltyMonitor(PAPER)
    b.restore({k: v.copy() for k, v in a.state().items()})
    ea, eb = a.observe(s[401:], q[401:]), b.observe(s[401:], q[401:])
    assert len(ea) == len(eb) >= 1
    for x, y in zip(ea, eb):
        np.testing.assert_array_equal(x.centre, y.centre)
        assert x.step == y.step
    with pytest.raises(ValueError, match="different configuration"):
        NoveltyMonitor(replace(PAPER, z=2.0)).restore(a.state())
