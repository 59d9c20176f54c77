"""Analytic (closed-form ridge) heads: continual learning from running sums of feature statistics.

On frozen features a ridge head needs only G = Σ φ(x)φ(x)ᵀ and C = Σ φ(x)y(x)ᵀ (y one-hot):
W = (G + λI)⁻¹C. The sums do not depend on the order of the stream, keep no samples and add up across
workers, so after any task the head is exactly the joint ridge solution on all data seen (ACIL, DS-AL;
RanPAC adds the fixed random expansion φ(h) = ReLU(Rᵀh)).

Exactness. Float64 addition is not associative: replicas summing different subsets in different orders
would not reproduce one sequential accumulator bit for bit. So the statistics are exact fixed point: φ is
rounded to integer multiples of 2^-s (`fraction_bits`), every product φ_i φ_j is then an integer, and

* each Gram block is computed by float64 BLAS over row chunks small enough that every partial sum inside
  the matrix product stays below 2^53 (|Σ_n q_ni q_nj| ≤ Σ_n max_k q_nk², checked per chunk), so the BLAS
  result is the exact integer whatever order BLAS sums in;
* the running sums are int64 (exact up to 2^63, 2^10 more range than integer-valued float64 at the same
  bytes); |G_ij| ≤ max_k G_kk for a Gram matrix, so checking the diagonal before every addition guarantees
  no entry can overflow, and a sum that would is refused with an error naming the knob to lower.

The random expansion is exact as well: h is rounded to multiples of 2^-s and R to multiples of 2^-r of
its scale, so Rᵀh is an exact integer product and φ of a sample has the same bits whichever batch (or
replica) it is computed in. With s = 16 the rounding error (≤ 2^-17 per coordinate) is far below any
useful λ; the int64 sums hold about 2^62 / (2^2s · mean φ²) samples (10^9 for s = 16 and φ of order 1).

λ is chosen per task from `lambda_grid` by closed-form leave-one-out or a held-out split, on (a seeded
subsample of) the current task only, by generalised cross-validation over everything summed, from the
statistics alone, or (the default) by leave-one-out on a hash-chosen reservoir of the whole stream
(`Reservoir`), the last two the same however the stream was cut; see `AnalyticHead.select_lambda`. The head
can also blend in the nearest class mean (`mean_weight_grid`), and `half_life` makes the sums forget (a
drifting stream), still by exact integer operations.

MARS (`mars-analytic`): the head sits on h̃ of the slot memory, and stage 1 moves h̃ between tasks, so
statistics summed earlier describe features the memory no longer produces. `AnalyticConfig.drift` says
what the learner does about it (measured in benchmarks/RESULTS.md):

* "stale": nothing; old statistics stay as they were accumulated, prediction uses the current memory.
* "reproject": before adding a task, fit a linear map T from h̃ under the previous memory to h̃ under the
  current one (ridge towards the identity, on the current task's samples and the slots' anchor pairs),
  and carry the statistics over: G ← TᵀGT, C ← TᵀC (rounded back to fixed point; exactness is lost).
* "frozen": accumulate statistics of the frozen target stage 1 pulls h̃ towards (LN(h) or h, the
  smoothness target), which never drifts, and apply the memory at prediction: the head sees h̃.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from memcl_ops.arrow.schema import FEATURE_BOUND, FeatureBound
from memcl_ops.learner import FeatureMemory
from memcl_ops.tensors import best_class, layer_norm

EXACT = 2.0**53  # float64 integers below this are exact, and so is every sum that stays below it
SQUARABLE = 2.0**26  # a fixed-point value of at most this size squares below EXACT, with room for rounding
INT64_HEADROOM = 2.0**62  # int64 sums are refused before any entry could reach this
DECAY_UNIT = 2**16  # decay factors are multiples of 2^-16: p·entry stays inside int64 (see RidgeStatistics.decay)


@dataclass(frozen=True)
class AnalyticConfig:
    # M of φ(h) = ReLU(Rᵀh), below RanPAC's 10^4 since each fit factorises (M+1)² matrices (RESULTS.md); 0: φ(h) = h [R]
    expansion_dim: int = 2048
    bias: bool = True  # append a constant 1 to φ, penalised like every weight [R]
    fraction_bits: int = 16  # s: φ stored in exact multiples of 2^-s [R]
    projection_bits: int = 8  # r: entries of R in multiples of 2^-r of their scale [R]
    lambda_grid: tuple[float, ...] = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4)  # candidate λ [R]
    # "loo": closed-form leave-one-out of current-task samples under the joint fit (uses every sample, no extra
    # solve); "holdout": hold out a split of the current task, its statistics subtracted exactly; "gcv": generalised
    # cross-validation over everything summed, from the statistics alone; "reservoir": closed-form leave-one-out
    # of a reservoir of `selection_samples` samples kept from the whole stream, chosen by a hash of each sample
    # (`Reservoir`). "gcv" and "reservoir" give the same λ however the stream was cut into blocks; "reservoir" is
    # the default, the one accuracy-based rule among them (benchmarks/RESULTS.md) [R]
    lambda_selection: Literal["loo", "holdout", "gcv", "reservoir"] = "reservoir"
    # what the candidates are scored by on those samples: "accuracy" (error rate, ties broken by the squared error)
    # or "mse" (the squared error of the one-hot targets, PRESS under "loo") [R]
    lambda_criterion: Literal["accuracy", "mse"] = "accuracy"
    # samples the λ criterion is computed on: a seeded subsample of the current task, or the reservoir's size; the
    # candidates' leave-one-out accuracies lie within a few samples of each other, so fewer makes the choice a draw [R]
    selection_samples: int = 2048
    # α candidates of the nearest-mean blend, scored with λ on the same samples: the head's score of class c is
    # φᵀW_c + α·cos(φ, m_c), m_c the class mean of φ read off the statistics (C_c / n_c); 0 is the plain ridge head,
    # a large α the nearest-mean classifier (SimpleCIL in φ space); not with "gcv" or the "mse" criterion [R]
    mean_weight_grid: tuple[float, ...] = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
    # the nearest-mean scores the blend may add, chosen with λ and α: "cosine" (SimpleCIL's) and "euclidean",
    # −½‖φ − m_c‖² up to a term every class shares, divided by the mean ‖φ‖² (CapyMOA's NCM; with
    # expansion_dim 0 the Bayes rule of classes with one isotropic spread) [R]
    mean_kinds: tuple[Literal["cosine", "euclidean"], ...] = ("cosine", "euclidean")
    # forgetting: before a block of n samples is added, the sums so far are scaled by 2^(-n / half_life) (recursive
    # least squares with forgetting, at block granularity), so the head tracks a drifting stream; 0 keeps everything
    # (the exact joint solution). The scaling is an exact integer operation on the merged total [R]
    half_life: int = 0
    holdout_fraction: float = 0.2  # share of the current task held out when lambda_selection = "holdout" [R]
    drift: Literal["stale", "reproject", "frozen"] = "frozen"  # mars-analytic: see the module docstring [R]
    reproject_ridge: float = 100.0  # η of the reprojection's ridge towards the identity [R]

    def __post_init__(self) -> None:
        if self.expansion_dim < 0:
            raise ValueError(f"analytic.expansion_dim must be >= 0, got {self.expansion_dim}")
        if not 0 <= self.fraction_bits <= 24 or not 0 <= self.projection_bits <= 16:
            raise ValueError(f"analytic.fraction_bits must be in [0, 24] and projection_bits in [0, 16], got "
                             f"{self.fraction_bits}, {self.projection_bits}")
        if not self.lambda_grid or min(self.lambda_grid) <= 0:
            raise ValueError(f"analytic.lambda_grid needs at least one value, all > 0, got {self.lambda_grid}")
        if not self.mean_weight_grid or min(self.mean_weight_grid) < 0 or self.half_life < 0:
            raise ValueError(f"analytic.mean_weight_grid needs values >= 0 and half_life >= 0, got "
                             f"{self.mean_weight_grid}, {self.half_life}")
        if max(self.mean_weight_grid) > 0 and (self.lambda_selection == "gcv" or not self.bias
                                               or self.lambda_criterion != "accuracy"):
            raise ValueError("analytic.mean_weight_grid above 0 is scored on samples (not gcv), by accuracy, and needs "
                             "bias = true (the bias coordinate is left out of the class means); set "
                             "analytic.mean_weight_grid=[0] for the plain ridge head")
        if not self.mean_kinds or not set(self.mean_kinds) <= {"cosine", "euclidean"}:
            raise ValueError(f"analytic.mean_kinds: {list(self.mean_kinds)}; one or both of cosine, euclidean")
        if self.half_life and self.lambda_selection == "gcv":
            raise ValueError("analytic.lambda_selection = gcv counts every sample once; it cannot score a head with "
                             "half_life > 0")
        if self.selection_samples < 1 or not 0 < self.holdout_fraction < 1 or self.reproject_ridge <= 0:
            raise ValueError("analytic needs selection_samples >= 1, 0 < holdout_fraction < 1, reproject_ridge > 0; "
                             f"got {self.selection_samples}, {self.holdout_fraction}, {self.reproject_ridge}")


# The products below are of integer-valued float64 arrays whose partial sums all stay below 2^53: the exact integers
# in any summation order, so a product in torch on a device (a GPU) is numpy's bit for bit.

def _on(x: np.ndarray, device: torch.device) -> torch.Tensor:
    """`x` copied to `device` (a C-ordered copy first: any strides, read-only arrays too)."""
    return torch.from_numpy(np.array(x, np.float64, order="C")).to(device)


def _gram_and_targets(part: np.ndarray, onehot: np.ndarray, device: torch.device | None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(partᵀpart, partᵀonehot), on `device` (None: numpy), each input copied there once."""
    if device is None:
        return part.T @ part, part.T @ onehot
    rows, labels = _on(part, device), _on(onehot, device)
    return (rows.T @ rows).cpu().numpy(), (rows.T @ labels).cpu().numpy()


class FeatureMap:
    """φ(h) in exact fixed point: integer-valued float64 arrays in units of 2^-s (`fraction_bits`).

    With `expansion_dim` M > 0, φ(h) = ReLU(Rᵀh) with R ~ N(0, 1/D) up to a power of two, fixed by `seed`
    (RanPAC's random expansion); the product is computed on integers (h in units of 2^-s, R in units of
    2^-r), so it is exact and each sample's φ is independent of the batch it came in, and of the device that
    multiplied (`to`).
    """

    def __init__(self, input_dim: int, config: AnalyticConfig, seed: int):
        self.input_dim, self.config, self.seed = input_dim, config, seed
        self.unit = 2.0**config.fraction_bits
        self.device: torch.device | None = None  # where R multiplies (None: numpy)
        self.projection_on_device: torch.Tensor | None = None
        self.projection: np.ndarray | None = None
        if config.expansion_dim:
            gen = np.random.default_rng([seed, input_dim, config.expansion_dim])
            normal = gen.standard_normal((input_dim, config.expansion_dim))
            self.projection = np.rint(normal * 2.0**config.projection_bits)  # integers
            self.projection_max = float(np.abs(self.projection).max())
            # back to units of 2^-s: undo R's 2^r and scale by ~1/sqrt(D), both powers of two (exact)
            self.rescale = 2.0 ** -(config.projection_bits + round(np.log2(np.sqrt(input_dim))))

    def to(self, device: torch.device | None) -> None:
        """Multiply by R with torch on `device` (None: numpy), R copied there once."""
        self.device = device
        self.projection_on_device = (_on(self.projection, device)
                                     if device is not None and self.projection is not None else None)

    @property
    def dim(self) -> int:
        return (self.config.expansion_dim or self.input_dim) + int(self.config.bias)

    @property
    def key(self) -> tuple:
        """What fixes φ: statistics summed under equal keys describe the same features and can be added."""
        c = self.config
        return self.input_dim, c.expansion_dim, c.bias, c.fraction_bits, c.projection_bits, self.seed

    def __call__(self, h: np.ndarray | torch.Tensor) -> np.ndarray:
        h = np.asarray(h.detach() if isinstance(h, torch.Tensor) else h, dtype=np.float64)
        if h.ndim != 2 or h.shape[1] != self.input_dim:
            raise ValueError(f"features must have shape (N, {self.input_dim}), got {h.shape}")
        if not np.isfinite(h).all():
            raise ValueError("features must be finite")
        q = np.rint(h * self.unit)
        if self.projection is not None:
            worst = float(np.abs(q).sum(axis=1).max(initial=0.0)) * self.projection_max
            if worst >= EXACT:
                raise OverflowError(f"a feature row of L1 norm {worst / self.projection_max / self.unit:.3g} is too "
                                    f"large for an exact projection at analytic.fraction_bits = "
                                    f"{self.config.fraction_bits}; lower it")
            product = (q @ self.projection if self.device is None
                       else (_on(q, self.device) @ self.projection_on_device).cpu().numpy())
            q = np.rint(np.maximum(product, 0.0) * self.rescale)
        if self.config.bias:
            q = np.concatenate([q, np.full((len(q), 1), self.unit)], axis=1)
        return q

    def to_float(self, q: np.ndarray) -> np.ndarray:
        return q / self.unit

    def input_bound(self) -> FeatureBound:
        """The features every one of whose rows this map takes exactly (the gate refuses the rest): each value at
        most 2^26 units of 2^-s, so its square stays below 2^53, and with the random expansion, a row's L1 norm
        small enough that Rᵀh is exact and each expanded value squares below 2^53 too. Never above every method's
        bound (FEATURE_BOUND)."""
        s = self.config.fraction_bits
        why = f"the analytic head's exact fixed point at analytic.fraction_bits = {s}"
        if self.projection is None:
            return FeatureBound(min(FEATURE_BOUND, SQUARABLE / self.unit), None, why + ": 2^(26 - fraction_bits)")
        # |q| <= L1(h)·2^s + D/2 after rounding; |Rᵀq| <= L1(q)·max|R|; the expansion keeps that times `rescale`
        largest = min((SQUARABLE - 1) / (self.projection_max * self.rescale), (EXACT - 1) / self.projection_max)
        return FeatureBound(FEATURE_BOUND, (largest - self.input_dim / 2) / self.unit,
                            why + " and its random expansion")


def _exact_gram_chunks(q: np.ndarray) -> list[slice]:
    """Row chunks of q whose Gram products are exact in float64: Σ_rows max_k q_nk² < 2^53 per chunk."""
    worst = np.abs(q).max(axis=1, initial=0.0) ** 2
    if len(worst) and worst.max() >= EXACT:
        raise OverflowError(f"a feature of magnitude {np.sqrt(worst.max()):.3g} (in units of 2^-s) cannot be squared "
                            "exactly; lower analytic.fraction_bits")
    chunks, start, total = [], 0, 0.0
    for n, w in enumerate(worst):
        if total + w >= EXACT:
            chunks.append(slice(start, n))
            start, total = n, 0.0
        total += w
    chunks.append(slice(start, len(worst)))
    return chunks


class RidgeStatistics:
    """Exact sums G = Σ qqᵀ (units 2^-2s) and C = Σ q yᵀ (units 2^-s) as int64, with C's columns over the
    classes seen, kept sorted so partial statistics merge into the same layout whatever order classes came in.
    """

    def __init__(self, dim: int):
        self.dim = dim
        self.gram = np.zeros((dim, dim), np.int64)
        self.targets = np.zeros((dim, 0), np.int64)
        self.classes = np.zeros(0, np.int64)
        self.count = 0

    def _grow(self, classes: np.ndarray) -> None:
        """Add zero columns for classes not seen yet; the other columns keep their values."""
        merged = np.union1d(self.classes, classes)
        if len(merged) != len(self.classes):
            targets = np.zeros((self.dim, len(merged)), np.int64)
            targets[:, np.searchsorted(merged, self.classes)] = self.targets
            self.classes, self.targets = merged, targets

    def _check_headroom(self, added_diagonal: np.ndarray) -> None:
        # |G_ij| <= max_k G_kk (Cauchy-Schwarz) and |C_ij| <= G_ii (integers: |q| <= q^2), so the diagonal bounds all
        if len(added_diagonal) and float(self.gram.diagonal().max()) + float(added_diagonal.max()) >= INT64_HEADROOM:
            raise OverflowError(f"the analytic statistics would exceed the exact int64 range after {self.count} "
                                "samples; lower analytic.fraction_bits")

    def add(self, q: np.ndarray, labels: np.ndarray, sign: int = 1, device: torch.device | None = None) -> None:
        """Fold rows q (integer-valued float64 from `FeatureMap`) with their labels in (sign = -1 takes them out);
        the products on `device` (None: numpy), the same integers wherever."""
        labels = np.asarray(labels, np.int64)
        if q.shape != (len(labels), self.dim):
            raise ValueError(f"statistics of dim {self.dim} need q of shape (N, {self.dim}) and N labels, got "
                             f"{q.shape} and {len(labels)}")
        if len(labels) and labels.min() < 0:
            raise ValueError(f"labels must be >= 0, got {labels.min()}")
        self._grow(labels)
        onehot = (labels[:, None] == self.classes[None, :]).astype(np.float64)
        for rows in _exact_gram_chunks(q):
            gram, targets = _gram_and_targets(q[rows], onehot[rows], device)
            gram = gram.astype(np.int64)
            self._check_headroom(gram.diagonal())
            self.gram += sign * gram
            self.targets += sign * targets.astype(np.int64)
        self.count += sign * len(labels)

    def merge(self, other: RidgeStatistics) -> None:
        """Add another accumulator's sums (exact integer addition: the result does not depend on order)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge statistics of dim {other.dim} into dim {self.dim}")
        self._check_headroom(other.gram.diagonal())
        self._grow(other.classes)
        self.gram += other.gram
        self.targets[:, np.searchsorted(self.classes, other.classes)] += other.targets
        self.count += other.count

    def decay(self, factor: float) -> None:
        """Scale the sums by `factor` in [0, 1], rounded to p / 2^16: each entry becomes floor(entry · p / 2^16),
        computed in int64 without overflow (entry = hi·2^31 + lo), so the result is the same integer on any
        machine and a merged total decays exactly as a single accumulator would. `count` stays the samples seen."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"a decay factor must be in [0, 1], got {factor}")
        p = np.int64(round(factor * DECAY_UNIT))
        if p == DECAY_UNIT:
            return
        for name in ("gram", "targets"):
            sums = getattr(self, name)
            high, low = sums >> 31, sums & np.int64(2**31 - 1)
            setattr(self, name, ((high * p) << 15) + ((low * p) >> 16))

    def absorb(self, block: RidgeStatistics, half_life: int) -> None:
        """Add a block's sums after forgetting: the sums so far are scaled by 2^(-n / half_life) for a block of n
        samples (half_life 0: nothing is forgotten)."""
        if half_life and self.count:
            self.decay(2.0 ** (-block.count / half_life))
        self.merge(block)

    def copy(self) -> RidgeStatistics:
        return RidgeStatistics.from_state(self.state())

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> RidgeStatistics:
        out = cls(np.asarray(state["targets"]).shape[0])
        out.restore(state)
        return out

    def state(self) -> dict[str, np.ndarray]:
        """The upper triangle of the symmetric G only (half the bytes; none while nothing is summed), C, the classes
        and the count."""
        upper = self.gram[np.triu(np.ones((self.dim, self.dim), bool))] if self.count else np.zeros(0, np.int64)
        return {"gram_upper": upper, "targets": self.targets.copy(), "classes": self.classes.copy(),
                "count": np.array(self.count)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        upper = np.triu(np.ones((self.dim, self.dim), bool))
        packed = np.asarray(state["gram_upper"])
        if packed.shape not in ((0,), (int(upper.sum()),)):
            raise ValueError(f"statistics state does not fit dim {self.dim}")
        gram = np.zeros((self.dim, self.dim), np.int64)
        if packed.size:
            gram[upper] = packed
        self.gram = gram + np.triu(gram, 1).T
        self.targets = np.array(state["targets"], np.int64)
        self.classes = np.array(state["classes"], np.int64)
        self.count = int(state["count"])

    def nbytes(self) -> int:
        gram = self.dim * (self.dim + 1) // 2 * 8 if self.count else 0
        return gram + self.targets.nbytes + self.classes.nbytes


class Reservoir:
    """Samples kept from the whole stream for choosing λ (and α): the `size` samples of lowest priority, where a
    sample's priority is a hash of its features and label, so which samples are kept does not depend on the order
    they came in or on how the stream was cut into blocks (a bottom-k sketch). With a half-life the sample is
    recency-weighted like the decayed sums (Efraimidis-Spirakis keys u^(1/w), w = 2^(t / half_life), t the samples
    seen when its block was added), so the kept samples follow what the head still remembers.
    """

    def __init__(self, size: int, half_life: int = 0):
        self.size, self.half_life = size, half_life
        self.features = np.zeros((0, 0), np.float32)
        self.labels = np.zeros(0, np.int64)
        self.priority = np.zeros(0, np.float64)
        self.added_at = np.zeros(0, np.int64)  # samples seen once the sample's block was summed

    def add(self, features: np.ndarray, labels: np.ndarray, added_at: int) -> None:
        features, labels = np.ascontiguousarray(features), np.asarray(labels, np.int64)
        digests = [hashlib.blake2b(row.tobytes() + label.tobytes(), digest_size=8).digest()
                   for row, label in zip(features, labels)]
        uniform = (np.frombuffer(b"".join(digests), np.uint64).astype(np.float64) + 0.5) / 2.0**64
        priority = np.log(-np.log(uniform))  # smaller is kept: the log of ES's -log(key), here with w = 1
        if self.half_life:
            priority -= added_at / self.half_life * np.log(2.0)
        if not len(self.labels):
            self.features = np.zeros((0, features.shape[1]), features.dtype)
        kept = np.concatenate([self.features, features]), np.concatenate([self.labels, labels])
        priority = np.concatenate([self.priority, priority])
        added = np.concatenate([self.added_at, np.full(len(labels), added_at, np.int64)])
        order = np.argsort(priority, kind="stable")[:self.size]
        self.features, self.labels, self.priority, self.added_at = kept[0][order], kept[1][order], priority[order], \
            added[order]

    def weights(self, seen: int) -> np.ndarray:
        """Each kept sample's weight in the sums after `seen` samples (1 without forgetting)."""
        if not self.half_life:
            return np.ones(len(self.labels))
        return 2.0 ** (-(seen - self.added_at) / self.half_life)

    def state(self) -> dict[str, np.ndarray]:
        return {"features": self.features.copy(), "labels": self.labels.copy(), "priority": self.priority.copy(),
                "added_at": self.added_at.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.features, self.labels = np.array(state["features"]), np.array(state["labels"], np.int64)
        self.priority, self.added_at = np.array(state["priority"]), np.array(state["added_at"], np.int64)

    def nbytes(self) -> int:
        return self.features.nbytes + self.labels.nbytes + self.priority.nbytes + self.added_at.nbytes


@dataclass(frozen=True)
class Choice:
    """What `AnalyticHead.select_lambda` picked: λ, the nearest-mean weight α and score, and the error of every λ at
    that α and score."""

    lam: float
    mean_weight: float
    errors: dict[float, float]
    mean_kind: str = "cosine"


def _same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _cholesky(gram: torch.Tensor, lam: float) -> torch.Tensor:
    factor, info = torch.linalg.cholesky_ex(gram + lam * torch.eye(len(gram), dtype=gram.dtype))
    if int(info):
        raise ValueError(f"G + λI is not positive definite at λ = {lam:g}; use a larger λ")
    return factor


class AnalyticHead:
    """A ridge head over φ(features): `update` sums statistics, `merge` adds another head's, `solve(λ)` computes
    W = (G + λI)⁻¹C by Cholesky, `select_lambda` picks λ on a block, `predict` returns global class ids."""

    def __init__(self, input_dim: int, config: AnalyticConfig = AnalyticConfig(), seed: int = 0):
        self.config, self.seed = config, seed
        self.feature_map = FeatureMap(input_dim, config, seed)
        self.stats = RidgeStatistics(self.feature_map.dim)
        self.weight = np.zeros((self.feature_map.dim, 0))
        self.weight_classes = np.zeros(0, np.int64)  # the classes W was solved for (the stats may have more)
        self.lam = float("nan")
        self.mean_weight = 0.0  # α of the nearest-mean blend (AnalyticConfig.mean_weight_grid)
        self.mean_kind = "cosine"  # its score (AnalyticConfig.mean_kinds)
        # cosine: the unit class means of φ without the bias; euclidean: m_c / s and −½‖m_c‖² / s, s the mean ‖φ‖²
        self.mean_directions = np.zeros((self.feature_map.dim - 1, 0))
        self.mean_offsets = np.zeros(0)

    def to(self, device: torch.device | None) -> None:
        """Sum the statistics (and expand the features) on `device` (None or the CPU: numpy); the sums are the
        same integers wherever, solving stays on the CPU."""
        self.feature_map.to(None if device is None or device.type == "cpu" else device)

    def update(self, features: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> None:
        """Sum a block in, after forgetting the sums so far by the block's size (`half_life`; none at 0)."""
        block = RidgeStatistics(self.stats.dim)
        block.add(self.feature_map(features), np.asarray(labels), device=self.feature_map.device)
        self.stats.absorb(block, self.config.half_life)

    def merge(self, other: AnalyticHead) -> None:
        if self.feature_map.key != other.feature_map.key:
            raise ValueError(f"only heads with the same feature map can merge: (input dim, expansion_dim, bias, "
                             f"fraction_bits, projection_bits, seed) {self.feature_map.key} != {other.feature_map.key}")
        self.stats.merge(other.stats)

    def _float_stats(self, stats: RidgeStatistics) -> tuple[torch.Tensor, torch.Tensor]:
        unit = self.feature_map.unit
        return (torch.from_numpy(stats.gram.astype(np.float64) / unit**2),
                torch.from_numpy(stats.targets.astype(np.float64) / unit))

    def _solve(self, stats: RidgeStatistics, lam: float) -> np.ndarray:
        gram, targets = self._float_stats(stats)
        return torch.cholesky_solve(targets, _cholesky(gram, lam)).numpy()

    def solve(self, lam: float, mean_weight: float = 0.0, mean_kind: str = "cosine") -> np.ndarray:
        """W = (G + λI)⁻¹C over every class seen, and the nearest-mean score (`mean_kind`) the head adds at weight
        α = `mean_weight` (none at 0); returns W (dim × classes)."""
        if lam <= 0 or mean_weight < 0:
            raise ValueError(f"λ must be > 0 and the mean weight >= 0, got {lam}, {mean_weight}")
        self.weight, self.weight_classes, self.lam = self._solve(self.stats, lam), self.stats.classes.copy(), lam
        self.mean_weight, self.mean_kind = mean_weight, mean_kind
        self.mean_directions = np.zeros((self.feature_map.dim - 1, 0))
        self.mean_offsets = np.zeros(0)
        if mean_weight:
            gram, targets = self._float_stats(self.stats)
            sums = self._class_sums(targets).numpy()
            if mean_kind == "cosine":
                self.mean_directions = sums / np.maximum(np.linalg.norm(sums, axis=0), 1e-12)
            else:
                means, scale = self._class_means(gram, targets)
                self.mean_directions = means.numpy() / scale
                self.mean_offsets = -0.5 * means.pow(2).sum(dim=0).numpy() / scale
        return self.weight

    def _class_means(self, gram: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(m_c of φ without the bias, one column per class; the mean ‖φ‖² without the bias): the bias coordinate's
        row of C counts each class's (decayed) samples, its diagonal entry of G all of them."""
        counts = targets[-1].clamp_min(1e-12)
        return self._class_sums(targets) / counts, float(gram.diagonal()[:-1].sum() / gram[-1, -1].clamp_min(1e-12))

    def select_lambda(self, features: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, seed: int = 0,
                      weights: np.ndarray | None = None) -> Choice:
        """λ from `lambda_grid` (and α from `mean_weight_grid`) with the lowest error (`lambda_criterion`) on
        samples already in the statistics: the current block, or the reservoir (`weights`: each sample's weight in
        the decayed sums).

        "loo" / "reservoir": the closed-form leave-one-out residual of sample n under the joint fit on everything
        summed, e_n = (y_n - ŷ_n) / (1 - w_n φ_nᵀ(G + λI)⁻¹φ_n): exact, needs no extra fit, and every scored sample
        both trains and validates; the nearest-mean score leaves the sample out of its class sum too. "holdout": a
        seeded split of the current block is subtracted (exactly) from the statistics, the head solved on the rest
        and scored on it. At most `selection_samples` samples are scored. One Cholesky per λ candidate.
        """
        cfg = self.config
        if cfg.lambda_selection == "gcv":
            scores = self.gcv_scores()
            return Choice(min(scores, key=scores.__getitem__), 0.0, scores)
        features, labels = np.asarray(features), np.asarray(labels, np.int64)
        order = np.random.default_rng([self.seed, seed]).permutation(len(labels))
        fit = self.stats
        if cfg.lambda_selection == "holdout":
            order = order[:max(1, round(cfg.holdout_fraction * len(labels)))]
            fit = self.stats.copy()
            fit.add(self.feature_map(features[order]), labels[order], sign=-1, device=self.feature_map.device)
        scored = order[:cfg.selection_samples]
        x = torch.from_numpy(self.feature_map.to_float(self.feature_map(features[scored])))
        y = torch.from_numpy((labels[scored][:, None] == self.stats.classes[None, :]).astype(np.float64))
        w = torch.ones(len(scored), dtype=torch.float64) if weights is None else torch.from_numpy(weights[scored])
        gram, targets = self._float_stats(fit)
        nearest: dict[str, torch.Tensor | float] = {"cosine": 0.0}
        if max(cfg.mean_weight_grid) > 0:  # held-out samples are not in `fit`'s class sums: nothing to take out
            left_out = w * (cfg.lambda_selection != "holdout")
            nearest = {kind: (self._left_out_mean_similarity(x, y, left_out, targets) if kind == "cosine"
                              else self._left_out_euclidean(x, y, left_out, gram, targets)) for kind in cfg.mean_kinds}
        scores = {}
        for lam in cfg.lambda_grid:
            factor = _cholesky(gram, lam)
            residual = y - x @ torch.cholesky_solve(targets, factor)
            if cfg.lambda_selection in ("loo", "reservoir"):
                # φᵀ(LLᵀ)⁻¹φ = ‖L⁻¹φ‖²: one triangular solve
                leverage = torch.linalg.solve_triangular(factor, x.T, upper=False).pow(2).sum(dim=0)
                residual = residual / (1.0 - w * leverage).clamp_min(1e-12)[:, None]
            mse = float(residual.pow(2).sum(dim=1).mean())
            for order_of_kind, (kind, score) in enumerate(nearest.items()):
                for alpha in cfg.mean_weight_grid:
                    if alpha == 0 and order_of_kind:  # α = 0 adds no score: one candidate
                        continue
                    predicted = (y - residual + alpha * score).argmax(dim=1)
                    error_rate = float((predicted != y.argmax(dim=1)).double().mean())
                    # ties: the smaller squared error, the smaller nearest-mean weight, the earlier score kind
                    scores[lam, alpha, kind] = ((error_rate, mse, alpha, order_of_kind)
                                                if cfg.lambda_criterion == "accuracy" else (mse,))
        lam, alpha, kind = min(scores, key=scores.__getitem__)
        return Choice(lam, alpha, {cand: scores[cand, alpha, kind][0] for cand in cfg.lambda_grid}, kind)

    def _class_sums(self, targets: torch.Tensor) -> torch.Tensor:
        """Σ φ over each class's samples without the bias coordinate (C's rows), the nearest-mean classifier's
        class directions up to scale."""
        return targets[:-1]

    def _left_out_mean_similarity(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                                  targets: torch.Tensor) -> torch.Tensor:
        """cos(φ_n, m_c) for every scored sample and class, with sample n taken out of its own class's sum."""
        sums, phi = self._class_sums(targets), x[:, :-1]
        dots = phi @ sums  # (n, classes)
        norms = sums.pow(2).sum(dim=0).expand_as(dots).clone()
        own_dot = (dots * y).sum(dim=1)
        phi_sq = phi.pow(2).sum(dim=1)
        own_left_out = own_dot - w * phi_sq
        norms[y.bool()] = (norms[y.bool()] - 2 * w * own_dot + w.pow(2) * phi_sq).clamp_min(0.0)
        dots[y.bool()] = own_left_out
        return dots / (phi_sq.sqrt()[:, None] * norms.sqrt()).clamp_min(1e-12)

    def _left_out_euclidean(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, gram: torch.Tensor,
                            targets: torch.Tensor) -> torch.Tensor:
        """(φ_nᵀm_c − ½‖m_c‖²) / s for every scored sample and class, as if sample n had never been summed: m_c the
        class mean of φ (without the bias) with n out of its own class's sum and count, s the mean ‖φ‖² without n.
        A class left with no weight scores 0."""
        sums, phi = self._class_sums(targets), x[:, :-1]
        dots = phi @ sums  # φ_n · S_c
        sums_sq = sums.pow(2).sum(dim=0).expand_as(dots).clone()  # ‖S_c‖²
        counts = targets[-1].expand_as(dots).clone()
        own, phi_sq = y.bool(), phi.pow(2).sum(dim=1)
        own_dot = (dots * y).sum(dim=1)
        dots[own] = own_dot - w * phi_sq
        sums_sq[own] = (sums_sq[own] - 2 * w * own_dot + w.pow(2) * phi_sq).clamp_min(0.0)
        counts[own] = counts[own] - w
        empty = counts <= 1e-9
        counts = counts.clamp_min(1e-9)
        scale = (gram.diagonal()[:-1].sum() - w * phi_sq) / (gram[-1, -1] - w).clamp_min(1e-9)
        score = (dots / counts - 0.5 * sums_sq / counts.pow(2)) / scale.clamp_min(1e-12)[:, None]
        return torch.where(empty, torch.zeros_like(score), score)

    def gcv_scores(self) -> dict[float, float]:
        """Generalised cross-validation of every λ candidate over all N samples summed, from G, C and N only:
        GCV(λ) = N·RSS(λ) / (N − tr H(λ))², with G = U diag(s) Uᵀ and Cᵤ = UᵀC,
        RSS = N − 2 Σᵢ ‖Cᵤᵢ‖² / (sᵢ + λ) + Σᵢ sᵢ ‖Cᵤᵢ‖² / (sᵢ + λ)²   (Σ‖y‖² = N for one-hot y),
        tr H = Σᵢ sᵢ / (sᵢ + λ). One eigendecomposition serves every candidate; the statistics are exact sums, so
        the scores do not depend on how the stream was cut."""
        gram, targets = self._float_stats(self.stats)
        s, u = torch.linalg.eigh(gram)
        s = s.clamp_min(0.0)
        energy = (u.T @ targets).pow(2).sum(dim=1)
        n = float(self.stats.count)
        scores = {}
        for lam in self.config.lambda_grid:
            rss = n - 2.0 * float((energy / (s + lam)).sum()) + float((s * energy / (s + lam) ** 2).sum())
            dof = float((s / (s + lam)).sum())
            scores[lam] = n * rss / max(n - dof, 1e-12) ** 2
        return scores

    def logits(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        phi = self.feature_map.to_float(self.feature_map(features))
        scores = phi @ self.weight
        if self.mean_weight:
            body = phi[:, :-1]
            if self.mean_kind == "cosine":
                scores += self.mean_weight * (body @ self.mean_directions) / np.maximum(
                    np.linalg.norm(body, axis=1, keepdims=True), 1e-12)
            else:
                scores += self.mean_weight * (body @ self.mean_directions + self.mean_offsets)
        return scores

    def predict(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        """Global class ids of the highest score (-1 before the first solve)."""
        return self.scored(features)[0]

    def scored(self, features: np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(the class of the highest score, that score) per row."""
        scores = self.logits(features) if len(self.weight_classes) else None
        return best_class(self.weight_classes, scores, len(features))

    def state(self) -> dict[str, np.ndarray]:
        return {**{f"stats.{k}": v for k, v in self.stats.state().items()}, "weight": self.weight.copy(),
                "weight_classes": self.weight_classes.copy(), "lambda": np.array(self.lam),
                "mean_weight": np.array(self.mean_weight), "mean_directions": self.mean_directions.copy(),
                "mean_euclidean": np.array(self.mean_kind == "euclidean"), "mean_offsets": self.mean_offsets.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.stats.restore({k[6:]: v for k, v in state.items() if k.startswith("stats.")})
        self.weight = np.array(state["weight"], np.float64)
        self.weight_classes = np.array(state["weight_classes"], np.int64)
        self.lam = float(state["lambda"])
        self.mean_weight = float(state["mean_weight"])
        self.mean_directions = np.array(state["mean_directions"], np.float64)
        self.mean_kind = "euclidean" if bool(state["mean_euclidean"]) else "cosine"
        self.mean_offsets = np.array(state["mean_offsets"], np.float64)

    def nbytes(self) -> dict[str, int]:
        """Persistent bytes: the statistics, and W with its class ids and class means (R is regenerated from the
        seed)."""
        return {"statistics": self.stats.nbytes(),
                "weights": self.weight.nbytes + self.weight_classes.nbytes + self.mean_directions.nbytes
                + self.mean_offsets.nbytes}


class AnalyticLearner:
    """The `HeadLearner` of `analytic`, `analytic-rp` (memory None: φ of the frozen features) and `mars-analytic`
    (the head on the slot memory's h̃, drift handled as `config.drift` says).

    Each batch is summed into the statistics as it streams (`observe`), and W is solved again, with the λ chosen
    last, before the head predicts; a consolidation (`settle`) chooses λ again, on the block or the reservoir. So
    after every consolidation the head is the joint ridge solution on everything seen (exactly, unless "reproject"
    has moved the sums). Before the first choice the lazy solve takes the median of `lambda_grid` and no
    nearest-mean blend. `frozen_target` is stage 1's smoothness target ("ln": LN(h), "raw": h), what the "frozen"
    option sums.
    """

    def __init__(self, feature_dim: int, config: AnalyticConfig, seed: int, frozen_target: str = "ln"):
        self.config, self.frozen_target = config, frozen_target
        self.head = AnalyticHead(feature_dim, config, seed)
        self.previous_memory: dict[str, np.ndarray] = {}  # the memory at the last observed batch ("reproject" only)
        self.fits = 0
        self.seen = 0  # samples summed so far
        self.reservoir = Reservoir(config.selection_samples, config.half_life)  # "reservoir" selection only
        self.unsolved = False  # batches summed since W was last solved

    def to(self, device: torch.device) -> None:
        """Sum the statistics on `device` (the host's): the same integers as on the CPU."""
        self.head.to(device)

    def _train_inputs(self, features: torch.Tensor, memory: FeatureMemory | None) -> torch.Tensor:
        if memory is None:
            return features
        if self.config.drift == "frozen":
            return layer_norm(features) if self.frozen_target == "ln" else features
        return memory(features).h_tilde

    @torch.no_grad()
    def observe(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> None:
        """One batch summed in (and offered to the reservoir); W is solved again before the next prediction."""
        if memory is not None and self.config.drift == "reproject":
            state = memory.state()
            if self.previous_memory and self.head.stats.count and not _same_state(state, self.previous_memory):
                self._reproject(features, memory)
            self.previous_memory = state
        x = self._train_inputs(features, memory)
        self.head.update(x, labels)
        self.seen += len(labels)
        if self.config.lambda_selection == "reservoir":
            self.reservoir.add(np.asarray(x), np.asarray(labels), self.seen)
        self.unsolved = True

    @torch.no_grad()
    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Learn a block: `observe` it, then `settle`."""
        self.observe(features, labels, memory)
        return self.settle(features, labels, memory)

    @torch.no_grad()
    def settle(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """A consolidation of a block `observe` summed already: λ (and α) chosen on the block or the reservoir, W
        solved on everything summed."""
        x = self._train_inputs(features, memory)
        if self.config.lambda_selection == "reservoir":
            choice = self.head.select_lambda(self.reservoir.features, self.reservoir.labels,
                                             weights=self.reservoir.weights(self.seen))
        else:
            choice = self.head.select_lambda(x, labels, seed=self.fits)
        self.head.solve(choice.lam, choice.mean_weight, choice.mean_kind)
        self.fits += 1
        self.unsolved = False
        return {"lambda": choice.lam, "mean_weight": choice.mean_weight, "mean_euclidean": choice.mean_kind != "cosine",
                "selection_error": choice.errors[choice.lam]}

    def _solved(self) -> AnalyticHead:
        if self.unsolved and self.head.stats.count:
            chosen = not np.isnan(self.head.lam)
            lam = self.head.lam if chosen else float(np.median(self.config.lambda_grid))
            self.head.solve(lam, self.head.mean_weight if chosen else 0.0, self.head.mean_kind)
            self.unsolved = False
        return self.head

    def _reproject(self, features: torch.Tensor, memory: FeatureMemory) -> None:
        """Carry the statistics from h̃ under the previous memory to h̃ under `memory` by a linear map T in φ
        space, fitted on the memory's pairs (φ(h̃_old), φ(h̃_new)) (`FeatureMemory.drift_pairs`: the current
        block's samples and, for MARS, the slots' anchors), each set with half the weight
        (the anchors stand for the old tasks): T = I + (XᵀΩX + ηI)⁻¹XᵀΩ(X' - X)."""
        pairs = memory.drift_pairs(self.previous_memory, features)
        fmap, eta = self.head.feature_map, self.config.reproject_ridge
        lhs = eta * torch.eye(fmap.dim, dtype=torch.float64)
        rhs = torch.zeros(fmap.dim, fmap.dim, dtype=torch.float64)
        for old, new in pairs:
            if not len(old):
                continue
            x_old = torch.from_numpy(fmap.to_float(fmap(old)))
            x_new = torch.from_numpy(fmap.to_float(fmap(new)))
            weight = 0.5 / len(old) * len(features)  # each set carries half of the block's sample count
            lhs += weight * x_old.T @ x_old
            rhs += weight * x_old.T @ (x_new - x_old)
        t = torch.eye(fmap.dim, dtype=torch.float64) + torch.linalg.solve(lhs, rhs)
        stats = self.head.stats
        gram = t.T @ torch.from_numpy(stats.gram.astype(np.float64)) @ t
        stats.gram = np.rint(((gram + gram.T) / 2).numpy()).astype(np.int64)
        stats.targets = np.rint((t.T @ torch.from_numpy(stats.targets.astype(np.float64))).numpy()).astype(np.int64)

    def end_task(self, memory: FeatureMemory | None) -> None:
        """Nothing: every consolidation already solved the head again."""

    @torch.no_grad()
    def predict(self, features: torch.Tensor, memory: FeatureMemory | None) -> np.ndarray:
        return self.scored(features, memory)[0]

    @torch.no_grad()
    def scored(self, features: torch.Tensor, memory: FeatureMemory | None) -> tuple[np.ndarray, np.ndarray]:
        return self._solved().scored(features if memory is None else memory(features).h_tilde)

    def frozen(self) -> AnalyticLearner:
        """A copy that predicts as this head does now: W and the class means, the feature map shared, no sums."""
        head = copy.copy(self._solved())  # `solve` replaces W and the means, never changes them in place
        head.stats = RidgeStatistics(head.stats.dim)
        out = copy.copy(self)
        out.head, out.unsolved = head, False
        return out

    def state(self) -> dict[str, np.ndarray]:
        return {**{f"head.{k}": v for k, v in self.head.state().items()},
                **{f"previous_memory.{k}": v.copy() for k, v in self.previous_memory.items()},
                **{f"reservoir.{k}": v for k, v in self.reservoir.state().items()},
                "fits": np.array(self.fits), "seen": np.array(self.seen), "unsolved": np.array(self.unsolved)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.restore({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        self.previous_memory = {k[16:]: np.array(v) for k, v in state.items() if k.startswith("previous_memory.")}
        self.reservoir.restore({k[10:]: v for k, v in state.items() if k.startswith("reservoir.")})
        self.fits, self.seen = int(state["fits"]), int(state["seen"])
        self.unsolved = bool(state["unsolved"])

    def memory_bytes(self) -> dict[str, int]:
        return {**self.head.nbytes(), "previous_memory": int(sum(v.nbytes for v in self.previous_memory.values())),
                "reservoir": self.reservoir.nbytes()}
