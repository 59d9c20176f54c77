"""Continual-learning metrics over an accuracy matrix.

`a[i][j]` is the accuracy on task j's test data after training on task i (0-based, T tasks). Entries
with j > i (tasks not seen yet) may be NaN; they are used only by FWT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def _square(acc: np.ndarray) -> np.ndarray:
    a = np.asarray(acc, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"the accuracy matrix must be square and non-empty, got shape {a.shape}")
    return a


def final_accuracy(acc: np.ndarray) -> float:
    """A_last = (1/T) Σ_j a[T-1][j]: mean accuracy over all tasks after the last one."""
    a = _square(acc)
    return float(a[-1].mean())


def average_incremental_accuracy(acc: np.ndarray) -> float:
    """Ā = (1/T) Σ_i (1/(i+1)) Σ_{j<=i} a[i][j]: mean over steps of the accuracy on the tasks seen so far
    (Rebuffi et al., iCaRL)."""
    a = _square(acc)
    return float(np.mean([a[i, : i + 1].mean() for i in range(len(a))]))


def forgetting(acc: np.ndarray) -> float:
    """F = (1/(T-1)) Σ_{j<T-1} max_{i<T-1} a[i][j] − a[T-1][j]: mean drop from each old task's best
    accuracy (Chaudhry et al. 2018). 0 for a single task."""
    a = _square(acc)
    t = len(a)
    if t == 1:
        return 0.0
    return float(np.mean([np.nanmax(a[j : t - 1, j]) - a[t - 1, j] for j in range(t - 1)]))


def backward_transfer(acc: np.ndarray) -> float:
    """BWT = (1/(T-1)) Σ_{j<T-1} (a[T-1][j] − a[j][j]) (Lopez-Paz & Ranzato 2017). 0 for a single task."""
    a = _square(acc)
    t = len(a)
    if t == 1:
        return 0.0
    return float(np.mean([a[t - 1, j] - a[j, j] for j in range(t - 1)]))


def forward_transfer(acc: np.ndarray, baseline: np.ndarray) -> float:
    """FWT = (1/(T-1)) Σ_{j>=1} (a[j-1][j] − b_j), with b_j the accuracy on task j of the model before
    any training (Lopez-Paz & Ranzato 2017). Needs the entries just above the diagonal."""
    a = _square(acc)
    b = np.asarray(baseline, dtype=np.float64)
    t = len(a)
    if t == 1:
        return 0.0
    return float(np.mean([a[j - 1, j] - b[j] for j in range(1, t)]))


@dataclass(frozen=True)
class Summary:
    a_last: float
    a_mean: float
    forgetting: float
    bwt: float

    @classmethod
    def of(cls, acc: np.ndarray) -> Summary:
        return cls(final_accuracy(acc), average_incremental_accuracy(acc), forgetting(acc),
                   backward_transfer(acc))

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
