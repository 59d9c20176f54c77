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
