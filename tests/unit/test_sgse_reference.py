"""SGSE's reference signal (memcl_ops/mars/sgse.py, docs/methods.md "SGSE"): level-α block tests on exchangeable
streams, decisions that read no trained parameter, detection of new regimes, exact state round-trips."""

import io
from dataclasses import replace

import numpy as np
import pytest

from memcl_ops.mars.sgse import NoveltyMonitor, SGSEConfig, beta_binomial_cdf, conformal_rank, max_expanding_successes

CONFIG = SGSEConfig(signal="reference")
AGGREGATES = replace(CONFIG, reference_bytes=0)  # no per-sample feature kept: per-slot means and distances
MAX_K = max_expanding_successes(CONFIG.block_size, CONFIG.z, CONFIG.tau_exp)


def mixture(rng: np.random.Generator, n: int, means: np.ndarray) -> np.ndarray:
    """n rows from an equal-weight Gaussian mixture with unit noise."""
    return (means[rng.integers(len(means), size=n)] + rng.normal(size=(n, means.shape[1]))).astype(np.float32)


def observe(monitor: NoveltyMonitor, x: np.ndarray, batch: int = 100) -> list:
    found = []
    for a in range(0, len(x), batch):
        rows = x[a:a + batch]
        found += monitor.observe(np.zeros(len(rows)), rows)
    return found


def test_beta_binomial_cdf_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for n, a, b in ((20, 16, 1), (20, 31, 2), (7, 2.5, 3.5)):
        for k in range(n + 1):
            assert beta_binomial_cdf(k, n, a, b) == pytest.approx(stats.betabinom.cdf(k, n, a, b), rel=1e-9)


@pytest.mark.parametrize("calibration", [16, 24, 32, 64])
def test_conformal_rank_is_the_smallest_level_alpha_rank_by_simulation(calibration):
    """With the threshold at the κ-th smallest of c exchangeable scores, a block of 20 new scores fails the Wilson
    test with probability <= α, and at rank κ - 1 with more than α (Monte Carlo, 20 000 seeded draws each)."""
    kappa = conformal_rank(calibration, 20, MAX_K, 0.05)
    assert kappa is not None
    rng = np.random.default_rng(calibration)

    def fail_rate(rank: int) -> float:
        scores = rng.random((20_000, calibration + 20))
        threshold = np.sort(scores[:, :calibration], axis=1)[:, rank - 1:rank]
        successes = (scores[:, calibration:] <= threshold).sum(axis=1)
        return float((successes <= MAX_K).mean())

    se = np.sqrt(0.05 * 0.95 / 20_000)
    assert fail_rate(kappa) <= 0.05 + 3 * se
    if kappa > 1:
        assert fail_rate(kappa - 1) > 0.05 - 3 * se
    assert beta_binomial_cdf(MAX_K, 20, kappa, calibration + 1 - kappa) <= 0.05


def test_too_few_calibration_rows_accept_nothing():
    """Below 15 calibration rows no rank keeps a block of 20 at level 0.05: such a reference accepts nothing."""
    assert all(conformal_rank(c, 20, MAX_K, 0.05) is None for c in range(15))
    assert conformal_rank(15, 20, MAX_K, 0.05) == 15


@pytest.mark.parametrize("kept", [CONFIG, AGGREGATES], ids=["rows", "aggregates"])
@pytest.mark.parametrize(("dim", "classes", "size"), [(8, 1, 64), (32, 5, 64), (128, 3, 32), (16, 10, 128)])
def test_false_expansion_rate_per_test_is_at_most_alpha_on_exchangeable_streams(dim, classes, size, kept):
    """After the first block (nothing is covered yet: one expansion), an iid stream from one mixture expands at
    most α per test (+ 3 binomial standard errors), over 8 seeded streams; with rows kept, and with aggregates only
    (a running mean, against which the calibration distances were measured as it moved)."""
    config = replace(kept, reference_size=size)
    tests = false = 0
    for seed in range(8):
        rng = np.random.default_rng([dim, classes, size, seed])
        means = rng.normal(scale=3.0, size=(classes, dim))
        monitor = NoveltyMonitor(config)
        found = observe(monitor, mixture(rng, 3000, means))
        assert found and found[0].step == config.block_size  # the first block is novel
        tests += monitor.tests - 1
        false += len(found) - 1
    assert tests >= 800
    rate = false / tests
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / tests), (rate, tests)


def test_decisions_read_only_the_frozen_features():
    """Router retraining changes confidences and queries, never a decision: the same features with other
    confidences and queries give the same tests and expansion steps (the keys follow the queries)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([mixture(rng, 1500, rng.normal(scale=3, size=(2, 16))) for _ in range(4)])
    runs = []
    for trial in range(3):
        other = np.random.default_rng(trial)
        monitor = NoveltyMonitor(CONFIG)
        found = []
        for a in range(0, len(x), 100):
            rows = x[a:a + 100]
            found += monitor.observe(other.random(len(rows)), rows)
        runs.append(([e.step for e in found], list(monitor.test_steps), [e.successes for e in found]))
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0][0]) >= 4  # one expansion per regime at least


@pytest.mark.parametrize("kept", [CONFIG, AGGREGATES], ids=["rows", "aggregates"])
def test_new_regimes_are_detected_within_three_blocks(kept):
    """A new class region after a stationary stretch expands within 3 blocks in >= 95 % of 100 seeded trials."""
    detected = 0
    for seed in range(100):
        rng = np.random.default_rng(10_000 + seed)
        means = rng.normal(scale=3.0, size=(2, 32))
        monitor = NoveltyMonitor(kept)
        observe(monitor, mixture(rng, 1000, means))
        before, start = monitor.expansions, monitor.steps
        shifted = means + 12.0 * rng.normal(size=32) / np.sqrt(32)
        found = observe(monitor, mixture(rng, 200, shifted))
        detected += any(start < e.step <= start + 3 * CONFIG.block_size for e in found) and monitor.expansions > before
    assert detected >= 95


@pytest.mark.parametrize("kept", [CONFIG, AGGREGATES], ids=["rows", "aggregates"])
def test_a_recurring_regime_is_judged_by_its_own_reference(kept):
    """Tasks that recur do not expand again: A, B, A, B, ... costs two expansions, not one per visit."""
    rng = np.random.default_rng(7)
    regimes = [rng.normal(scale=3.0, size=(2, 24)) + offset for offset in (0.0, 15.0)]
    monitor = NoveltyMonitor(kept)
    for visit in range(20):
        observe(monitor, mixture(rng, 300, regimes[visit % 2]))
    assert monitor.expansions <= 2 + 0.05 * monitor.tests


def through_npz(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("budget", [2**20, 1500, 0])
def test_state_round_trip_mid_block_continues_identically(budget):
    """With every reference's rows, with some compacted (1,500 bytes hold 31 rows of 12 floats) and with none."""
    rng = np.random.default_rng(11)
    x = np.concatenate([mixture(rng, 730, rng.normal(scale=3, size=(3, 12))) for _ in range(3)])
    config = replace(CONFIG, reference_bytes=budget)
    a = NoveltyMonitor(config)
    a.observe(np.zeros(1097), x[:1097])  # mid-block, references built
    assert a.nbytes() > 0 and a.trials
    b = NoveltyMonitor(config)
    b.restore(through_npz(a.state()))
    ea, eb = a.observe(np.zeros(len(x) - 1097), x[1097:]), b.observe(np.zeros(len(x) - 1097), x[1097:])
    assert len(ea) == len(eb) >= 1 and a.test_steps == b.test_steps
    for e, f in zip(ea, eb):
        np.testing.assert_array_equal(e.centre, f.centre)
        assert e.step == f.step
    for key, value in a.state().items():
        np.testing.assert_array_equal(value, b.state()[key], err_msg=key)


def test_reported_bytes_are_the_arrays_kept():
    rng = np.random.default_rng(1)
    monitor = NoveltyMonitor(CONFIG)
    observe(monitor, mixture(rng, 2000, rng.normal(scale=3, size=(2, 10))))
    refs = monitor.signal.references
    assert refs and monitor.memory_bytes() == {"rows": sum(r.bank.nbytes + r.calibration.nbytes for r in refs),
                                               "aggregates": 16 * len(refs) + 8}
    assert all(len(r.bank) <= CONFIG.reference_size // 2 for r in refs)


@pytest.mark.parametrize("budget", [0, 3000, 10_000])
def test_per_sample_features_never_exceed_the_byte_budget(budget):
    """Six regimes, each starting a reference: after every batch the references' rows fit `reference_bytes`, the
    references past it keep only their summary (a mean, `aggregate_rank` directions, a count and a trace) and at most
    m/2 distances, and the ones compacted are those refreshed longest ago (the regime streaming now keeps its rows
    whenever the budget holds them)."""
    rng = np.random.default_rng(5)
    dim = 10
    config = replace(CONFIG, reference_bytes=budget)
    monitor = NoveltyMonitor(config)
    regimes = [rng.normal(scale=3.0, size=(2, dim)) + rng.normal(scale=10.0, size=dim) for _ in range(6)]
    for regime in regimes:
        x = mixture(rng, 400, regime)
        for a in range(0, len(x), 40):
            monitor.observe(np.zeros(40), x[a:a + 40])
            held = monitor.memory_bytes()
            assert held["rows"] <= budget
            assert held["rows"] == sum(r.row_bytes() for r in monitor.signal.references)
    refs, refreshed = monitor.signal.references, monitor.signal.refreshed
    assert len(refs) >= 6
    compacted = [j for j, r in enumerate(refs) if r.compacted]
    assert all(r.row_bytes() == 0 and len(r.scores) <= config.reference_size // 2
               and r.summary.mean.shape == (dim,) and r.summary.factor.shape[1] <= config.aggregate_rank
               and r.aggregate_bytes() == 8 + r.scores.nbytes + 4 * dim * (1 + r.summary.factor.shape[1]) + 16
               for r in (refs[j] for j in compacted))
    kept = [j for j in range(len(refs)) if j not in compacted]
    assert compacted == list(range(len(compacted)))  # the regimes came one after another: the oldest went first
    full = config.reference_size * dim * 4  # one full reference's rows
    assert compacted and (not kept) == (budget < full) and (budget < full or refreshed.index(max(refreshed)) in kept)


def test_a_feature_row_per_confidence():
    with pytest.raises(ValueError, match="3 confidences for 2 feature rows"):
        NoveltyMonitor(CONFIG).observe(np.zeros(3), np.zeros((2, 4)))


def test_distances_on_a_torch_device_give_the_numpy_decisions():
    """The path a GPU-placed monitor takes (torch where the banks were copied, here the CPU's torch) scores every
    sample as the numpy path does, to float rounding, and so expands at the same steps, through new regimes and
    recurring ones."""
    import torch

    rng = np.random.default_rng(3)
    regimes = [rng.normal(scale=3.0, size=(3, 24)) + offset for offset in (0.0, 12.0, -12.0)]
    numpy_path, torch_path = NoveltyMonitor(CONFIG), NoveltyMonitor(CONFIG, torch.device("cpu"))
    for visit in range(7):
        x = mixture(rng, 400, regimes[visit % 3])
        for a in range(0, len(x), 100):
            rows = x[a:a + 100]
            if numpy_path.signal.references:
                np.testing.assert_allclose(torch_path.signal.scores(rows), numpy_path.signal.scores(rows), rtol=1e-4)
                active, *_, on_device = torch_path.signal._stacked
                assert on_device is not None or not active  # the torch path scored them
            for monitor in (numpy_path, torch_path):
                monitor.observe(np.zeros(len(rows)), rows)
    assert numpy_path.expansions >= 3 and torch_path.test_steps == numpy_path.test_steps
    assert [len(r.bank) for r in torch_path.signal.references] == [len(r.bank) for r in numpy_path.signal.references]
    assert torch_path.expansions == numpy_path.expansions
