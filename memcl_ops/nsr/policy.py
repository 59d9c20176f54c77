"""NSR's learned allocation policy (docs/methods.md, "NSR", the controlled study): a contextual bandit over the
arrival actions {restore one of the top-m entries, warm mix, fresh}, beside the similarity rule on the same bank.

State of an arrival (what the similarity rule reads, plus what an RL controller is given [R]): for each of the top-m
entries by key similarity, its cosine s_i, its age (arrivals since it was last used, over the bank's entries, at
most 1) and the probe loss of that entry's adapter and head on the visit's first probe rows (cross-entropy over
ln(n_way): 1 is chance), and a constant. Policy: π(a | φ) = softmax(W φ) over the actions the bank allows (a restore
needs its entry; warm and fresh need nothing).

Training (`learn`): at each arrival of a training run every allowed action's reward is measured, the accuracy the
start it gives reaches on the task's held-back rows before any step (the METHODS [R] "accuracy after a fixed step
budget", at a budget of 0): full-information feedback, more than a bandit sees, so the policy is favoured, not
handicapped. The played action is sampled from π; W then climbs the exact policy gradient of the expected reward,
Σ_a π_a (r_a − Σ_b π_b r_b) ∇ log π_a, averaged over every arrival seen so far (`epochs` passes). Frozen (`learn`
off), the policy plays its most probable action. A run's trained W is in its metrics (bank.policy.weights), what
`weights` takes to evaluate it on other cycles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PolicyConfig:
    top_m: int = 2  # restore candidates: the m entries most similar to the arriving key [R]
    weights: tuple[float, ...] | None = None  # W, actions x features row-major (None: zeros, the uniform policy)
    learn: bool = False  # measure every action's reward at each arrival and train W (training runs only)
    lr: float = 1.0  # gradient ascent step on W [R]
    epochs: int = 100  # passes over every arrival seen, after each arrival [R]
    probe_rows: int = 32  # probe rows each candidate's loss is measured on [R]

    def __post_init__(self) -> None:
        if self.top_m < 1 or self.epochs < 0 or self.probe_rows < 1:
            raise ValueError(f"nsr.policy: top_m and probe_rows must be >= 1 and epochs >= 0, got {self.top_m}, "
                             f"{self.probe_rows}, {self.epochs}")
        if self.weights is not None and len(self.weights) != self.actions * self.features:
            raise ValueError(f"nsr.policy.weights: {self.actions} actions x {self.features} features = "
                             f"{self.actions * self.features} numbers for top_m = {self.top_m}, got "
                             f"{len(self.weights)}")

    @property
    def actions(self) -> int:
        return self.top_m + 2

    @property
    def features(self) -> int:
        return 1 + 3 * self.top_m

    def action_names(self) -> list[str]:
        return [f"restore-{i + 1}" for i in range(self.top_m)] + ["warm", "fresh"]


def arrival_features(sims: list[float], ages: list[float], losses: list[float], top_m: int) -> np.ndarray:
    """φ of one arrival from its top candidates (best first; fewer than `top_m` when the bank holds fewer)."""
    pad = top_m - len(sims)
    return np.array([1.0, *sims, *[0.0] * pad, *ages, *[1.0] * pad, *losses, *[1.0] * pad], dtype=np.float64)


def allowed(candidates: int, top_m: int) -> np.ndarray:
    """The actions a bank with `candidates` top entries allows: restores of those entries, warm with one, fresh."""
    return np.array([i < candidates for i in range(top_m)] + [candidates > 0, True])


def softmax(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, scores, -np.inf)
    p = np.exp(z - z[mask].max())
    return p / p.sum()


class AllocationPolicy:
    def __init__(self, config: PolicyConfig):
        self.config = config
        shape = (config.actions, config.features)
        self.weights = (np.zeros(shape) if config.weights is None
                        else np.array(config.weights, dtype=np.float64).reshape(shape))
        self.seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (φ, allowed, rewards) of trained arrivals

    def probabilities(self, phi: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return softmax(self.weights @ phi, mask)

    def choose(self, phi: np.ndarray, mask: np.ndarray, draw: int) -> int:
        """Sampled (seeded by `draw`) while learning, the most probable action when frozen."""
        p = self.probabilities(phi, mask)
        if self.config.learn:
            return int(np.random.default_rng([draw, 4099]).choice(len(p), p=p))
        return int(np.argmax(p))

    def learn(self, phi: np.ndarray, mask: np.ndarray, rewards: np.ndarray) -> None:
        """One arrival's rewards (every allowed action's); W climbs the expected reward over all arrivals seen."""
        self.seen.append((phi, mask, np.where(mask, rewards, 0.0)))
        for _ in range(self.config.epochs):
            grad = np.zeros_like(self.weights)
            for f, m, r in self.seen:
                p = self.probabilities(f, m)
                grad += np.outer(p * (r - p @ r), f)
            self.weights += self.config.lr * grad / len(self.seen)

    def summary(self) -> dict:
        return {"actions": self.config.action_names(), "weights": self.weights.ravel().tolist(),
                "trained_arrivals": len(self.seen)}

    def state(self) -> dict[str, np.ndarray]:
        rows = [np.concatenate([f, m.astype(np.float64), r]) for f, m, r in self.seen]
        width = self.config.features + 2 * self.config.actions
        return {"weights": self.weights.copy(), "seen": np.array(rows).reshape(len(rows), width)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.weights = np.array(state["weights"], dtype=np.float64)
        n, a = self.config.features, self.config.actions
        self.seen = [(row[:n], row[n:n + a].astype(bool), row[n + a:]) for row in np.asarray(state["seen"])]
