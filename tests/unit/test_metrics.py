import numpy as np
import pytest

from memcl_ops import metrics

# a[i][j]: after task i, on task j (NaN above the diagonal except where FWT needs it)
ACC = np.array([
    [0.90, 0.10, np.nan],
    [0.70, 0.80, 0.05],
    [0.60, 0.75, 0.95],
])


def test_hand_computed_values():
    assert metrics.final_accuracy(ACC) == pytest.approx((0.60 + 0.75 + 0.95) / 3)
    assert metrics.average_incremental_accuracy(ACC) == pytest.approx(
        (0.90 + (0.70 + 0.80) / 2 + (0.60 + 0.75 + 0.95) / 3) / 3)
    # forgetting: task0 best before last = max(.9,.7) = .9 -> .3; task1 best = .8 -> .05
    assert metrics.forgetting(ACC) == pytest.approx((0.30 + 0.05) / 2)
    assert metrics.backward_transfer(ACC) == pytest.approx(((0.60 - 0.90) + (0.75 - 0.80)) / 2)
    assert metrics.forward_transfer(ACC, np.array([0.1, 0.1, 0.1])) == pytest.approx(
        ((0.10 - 0.1) + (0.05 - 0.1)) / 2)


def test_single_task_and_bad_shapes():
    one = np.array([[0.5]])
    assert metrics.forgetting(one) == 0.0 and metrics.backward_transfer(one) == 0.0
    with pytest.raises(ValueError, match="square"):
        metrics.final_accuracy(np.zeros((2, 3)))


def test_summary():
    s = metrics.Summary.of(ACC)
    assert s.as_dict()["a_last"] == pytest.approx(metrics.final_accuracy(ACC))


@pytest.mark.parametrize("seed", range(20))
def test_points_at_the_task_ends_give_the_task_aware_summary(seed):
    """With one evaluation point per task end (task j learned at point j) the task-free summary is the usual one;
    extra points in between change only the online average Ā, which then averages over them too."""
    rng = np.random.default_rng(seed)
    tasks = int(rng.integers(2, 7))
    acc = np.where(np.tril(np.ones((tasks, tasks))) > 0, rng.uniform(size=(tasks, tasks)), np.nan)
    at_ends = metrics.Summary.over_points(acc, list(range(tasks)))
    assert at_ends == metrics.Summary.of(acc)
    # a point between task ends: what the first k tasks score mid-way through task k's data
    k = int(rng.integers(1, tasks))
    mid = np.where(np.arange(tasks) <= k, rng.uniform(size=tasks), np.nan)
    points = np.insert(acc, k, mid, axis=0)
    learned = [j if j < k else j + 1 for j in range(tasks)]
    between = metrics.Summary.over_points(points, learned)
    assert between.a_last == at_ends.a_last
    expected_mean = np.mean([np.nanmean(row) for row in points])
    assert between.a_mean == pytest.approx(expected_mean)
    assert between.forgetting >= at_ends.forgetting - 1e-12  # one more point a task can have been better at
    assert between.bwt == pytest.approx(at_ends.bwt)  # still read at each task's own learned point


def test_anytime_summary_follows_capymoas_written_definitions():
    """Three tasks, two evaluations inside each visit, every task evaluated; CapyMOA's OCLMetrics formulas worked by
    hand: all(p) = mean_j A[p][j], seen(p) over tasks 1..t, R the rows at each task's end, FWT = 2/(T(T-1)) Σ_{i<j}
    R[i][j], BWT = 2/(T(T-1)) Σ_{j<i} (R[i][j] - R[j][j])."""
    a = np.array([[0.5, 0.0, 0.1],
                  [0.9, 0.1, 0.0],   # end of task 0
                  [0.7, 0.6, 0.2],
                  [0.6, 0.8, 0.1],   # end of task 1
                  [0.5, 0.7, 0.4],
                  [0.4, 0.6, 0.9]])  # end of task 2
    out = metrics.anytime_summary(a, [0, 0, 1, 1, 2, 2], [0, 1, 2])
    assert out["accuracy_all"] == pytest.approx(a.mean(axis=1).tolist())
    seen = [0.5, 0.9, (0.7 + 0.6) / 2, (0.6 + 0.8) / 2, (0.5 + 0.7 + 0.4) / 3, (0.4 + 0.6 + 0.9) / 3]
    assert out["accuracy_seen"] == pytest.approx(seen)
    assert out["accuracy_seen_avg"] == pytest.approx(np.mean(seen))
    assert out["task_end_matrix"] == a[[1, 3, 5]].tolist()
    assert out["forward_transfer"] == pytest.approx((0.1 + 0.0 + 0.1) / 3)
    assert out["backward_transfer"] == pytest.approx(((0.6 - 0.9) + (0.4 - 0.9) + (0.6 - 0.8)) / 3)
