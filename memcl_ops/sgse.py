"""SGSE: statistically guarded slot expansion (METHODS.md 2.2).

A quantile tracker follows the routing confidences s_t:

    q_t = window quantile of the last w confidences,   Q_t = β Q_{t-1} + (1-β) q_t

Each sample is a Bernoulli trial `s_t >= Q_{t-1}` (the threshold from *before* t). Trials are tested
in non-overlapping blocks of n: with k successes, expand iff the one-sided Wilson lower bound
LB(k/n; n, z) < τ_exp. The block buffer is cleared after every test; after an expansion the next block
is a cooldown (collected, not tested). The new slot's key is Norm(mean query of the block's samples
with s < Q) (the whole block if none).

Orientation (`quantile_mode`):
* ``"coverage"`` (default): Q tracks the ε-quantile, so under no novelty P(s_t >= Q) ≈ 1-ε = 0.9 and
  the test "UB(k/n) < 1-ε", i.e. k <= 15 of 20, has false-alarm rate P(Bin(20, .9) <= 15) = 0.043.
  With n = 20, z = 1.645 it is the same decision as LB(k/n) < τ_exp for τ_exp in (0.568, 0.622].
* ``"upper"``: the literal "high quantile" reading, Q tracks the (1-ε)-quantile; success probability
  is then ≈ ε and with the default τ_exp the test fires almost always. Kept as a switch only.

The window quantile is the lower order statistic by default: with w = 10 linear interpolation breaks
the α guarantee (0.17-0.26 false expansions per test measured, METHODS.md 2.2).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

QuantileMode = Literal["coverage", "upper"]


def wilson_bounds(k: np.ndarray | int, n: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score bounds for k successes in n trials (closed form, vectorised over k)."""
    if n <= 0:
        raise ValueError("n must be positive")
    p = np.asarray(k, dtype=np.float64) / n
    centre = p + z * z / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denom = 1 + z * z / n
    return (centre - spread) / denom, np.minimum((centre + spread) / denom, 1.0)


@dataclass(frozen=True)
class SGSEConfig:
    beta: float = 0.9  # EMA rate of the quantile tracker [S]
    window: int = 10  # w [S]
    epsilon: float = 0.1  # ε [S]
    block_size: int = 20  # n [S]
    z: float = 1.645  # one-sided 95 % [S]
    tau_exp: float = 0.6  # expand iff LB < τ_exp [R]
    cooldown_blocks: int = 1  # untested blocks after an expansion [R]
    max_slots: int = 512  # S_max safety cap [R]
    quantile_mode: QuantileMode = "coverage"  # [R] see module docstring
    window_quantile: str = "lower"  # numpy quantile method for q_t [R]

    def __post_init__(self) -> None:
        if not 0 < self.epsilon < 1 or not 0 <= self.beta < 1:
            raise ValueError("SGSE needs 0 < epsilon < 1 and 0 <= beta < 1")
        if self.quantile_mode not in ("coverage", "upper"):
            raise ValueError(f"quantile_mode must be 'coverage' or 'upper', got {self.quantile_mode!r}")
        if self.window < 1 or self.block_size < 1:
            raise ValueError("window and block_size must be >= 1")


class QuantileTracker:
    """EMA of a sliding-window quantile: Q_t = β Q_{t-1} + (1-β) q_t."""

    def __init__(self, beta: float, window: int, level: float, method: str = "lower"):
        self.beta, self.level, self.method = beta, level, method
        self.values: deque[float] = deque(maxlen=window)
        self.threshold: float | None = None

    @property
    def ready(self) -> bool:
        """True once the window is full: trials before that would test a half-formed threshold."""
        return len(self.values) == self.values.maxlen and self.threshold is not None

    def window_quantile(self) -> float:
        if self.method == "lower":  # per-sample hot path: numpy's "lower" rule on a sorted list
            ordered = sorted(self.values)
            return ordered[math.floor((len(ordered) - 1) * self.level)]
        return float(np.quantile(np.fromiter(self.values, float), self.level, method=self.method))

    def update(self, value: float) -> float:
        self.values.append(value)
        q = self.window_quantile()
        self.threshold = q if self.threshold is None else self.beta * self.threshold + (1 - self.beta) * q
        return self.threshold


@dataclass
class Expansion:
    """An expansion decided by a test: the key for the new slot and the evidence."""

    key: np.ndarray
    successes: int
    trials: int
    lower_bound: float
    step: int


class NoveltyMonitor:
    """SGSE over a stream of (confidence, query) pairs. Ray-free; the NoveltyMonitor actor wraps it."""

    def __init__(self, config: SGSEConfig = SGSEConfig()):
        self.config = config
        level = config.epsilon if config.quantile_mode == "coverage" else 1 - config.epsilon
        self.tracker = QuantileTracker(config.beta, config.window, level, config.window_quantile)
        self.trials: list[bool] = []  # the current block's Bernoulli outcomes
        self.block_queries: list[np.ndarray] = []  # their queries, for the new slot's key
        self.cooldown = 0
        self.steps = 0
        self.tests = 0
        self.expansions = 0

    def observe(self, confidences: np.ndarray, queries: np.ndarray) -> list[Expansion]:
        """Feed a batch in stream order; returns the expansions it triggered (usually none)."""
        cfg = self.config
        found: list[Expansion] = []
        for s, q in zip(np.asarray(confidences, dtype=np.float64), np.asarray(queries)):
            threshold_before = self.tracker.threshold if self.tracker.ready else None
            self.tracker.update(float(s))
            self.steps += 1
            if threshold_before is None:
                continue
            self.trials.append(bool(s >= threshold_before))
            self.block_queries.append(q)
            if len(self.trials) < cfg.block_size:
                continue
            if self.cooldown > 0:
                self.cooldown -= 1
            else:
                expansion = self._test()
                if expansion is not None:
                    found.append(expansion)
            self.trials.clear()
            self.block_queries.clear()
        return found

    def _test(self) -> Expansion | None:
        cfg = self.config
        k, n = sum(self.trials), len(self.trials)
        self.tests += 1
        lower, _ = wilson_bounds(k, n, cfg.z)
        if not lower < cfg.tau_exp:
            return None
        self.expansions += 1
        self.cooldown = cfg.cooldown_blocks
        # Failures of the trial are exactly the samples with s < Q (the block's low-confidence ones).
        low = [q for q, ok in zip(self.block_queries, self.trials) if not ok]
        mean = np.mean(np.stack(low or self.block_queries), axis=0)
        key = mean / (np.linalg.norm(mean) + 1e-8)
        return Expansion(key.astype(np.float32), k, n, float(lower), self.steps)

    def state(self) -> dict[str, np.ndarray]:
        width = len(self.block_queries[0]) if self.block_queries else 0
        return {
            "window": np.fromiter(self.tracker.values, dtype=np.float64),
            "threshold": np.array(np.nan if self.tracker.threshold is None else self.tracker.threshold),
            "trials": np.array(self.trials, dtype=bool),
            "block_queries": (np.stack(self.block_queries) if self.block_queries
                              else np.zeros((0, width), np.float32)),
            "counters": np.array([self.cooldown, self.steps, self.tests, self.expansions], dtype=np.int64),
            "config": np.array(repr(sorted(asdict(self.config).items()))),
        }

    def restore(self, state: dict[str, np.ndarray]) -> None:
        if str(state["config"]) != repr(sorted(asdict(self.config).items())):
            raise ValueError("SGSE state was saved under a different configuration")
        self.tracker.values.clear()
        self.tracker.values.extend(float(v) for v in state["window"])
        threshold = float(state["threshold"])
        self.tracker.threshold = None if math.isnan(threshold) else threshold
        self.trials = [bool(t) for t in state["trials"]]
        self.block_queries = list(np.asarray(state["block_queries"]))
        self.cooldown, self.steps, self.tests, self.expansions = (int(v) for v in state["counters"])
