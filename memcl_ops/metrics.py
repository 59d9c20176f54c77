"""Continual-learning metrics over an accuracy matrix.

`a[i][j]` is the accuracy on task j's test data after training on task i (0-based, T tasks). Entries
with j > i (tasks not seen yet) may be NaN; they are used only by FWT.

Task-free runs are evaluated at points that are not task ends (docs/methods.md, "Metrics"): `Summary.over_points`
reads a P x T matrix whose row p is evaluation point p (NaN for tasks whose data had not arrived yet).
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
    a_mean: float | None  # None where an entry below the diagonal was not evaluated (`runtime.evaluate_window`)
    forgetting: float | None  # the same
    bwt: float

    @classmethod
    def of(cls, acc: np.ndarray) -> Summary:
        """The four numbers of a T x T matrix whose last row and diagonal are complete."""
        a = _square(acc)
        full = not np.isnan(a[np.tril_indices(len(a))]).any()
        return cls(final_accuracy(a), average_incremental_accuracy(a) if full else None,
                   forgetting(a) if full else None, backward_transfer(a))

    @staticmethod
    def computable(acc: np.ndarray) -> bool:
        """Whether `of` can read `acc`: its last row and its diagonal were evaluated."""
        a = np.asarray(acc, dtype=np.float64)
        return bool(a.size) and not (np.isnan(a[-1]).any() or np.isnan(np.diag(a)).any())

    @classmethod
    def over_points(cls, acc: np.ndarray, learned: list[int]) -> Summary:
        """The four numbers for a P x T matrix of evaluation points; `learned[j]` is the first point after task j's
        first visit had ended (its a[j][j] when the points are the task ends, where this equals `of`):
        A_last = mean of the last row; Ā = mean over points of the mean accuracy on the tasks arrived by then (the
        online average, accuracy on everything seen so far); F and BWT over the tasks learned before the last
        point, from their accuracy at and after `learned[j]`."""
        a = np.asarray(acc, dtype=np.float64)
        if a.ndim != 2 or not a.size or np.isnan(a[-1]).any():
            raise ValueError(f"need a non-empty matrix whose last row covers every task, got shape {a.shape}")
        last = len(a) - 1
        old = [j for j in range(a.shape[1]) if learned[j] < last]
        return cls(float(a[-1].mean()), float(np.mean([np.nanmean(row) for row in a if not np.isnan(row).all()])),
                   float(np.mean([np.nanmax(a[learned[j]:last, j]) - a[last, j] for j in old])) if old else 0.0,
                   float(np.mean([a[last, j] - a[learned[j], j] for j in old])) if old else 0.0)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def anytime_summary(anytime: np.ndarray, row_visits: list[int], visits: list[int]) -> dict:
    """Anytime accuracy (CapyMOA's `OCLMetrics`, docs/methods.md "Anytime accuracy") of a matrix with one row per
    evaluation inside the visits (`row_visits[p]`: the visit row p was evaluated in) and every task evaluated:

    * all(p) = mean_j A[p][j]; seen(p) = mean over the tasks first visited at or before row p's visit; their means
      over the rows (`accuracy_all_avg`, `accuracy_seen_avg`);
    * R: the rows at the end of each task's first visit (T x T, every entry evaluated); forward transfer
      FWT = 2 / (T (T − 1)) Σ_{i<j} R[i][j] and backward transfer BWT = 2 / (T (T − 1)) Σ_{j<i} (R[i][j] − R[j][j]),
      CapyMOA's definitions (0 for one task)."""
    a = np.asarray(anytime, dtype=np.float64)
    tasks = a.shape[1]
    first = {t: visits.index(t) for t in range(tasks) if t in visits}
    seen = [[t for t, v in first.items() if v <= row_visits[p]] for p in range(len(a))]
    accuracy_all = a.mean(axis=1)
    accuracy_seen = np.array([a[p, s].mean() for p, s in enumerate(seen)])
    ends = [max(p for p in range(len(a)) if row_visits[p] == first[t]) for t in sorted(first, key=first.get)]
    r = a[ends][:, sorted(first, key=first.get)]
    n = len(r)
    pairs = n * (n - 1) / 2
    return {"accuracy_all": accuracy_all.tolist(), "accuracy_seen": accuracy_seen.tolist(),
            "accuracy_all_avg": float(accuracy_all.mean()), "accuracy_seen_avg": float(accuracy_seen.mean()),
            "task_end_matrix": r.tolist(),
            "forward_transfer": float(np.triu(r, 1).sum() / pairs) if n > 1 else 0.0,
            "backward_transfer": float(np.tril(r - np.diag(r)[None, :], -1).sum() / pairs) if n > 1 else 0.0}


def figure_text(value: float | None, spec: str = ".2f", scale: float = 100.0) -> str:
    """A figure as a table prints it: `value * scale` in the format `spec` (percent by default), or "-" where it is
    undefined (None, which metrics.json holds for it, or NaN) or infinite."""
    if value is None or not np.isfinite(value):
        return "-"
    return format(scale * value, spec)
