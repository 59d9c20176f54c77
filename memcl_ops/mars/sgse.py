"""SGSE: statistically guarded slot expansion (docs/methods.md, "SGSE").

Every sample is a Bernoulli trial ("does the memory already cover it?"); trials are tested in non-overlapping
blocks of n: with k successes, expand iff the one-sided Wilson lower bound LB(k/n; n, z) < τ_exp. The block
buffer is cleared after every test; after an expansion the next block is a cooldown (collected, not tested).
The new slot's key is Norm(mean query of the block's failed samples) (the whole block if none failed); the monitor
keeps the mean of their features h, which the memory maps through W_q (the query is linear in h).

Two signals decide the trial (`SGSEConfig.signal`; the reference signal is the default, the paper's signal breaks
SGSE's slot bound on long recurring streams):

* ``"paper"``: the MARS paper's routing confidence s_t (top-slot softmax probability) against a quantile tracker
  q_t = window quantile of the last w confidences, Q_t = β Q_{t-1} + (1-β) q_t; success iff s_t >= Q_{t-1}.
  Orientation (`quantile_mode`): ``"coverage"`` tracks the ε-quantile, so under no novelty P(s_t >= Q) ≈ 1-ε
  and the default test (k <= 15 of 20) has false-alarm rate P(Bin(20, .9) <= 15) = 0.043; ``"upper"`` is the
  literal "high quantile" reading, kept as a switch only. The window quantile is the lower order statistic: with
  w = 10 linear interpolation breaks the α guarantee.
* ``"reference"``: a calibrated per-slot reference test on the frozen features z = LN(h). Each expanded slot j
  keeps its last m assigned features, alternately into a bank B_j and a calibration set C_j; d_j(x) =
  min_{b in B_j} ||z(x) - b||, and r_j = the κ-th smallest calibration distance, κ the smallest rank for which
  the Beta-binomial law of a block's successes (the exact finite-sample law of split-conformal coverage) puts
  at most α on "the block fails the Wilson test". Success iff min_j d_j(x) / ((1 + η) r_j) <= 1. The test reads
  no trained parameter, so retraining the router cannot change a decision; each recurring task is judged
  against its own calibrated reference, so a test on data exchangeable with a reference is at level <= α.
  The rows the references keep are per-sample features: at most `reference_bytes` of them. Past that budget the
  references refreshed longest ago are compacted into per-slot aggregates: the mean of the bank (which the bank's
  nearest row gives way to as the score, d_j(x) = ||z(x) - mean_j||) and the calibration rows' distances to it
  (scalars), both then updated by the rows that join the slot; `reference_bytes = 0` keeps aggregates only.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np
import torch

QuantileMode = Literal["coverage", "upper"]
Signal = Literal["paper", "reference"]
FeatureSpace = Literal["layernorm", "raw"]


def wilson_bounds(k: np.ndarray | int, n: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score bounds for k successes in n trials (closed form, vectorised over k)."""
    if n <= 0:
        raise ValueError("n must be positive")
    p = np.asarray(k, dtype=np.float64) / n
    centre = p + z * z / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denom = 1 + z * z / n
    return (centre - spread) / denom, np.minimum((centre + spread) / denom, 1.0)


def max_expanding_successes(n: int, z: float, tau_exp: float) -> int:
    """The largest k for which a block of n trials with k successes expands (-1: no block expands)."""
    lower, _ = wilson_bounds(np.arange(n + 1), n, z)
    expanding = np.flatnonzero(lower < tau_exp)
    return int(expanding.max()) if expanding.size else -1


def beta_binomial_cdf(k: int, n: int, a: float, b: float) -> float:
    """P(K <= k) for K ~ BetaBinomial(n, a, b)."""
    def log_beta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
    log_norm = math.lgamma(n + 1) - log_beta(a, b)
    return float(sum(math.exp(log_norm - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_beta(i + a, n - i + b))
                     for i in range(k + 1)))


@lru_cache(maxsize=4096)
def conformal_rank(calibration: int, n: int, max_k: int, alpha: float) -> int | None:
    """The smallest rank κ in 1..c such that, with the threshold at the κ-th smallest of c calibration scores, a
    block of n exchangeable trials fails the Wilson test (<= max_k successes) with probability <= α. The coverage
    of that threshold is Beta(κ, c + 1 - κ)-distributed, so the block's successes are Beta-binomial. None: no rank
    is safe (too few calibration rows; such a reference accepts nothing)."""
    if max_k < 0:
        return 1 if calibration else None
    for kappa in range(1, calibration + 1):
        if beta_binomial_cdf(max_k, n, kappa, calibration + 1 - kappa) <= alpha:
            return kappa
    return None


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
    signal: Signal = "reference"  # what a trial reads: frozen-feature references [R] or the routing confidence [S]
    reference_size: int = 64  # m: the last m features kept per expanded slot (half bank, half calibration) [R]
    slack: float = 0.1  # η: acceptance radius (1 + η) r_j, for drift between visits [R]
    alpha: float = 0.05  # level of each block test under the reference signal [R]
    feature_space: FeatureSpace = "layernorm"  # z = LN(h) (scale-free) or the raw features h [R]
    fill_blocks: int = 2  # extra cooldown blocks while a new reference is still too small to accept anything [R]
    # the reference signal's per-sample features (bank and calibration rows): at most this many bytes; past it the
    # references refreshed longest ago keep only a mean and their calibration distances (0: aggregates only) [R]
    reference_bytes: int = 2**20
    aggregate_rank: int = 4  # directions a compacted reference keeps of its rows' scatter (a Summary) [R]

    def __post_init__(self) -> None:
        if not 0 < self.epsilon < 1 or not 0 <= self.beta < 1:
            raise ValueError("SGSE needs 0 < epsilon < 1 and 0 <= beta < 1")
        if self.quantile_mode not in ("coverage", "upper"):
            raise ValueError(f"quantile_mode must be 'coverage' or 'upper', got {self.quantile_mode!r}")
        if self.window < 1 or self.block_size < 1:
            raise ValueError("window and block_size must be >= 1")
        if self.signal not in ("paper", "reference"):
            raise ValueError(f"signal must be 'paper' or 'reference', got {self.signal!r}")
        if self.feature_space not in ("layernorm", "raw"):
            raise ValueError(f"feature_space must be 'layernorm' or 'raw', got {self.feature_space!r}")
        if (self.reference_size < 2 or self.slack < 0 or not 0 < self.alpha < 1 or self.fill_blocks < 0
                or self.reference_bytes < 0 or self.aggregate_rank < 0):
            raise ValueError("SGSE needs reference_size >= 2, slack >= 0, 0 < alpha < 1, fill_blocks >= 0, "
                             "reference_bytes >= 0 and aggregate_rank >= 0")


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
    """An expansion decided by a test: the mean feature of its block's failed samples (the new slot's key is
    Norm(W_q centre)) and the evidence."""

    centre: np.ndarray
    successes: int
    trials: int
    lower_bound: float
    step: int  # samples observed when the test ran (its block ends here)


class TrialSignal(Protocol):
    """What decides each sample's trial; the block test around it is the same for every signal."""

    needs_features: bool  # whether `trials` reads the frozen features

    def trials(self, confidences: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        """Outcomes for the samples, in order (may be fewer: the first ones of the stream can be warm-up)."""

    def warmup_left(self) -> int:
        """Samples still needed before trials start."""

    def end_block(self, features: np.ndarray | None, trials: np.ndarray, outcome: str) -> None:
        """A block ended: `outcome` is "passed", "expanded" or "cooldown"; `features` are the trial samples'."""

    def still_filling(self) -> bool:
        """True while the newest expansion's evidence is too thin to judge by (extends the cooldown)."""

    def state(self) -> dict[str, np.ndarray]: ...

    def restore(self, state: dict[str, np.ndarray]) -> None: ...

    def memory_bytes(self) -> dict[str, int]:
        """What it keeps between batches: per-sample feature rows ("rows") and everything else ("aggregates")."""


class ConfidenceSignal:
    """The paper's trial: routing confidence against the tracked quantile from before the sample."""

    needs_features = False

    def __init__(self, config: SGSEConfig):
        level = config.epsilon if config.quantile_mode == "coverage" else 1 - config.epsilon
        self.tracker = QuantileTracker(config.beta, config.window, level, config.window_quantile)

    def warmup_left(self) -> int:
        return 0 if self.tracker.ready else self.tracker.values.maxlen - len(self.tracker.values)

    def trials(self, confidences: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        out = []
        for s in np.asarray(confidences, dtype=np.float64):
            threshold_before = self.tracker.threshold if self.tracker.ready else None
            self.tracker.update(float(s))
            if threshold_before is not None:
                out.append(bool(s >= threshold_before))
        return np.array(out, dtype=bool)

    def end_block(self, features: np.ndarray | None, trials: np.ndarray, outcome: str) -> None:
        return None

    def still_filling(self) -> bool:
        return False

    def state(self) -> dict[str, np.ndarray]:
        t = self.tracker
        return {"window": np.fromiter(t.values, dtype=np.float64),
                "threshold": np.array(np.nan if t.threshold is None else t.threshold)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.tracker.values.clear()
        self.tracker.values.extend(float(v) for v in state["window"])
        threshold = float(state["threshold"])
        self.tracker.threshold = None if math.isnan(threshold) else threshold

    def memory_bytes(self) -> dict[str, int]:
        return {"rows": 0, "aggregates": self.tracker.values.maxlen * 8 + 8}


def nearest_distances(z: np.ndarray, rows: np.ndarray, row_norms: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """min ||z - r|| per row of z within each group of `rows` (groups begin at `starts`; `row_norms` = ||r||²)."""
    squared = (z * z).sum(1)[:, None] + row_norms[None, :] - 2.0 * z @ rows.T
    return np.sqrt(np.maximum(np.minimum.reduceat(squared, starts, axis=1), 0.0))


def nearest_distances_on(z: np.ndarray, rows: torch.Tensor, row_norms: torch.Tensor, groups: torch.Tensor,
                         count: int) -> np.ndarray:
    """`nearest_distances` with torch where `rows` live (a GPU): `groups` gives each row's group (of `count`)."""
    x = torch.from_numpy(np.ascontiguousarray(z)).to(rows.device, rows.dtype)
    squared = (x * x).sum(1, keepdim=True) + row_norms[None, :] - 2.0 * x @ rows.T
    nearest = torch.full((len(x), count), math.inf, device=rows.device, dtype=squared.dtype)
    nearest = nearest.scatter_reduce(1, groups.expand(len(x), -1), squared, "amin")
    return nearest.clamp_min(0.0).sqrt().cpu().numpy()


class Summary:
    """A slot's features as aggregates: their running mean and scatter, the scatter as its top `rank` directions
    (a D x rank factor F, F Fᵀ ≈ S, merged block by block by incremental PCA, Ross et al. 2008) and its trace; at most
    `window` rows weigh in (older ones fade). Its distance is the Mahalanobis one under the covariance
    (F Fᵀ + ρ I) / n, ρ the scatter beyond the kept directions spread evenly (and at least a 10⁻⁶ share of it all)."""

    def __init__(self, dim: int, rank: int, window: int):
        self.rank, self.window = rank, window
        self.count = 0.0
        self.mean = np.zeros(dim, np.float32)
        self.factor = np.zeros((dim, 0), np.float32)
        self.trace = 0.0

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        rows, mean = np.asarray(rows, np.float64), self.mean.astype(np.float64)
        k, centre = len(rows), rows.mean(axis=0)
        parts = [self.factor.astype(np.float64), (rows - centre).T]
        shift = np.sqrt(self.count * k / (self.count + k)) * (centre - mean) if self.count else np.zeros_like(centre)
        stacked = np.concatenate([*parts, shift[:, None]], axis=1)
        self.trace += float(((rows - centre) ** 2).sum() + shift @ shift)
        mean = (self.count * mean + k * centre) / (self.count + k)
        self.count += k
        values, vectors = np.linalg.eigh(stacked.T @ stacked)  # the smaller Gram: columns, not D x D
        keep = np.argsort(values)[::-1][:self.rank]
        keep = keep[values[keep] > 1e-12 * max(values.max(), 1e-300)]
        factor = stacked @ vectors[:, keep]
        if self.count > self.window:  # older rows fade: the summary of about the last `window` rows
            fade = self.window / self.count
            factor *= np.sqrt(fade)
            self.trace *= fade
            self.count = float(self.window)
        # kept in float32, as stored, so that a restored summary continues exactly
        self.mean, self.factor = mean.astype(np.float32), factor.astype(np.float32)

    def distance(self, z: np.ndarray) -> np.ndarray:
        d = np.asarray(z, np.float64) - self.mean
        factor = self.factor.astype(np.float64)
        norms = (factor * factor).sum(axis=0)  # the squared singular values
        dim, kept = len(self.mean), float(norms.sum())
        rest = max((self.trace - kept) / max(dim - len(norms), 1), 1e-6 * self.trace / dim, 1e-12)
        along = d @ (factor / np.sqrt(norms)) if len(norms) else np.zeros((len(d), 0))
        squared = (along ** 2 / (norms + rest)).sum(axis=1) + ((d * d).sum(axis=1) - (along ** 2).sum(axis=1)) / rest
        return np.sqrt(np.maximum(squared * self.count, 0.0)).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {"count": np.array(self.count), "mean": self.mean, "factor": self.factor, "trace": np.array(self.trace)}

    def nbytes(self) -> int:
        return self.mean.nbytes + self.factor.nbytes + 16  # and the count and the trace

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], rank: int, window: int) -> Summary:
        out = cls(len(state["mean"]), rank, window)
        out.count, out.trace = float(state["count"]), float(state["trace"])
        out.mean, out.factor = np.array(state["mean"], np.float32), np.array(state["factor"], np.float32)
        return out


class Reference:
    """One expanded slot's reference: its last m frozen features, alternately bank and calibration rows, and the
    conformal radius r read off the calibration rows' distances to the bank (the nearest bank row); or, once
    compacted (`compact`), aggregates only: a `Summary` of its bank rows in the bank's place (d is the Mahalanobis
    distance to it) and the last m/2 calibration distances, each measured against the summary as it stood when its
    row came (the rows that join the slot keep refreshing both)."""

    def __init__(self, size: int, dim: int, block_size: int, max_k: int, alpha: float, rank: int = 4):
        self.half, self.rank = size // 2, rank
        self.block_size, self.max_k, self.alpha = block_size, max_k, alpha
        self.bank = np.zeros((0, dim), np.float32)
        self.calibration = np.zeros((0, dim), np.float32)
        self.added = 0  # rows ever added (its parity picks bank or calibration)
        self.radius = 0.0  # 0 while too small to accept anything
        self.summary: Summary | None = None  # the aggregates, once compacted
        self.scores = np.zeros(0, np.float32)

    @property
    def compacted(self) -> bool:
        return self.summary is not None

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        parity = (self.added + np.arange(len(rows))) % 2
        self.added += len(rows)
        if self.compacted:
            self.summary.add(rows[parity == 0])
            self.scores = np.concatenate([self.scores, self.distance(rows[parity == 1])])[-self.half:]
        else:
            self.bank = np.concatenate([self.bank, rows[parity == 0]])[-self.half:]
            self.calibration = np.concatenate([self.calibration, rows[parity == 1]])[-self.half:]
        self._calibrate()

    def compact(self) -> None:
        """Keep aggregates instead of rows: the bank's summary and the calibration rows' distances to it."""
        if self.compacted:
            return
        dim = self.bank.shape[1]
        self.summary = Summary(dim, self.rank, self.half)
        self.summary.add(self.bank)
        self.scores = self.distance(self.calibration) if len(self.bank) else np.zeros(0, np.float32)
        self.bank = self.calibration = np.zeros((0, dim), np.float32)
        self._calibrate()

    def _calibrate(self) -> None:
        scores = self.scores if self.compacted else self.calibration
        kappa = conformal_rank(len(scores), self.block_size, self.max_k, self.alpha)
        if kappa is None or not (self.summary.count if self.compacted else len(self.bank)):
            self.radius = 0.0
            return
        ordered = np.sort(self.scores if self.compacted else self.distance(self.calibration))
        self.radius = float(ordered[kappa - 1])

    def distance(self, z: np.ndarray) -> np.ndarray:
        """Per row of z: min over the bank of ||z - b||, or the distance to the summary once compacted."""
        if self.compacted:
            return self.summary.distance(z)
        return nearest_distances(z, self.bank, (self.bank * self.bank).sum(1), np.zeros(1, np.int64))[:, 0]

    def state(self) -> dict[str, np.ndarray]:
        out = {"bank": self.bank, "calibration": self.calibration, "added": np.array(self.added)}
        if self.compacted:
            out.update({f"summary.{k}": v for k, v in self.summary.state().items()}, scores=self.scores)
        return out

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], size: int, block_size: int, max_k: int, alpha: float,
                   rank: int = 4) -> Reference:
        ref = cls(size, state["bank"].shape[1], block_size, max_k, alpha, rank)
        ref.bank, ref.calibration = np.array(state["bank"]), np.array(state["calibration"])
        ref.added = int(state["added"])
        if "scores" in state:
            ref.summary = Summary.from_state({k[8:]: v for k, v in state.items() if k.startswith("summary.")},
                                             rank, ref.half)
            ref.scores = np.array(state["scores"], np.float32)
        ref._calibrate()
        return ref

    def row_bytes(self) -> int:
        """The per-sample features it keeps."""
        return self.bank.nbytes + self.calibration.nbytes

    def aggregate_bytes(self) -> int:
        return 8 + (self.summary.nbytes() + self.scores.nbytes if self.compacted else 0)


class ReferenceSignal:
    """Calibrated per-slot reference test on frozen features (module docstring)."""

    needs_features = True

    def __init__(self, config: SGSEConfig, device: torch.device | None = None):
        self.config = config
        self.max_k = max_expanding_successes(config.block_size, config.z, config.tau_exp)
        self.references: list[Reference] = []
        self.refreshed: list[int] = []  # per reference, the block that last added rows to it (compaction order)
        self.blocks = 0
        self._stacked: tuple | None = None  # cache of `_stack`
        # where each batch's distances to the banks are computed (None: with numpy on the CPU); the banks stay numpy
        self.device = device

    def _new_reference(self, dim: int) -> Reference:
        c = self.config
        return Reference(c.reference_size, dim, c.block_size, self.max_k, c.alpha, c.aggregate_rank)

    def scores(self, z: np.ndarray) -> np.ndarray:
        """d_j(x) / ((1 + η) r_j) per sample and reference (inf where a reference accepts nothing)."""
        out = np.full((len(z), len(self.references)), np.inf)
        if self._stacked is None:
            self._stack()
        active, stacked, norms, starts, scale, on_device = self._stacked
        if active:
            # one product against all banks at once, then the minimum within each bank's columns
            nearest = nearest_distances(z, stacked, norms, starts) if on_device is None else nearest_distances_on(
                z, *on_device, len(active))
            out[:, active] = nearest / scale
        for j, ref in enumerate(self.references):  # the compacted ones, against their summaries
            if ref.compacted and ref.radius > 0:
                out[:, j] = ref.distance(z) / ((1 + self.config.slack) * ref.radius)
        return out

    def _stack(self) -> None:
        """The active references' banks as one matrix (rebuilt only when a reference changed)."""
        active = [j for j, ref in enumerate(self.references) if ref.radius > 0 and not ref.compacted]
        banks = [self.references[j].bank for j in active]
        stacked = np.concatenate(banks) if banks else np.zeros((0, 0), np.float32)
        starts = np.cumsum([0, *(len(b) for b in banks[:-1])])
        scale = (1 + self.config.slack) * np.array([self.references[j].radius for j in active])
        norms = (stacked * stacked).sum(1)
        on_device = None
        if self.device is not None and active:  # the banks copied over when a block has changed them
            groups = np.repeat(np.arange(len(banks)), [len(b) for b in banks])
            on_device = (torch.from_numpy(stacked).to(self.device), torch.from_numpy(norms).to(self.device),
                         torch.from_numpy(groups).to(self.device))
        self._stacked = (active, stacked, norms, starts, scale, on_device)

    def warmup_left(self) -> int:
        return 0

    def trials(self, confidences: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        if features is None:
            raise ValueError("the reference signal needs the frozen features of every observed sample")
        if not self.references:
            return np.zeros(len(features), dtype=bool)
        return self.scores(features).min(axis=1) <= 1.0

    def end_block(self, features: np.ndarray | None, trials: np.ndarray, outcome: str) -> None:
        self.blocks += 1
        self._update(features, trials, outcome)
        self._within_budget()
        self._stacked = None

    def _within_budget(self) -> None:
        """Compact the references refreshed longest ago (the newest last) until their rows fit the budget."""
        held = sum(ref.row_bytes() for ref in self.references)
        for j in sorted(range(len(self.references)), key=lambda j: (self.refreshed[j], j)):
            if held <= self.config.reference_bytes:
                return
            held -= self.references[j].row_bytes()
            self.references[j].compact()

    def _update(self, features: np.ndarray, trials: np.ndarray, outcome: str) -> None:
        if outcome == "expanded":  # the new slot's reference starts from the samples nothing covered
            ref = self._new_reference(features.shape[1])
            ref.add(features[~trials] if (~trials).any() else features)
            self.references.append(ref)
            self.refreshed.append(self.blocks)
            return
        if not self.references:
            return
        # a passing block's rows join their nearest reference (a passing block has an active one, so every score
        # row is finite); in a cooldown block what no reference covers fills the newest one
        nearest = self.scores(features).argmin(axis=1)
        if outcome == "cooldown":
            nearest = np.where(trials, nearest, len(self.references) - 1)
        for j in np.unique(nearest):
            self.references[j].add(features[nearest == j])
            self.refreshed[j] = self.blocks

    def still_filling(self) -> bool:
        return bool(self.references) and self.references[-1].radius == 0.0

    def state(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {"references": np.array(len(self.references)),
                                      "refreshed": np.array(self.refreshed, np.int64), "blocks": np.array(self.blocks)}
        for j, ref in enumerate(self.references):
            out.update({f"ref{j}.{k}": v for k, v in ref.state().items()})
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        c = self.config
        self.references = [
            Reference.from_state({k[len(f"ref{j}."):]: v for k, v in state.items() if k.startswith(f"ref{j}.")},
                                 c.reference_size, c.block_size, self.max_k, c.alpha, c.aggregate_rank)
            for j in range(int(state["references"]))]
        self.refreshed = [int(b) for b in state["refreshed"]]
        self.blocks = int(state["blocks"])
        self._stacked = None

    def memory_bytes(self) -> dict[str, int]:
        return {"rows": sum(ref.row_bytes() for ref in self.references),
                "aggregates": sum(ref.aggregate_bytes() for ref in self.references) + 8 * len(self.refreshed) + 8}


def frozen_features(h: np.ndarray, space: FeatureSpace) -> np.ndarray:
    """z: what the reference signal compares. LN(h) without affine (as the router's h̃ uses), or a copy of h (the
    signal keeps rows of z, and h may be a buffer that the caller reuses)."""
    if space == "raw":
        return np.array(h, dtype=np.float32)
    h = np.asarray(h, dtype=np.float32)
    mean = h.mean(axis=1, keepdims=True)
    var = h.var(axis=1, keepdims=True)
    return (h - mean) / np.sqrt(var + 1e-5)


class NoveltyMonitor:
    """SGSE over a stream of (confidence, features) rows. Ray-free; the NoveltyMonitor actor wraps it."""

    def __init__(self, config: SGSEConfig = SGSEConfig(), device: torch.device | None = None):
        """`device`: where the reference signal computes its distances (None: numpy on the CPU)."""
        self.config = config
        self.signal: TrialSignal = (ReferenceSignal(config, device) if config.signal == "reference"
                                    else ConfidenceSignal(config))
        self.trials: list[bool] = []  # the current block's Bernoulli outcomes
        # the block's trials' feature sums, failed and all (float64; the new slot's key): rows (failed, all)
        self.centre_sums: np.ndarray | None = None
        self.centre_counts = np.zeros(2, np.int64)
        self.block_features: list[np.ndarray] = []  # their frozen features (reference signal)
        self.cooldown = 0
        self.filling = 0  # cooldown blocks added while the newest reference fills
        self.steps = 0
        self.tests = 0
        self.expansions = 0
        self.test_steps: list[int] = []  # when each test ran (for per-regime false-expansion rates)

    @property
    def needs_features(self) -> bool:
        return self.signal.needs_features

    def observe(self, confidences: np.ndarray, features: np.ndarray) -> list[Expansion]:
        """Feed a batch in stream order (`features`: the frozen features h, row for row); returns the expansions it
        triggered (usually none)."""
        cfg = self.config
        confidences, features = np.asarray(confidences, dtype=np.float64), np.asarray(features)
        if len(features) != len(confidences):
            raise ValueError(f"{len(confidences)} confidences for {len(features)} feature rows")
        z = frozen_features(features, cfg.feature_space) if self.needs_features else None
        if self.centre_sums is None:
            self.centre_sums = np.zeros((2, features.shape[1]))
        found: list[Expansion] = []
        start = 0
        while start < len(confidences):
            # up to the end of the current block (plus any warm-up): within it no reference changes
            end = min(start + self.signal.warmup_left() + cfg.block_size - len(self.trials), len(confidences))
            outcomes = np.asarray(self.signal.trials(confidences[start:end], None if z is None else z[start:end]),
                                  dtype=bool)
            first = end - len(outcomes)  # the chunk's first sample that is a trial
            self.steps += first - start
            self.trials.extend(outcomes.tolist())
            rows = features[first:end]
            self.centre_sums[0] += rows[~outcomes].sum(axis=0, dtype=np.float64)
            self.centre_sums[1] += rows.sum(axis=0, dtype=np.float64)
            self.centre_counts += (int((~outcomes).sum()), len(outcomes))
            if z is not None:
                self.block_features.extend(z[first:end])
            self.steps += len(outcomes)
            start = end
            if len(self.trials) == cfg.block_size:
                expansion = self._end_block()
                if expansion is not None:
                    found.append(expansion)
        return found

    def _end_block(self) -> Expansion | None:
        cfg = self.config
        trials = np.array(self.trials, dtype=bool)
        features = np.stack(self.block_features) if self.block_features else None
        expansion = None
        if self.cooldown > 0:
            self.cooldown -= 1
            self.signal.end_block(features, trials, "cooldown")
            if self.cooldown == 0 and self.filling < cfg.fill_blocks and self.signal.still_filling():
                self.cooldown, self.filling = 1, self.filling + 1
        else:
            expansion = self._test(trials)
            self.signal.end_block(features, trials, "passed" if expansion is None else "expanded")
        self.trials.clear()
        self.centre_sums[:] = 0
        self.centre_counts[:] = 0
        self.block_features.clear()
        return expansion

    def _test(self, trials: np.ndarray) -> Expansion | None:
        cfg = self.config
        k, n = int(trials.sum()), len(trials)
        self.tests += 1
        self.test_steps.append(self.steps)
        lower, _ = wilson_bounds(k, n, cfg.z)
        if not lower < cfg.tau_exp:
            return None
        self.expansions += 1
        self.cooldown, self.filling = cfg.cooldown_blocks, 0
        part = 0 if self.centre_counts[0] else 1  # the failed samples, or the whole block if none failed
        centre = self.centre_sums[part] / self.centre_counts[part]
        return Expansion(centre.astype(np.float32), k, n, float(lower), self.steps)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes the monitor keeps between batches: the per-sample feature rows of its references (at most
        `reference_bytes`) and its aggregates (the compacted references, the tracker's window)."""
        return self.signal.memory_bytes()

    def nbytes(self) -> int:
        return sum(self.memory_bytes().values())

    def state(self) -> dict[str, np.ndarray]:
        fwidth = len(self.block_features[0]) if self.block_features else 0
        return {
            **{f"signal.{k}": v for k, v in self.signal.state().items()},
            "trials": np.array(self.trials, dtype=bool),
            "centre_sums": self.centre_sums.copy() if self.centre_sums is not None else np.zeros((2, 0)),
            "centre_counts": self.centre_counts.copy(),
            "block_features": (np.stack(self.block_features) if self.block_features
                               else np.zeros((0, fwidth), np.float32)),
            "counters": np.array([self.cooldown, self.filling, self.steps, self.tests, self.expansions],
                                 dtype=np.int64),
            "test_steps": np.array(self.test_steps, dtype=np.int64),
            "config": np.array(repr(sorted(asdict(self.config).items()))),
        }

    def restore(self, state: dict[str, np.ndarray]) -> None:
        if str(state["config"]) != repr(sorted(asdict(self.config).items())):
            raise ValueError("SGSE state was saved under a different configuration")
        self.signal.restore({k[7:]: v for k, v in state.items() if k.startswith("signal.")})
        self.trials = [bool(t) for t in state["trials"]]
        sums = np.array(state["centre_sums"], np.float64)
        self.centre_sums = sums if sums.shape[1] else None
        self.centre_counts = np.array(state["centre_counts"], np.int64)
        self.block_features = list(np.asarray(state["block_features"]))
        self.cooldown, self.filling, self.steps, self.tests, self.expansions = (int(v) for v in state["counters"])
        self.test_steps = [int(s) for s in state["test_steps"]]
