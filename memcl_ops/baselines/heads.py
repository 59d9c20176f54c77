"""Baseline head learners: the methods MARS is compared with, on the same frozen features, stream and head.

| method | learner | what it keeps between tasks (its persistent memory) |
|---|---|---|
| finetune, lwf | `DistillHead` (mars/head.py) with its distillation weights fixed | lwf: the previous head |
| ewc | `EWCHead`: online EWC (Schwarz et al. 2018) on the linear head | diagonal Fisher and anchor parameters |
| derpp | `DERppHead`: DER++ (Buzzega et al. 2020) | a reservoir buffer of features, logits, labels |
| simplecil | `NearestMeanHead`: SimpleCIL (Zhou et al. 2023), cosine nearest class mean | class feature sums, counts |
| slda | `StreamingLDAHead`: Streaming LDA (Hayes and Kanan 2020), one shared covariance | class sums, counts, Σ h hᵀ |
| ncm | `StreamingLDAHead` without a covariance: Euclidean nearest class mean | class feature sums, counts |
| joint | `JointHead`: the non-continual upper bound | every feature and label seen so far |
| blind | `BlindHead`: the most frequent of the last labels, never reading the input | the last `window` labels |

The trained ones use the classifier, loop and CE objective of DCDA stage 2 (`train_stage2`, head_training.py),
adding their own term through its `extra_loss` hook, so the comparison differs only in what each method does
against forgetting.
All follow `learner.HeadLearner`: state is a dict of numpy arrays, and `memory_bytes` counts every array of
it except scalar bookkeeping.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from memcl_ops.head_training import Stage2Config, apply_memory, train_stage2
from memcl_ops.learner import FeatureMemory
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.tensors import best_class, normalize, prefixed, state_part, take_rows


def _pad_rows(a: torch.Tensor, rows: int) -> torch.Tensor:
    """`a` with zero rows appended up to `rows` (the head grew; new classes have no Fisher, no anchor)."""
    return torch.cat([a, a.new_zeros(rows - a.shape[0], *a.shape[1:])]) if rows > a.shape[0] else a


class _TrainedLinearHead:
    """What the trained baselines share: a growing linear head trained by the stage-2 loop (one optimiser seed
    per fit, reproducible from the checkpointed fit count) and read through the frozen memory."""

    def __init__(self, feature_dim: int, stage2: Stage2Config, seed: int):
        self.stage2, self.seed = stage2, seed
        self.head = GrowingLinearHead(feature_dim)
        self.fits = 0
        self.device = torch.device("cpu")  # where its epochs run

    def to(self, device: torch.device) -> None:
        """Train on `device` (its state and predictions stay on the CPU)."""
        self.device = device

    def _train(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None,
               extra_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
               new_classes: list[int] = ()) -> dict[str, float]:
        history = train_stage2(self.head, memory, features, labels, None, self.stage2,
                               seed=self.seed * 100_003 + self.fits, extra_loss=extra_loss, new_classes=new_classes,
                               device=self.device)
        self.fits += 1
        return {"loss_first": history[0], "loss_last": history[-1]} if history else {}

    def end_task(self, memory: FeatureMemory | None) -> None:
        """Nothing by default: learners that consolidate at a boundary override it."""

    def known_classes(self) -> np.ndarray:
        return np.asarray(self.head.classes, np.int64)

    @torch.no_grad()
    def predict(self, features: torch.Tensor, memory: FeatureMemory | None) -> np.ndarray:
        return self.head.predict(apply_memory(memory, features))

    @torch.no_grad()
    def scored(self, features: torch.Tensor, memory: FeatureMemory | None) -> tuple[np.ndarray, np.ndarray]:
        return self.head.scored(apply_memory(memory, features))


@dataclass(frozen=True)
class EWCConfig:
    lam: float = 10.0  # λ in λ/2 Σ F̃ (θ − θ*)²  [R] (Mammoth's ewc_on searches 10-100)
    gamma: float = 1.0  # F̃ ← γ F̃ + F_t, online EWC's decay of older tasks' importance [R] (Mammoth default)

    def __post_init__(self) -> None:
        if self.lam < 0 or not 0 <= self.gamma <= 1:
            raise ValueError(f"ewc needs lam >= 0 and 0 <= gamma <= 1, got lam={self.lam}, gamma={self.gamma}")


@torch.no_grad()
def linear_head_fisher(head: GrowingLinearHead, h: torch.Tensor, labels: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Diagonal empirical Fisher of the head's softmax likelihood at the true labels, in closed form.

    For a linear head the per-sample gradient of −log p_y is g hᵀ (weight) and g (bias) with g = p − e_y,
    so the mean squared gradients are (g²)ᵀ(h²)/N and mean(g²): no per-sample backward pass needed.
    """
    g = torch.softmax(head(h), dim=1)
    g[torch.arange(len(h)), head.columns(labels)] -= 1.0
    g2 = g.pow(2)
    return g2.T @ h.pow(2) / len(h), g2.mean(dim=0)


class EWCHead(_TrainedLinearHead):
    """Online EWC on the linear head: CE + λ/2 Σ F̃ (θ − θ*)² over the head's weights and biases.

    θ* is the head at the end of the previous task, F̃ the decayed sum of each task's diagonal Fisher
    (computed on the task's data right after it is learned; merged at the task boundary). Columns of classes
    that arrived later have F̃ = 0, so they are free.
    """

    def __init__(self, feature_dim: int, stage2: Stage2Config, config: EWCConfig, seed: int):
        super().__init__(feature_dim, stage2, seed)
        self.config = config
        self.fisher: dict[str, torch.Tensor] = {}  # "weight", "bias": F̃ (empty before the first boundary)
        self.anchor: dict[str, torch.Tensor] = {}  # θ*
        self.pending: dict[str, torch.Tensor] = {}  # Fisher of the current task, sample-weighted sum until end_task
        self.pending_count = 0

    def _penalty(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """λ/2 Σ F̃ (θ − θ*)², F̃ and θ* padded to the head's rows and copied to where it trains once per fit."""
        rows = self.head.num_classes
        fisher, anchor = ({name: _pad_rows(t[name], rows).to(self.device) for name in ("weight", "bias")}
                          for t in (self.fisher, self.anchor))

        def penalty(_idx: torch.Tensor) -> torch.Tensor:
            total = sum((fisher[name] * (param - anchor[name]).pow(2)).sum()
                        for name, param in (("weight", self.head.weight), ("bias", self.head.bias)))
            return 0.5 * self.config.lam * total
        return penalty

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        new_classes = self.head.grow(labels)
        losses = self._train(features, labels, memory, self._penalty() if self.fisher else None, new_classes)
        fisher_w, fisher_b = linear_head_fisher(self.head, apply_memory(memory, features).detach(), labels)
        n = len(labels)
        rows = self.head.num_classes
        self.pending = {"weight": _pad_rows(self.pending.get("weight", fisher_w[:0]), rows) + n * fisher_w,
                        "bias": _pad_rows(self.pending.get("bias", fisher_b[:0]), rows) + n * fisher_b}
        self.pending_count += n
        return losses

    def end_task(self, memory: FeatureMemory | None) -> None:
        if not self.pending_count:
            return
        rows = self.head.num_classes
        for name, param in (("weight", self.head.weight), ("bias", self.head.bias)):
            task_fisher = self.pending[name] / self.pending_count
            old = _pad_rows(self.fisher.get(name, task_fisher[:0]), rows)
            self.fisher[name] = self.config.gamma * old + task_fisher
            self.anchor[name] = param.detach().clone()
        self.pending, self.pending_count = {}, 0

    def state(self) -> dict[str, np.ndarray]:
        out = prefixed("head", self.head.state())
        for prefix, tensors in (("fisher", self.fisher), ("anchor", self.anchor), ("pending", self.pending)):
            out.update({f"{prefix}.{k}": v.numpy().copy() for k, v in tensors.items()})
        out.update(fits=np.array(self.fits), pending_count=np.array(self.pending_count))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.load_state(state_part(state, "head"))
        self.fisher, self.anchor, self.pending = (
            {k: torch.as_tensor(np.array(v)) for k, v in state_part(state, prefix).items()}
            for prefix in ("fisher", "anchor", "pending"))
        self.fits, self.pending_count = int(state["fits"]), int(state["pending_count"])

    def memory_bytes(self) -> dict[str, int]:
        def nbytes(tensors: dict[str, torch.Tensor]) -> int:
            return sum(t.numel() * t.element_size() for t in tensors.values())
        return {"head": self.head.nbytes(), "fisher": nbytes(self.fisher) + nbytes(self.pending),
                "anchor_params": nbytes(self.anchor)}


@dataclass(frozen=True)
class DERppConfig:
    buffer_size: int = 500  # samples in the reservoir [R] (DER++'s smallest standard buffer)
    alpha: float = 0.1  # weight of the logit replay MSE [R] (Mammoth's best args, seq-cifar10)
    beta: float = 0.5  # weight of the label replay CE [R] (same source)

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(f"derpp.buffer_size must be >= 1, got {self.buffer_size}")
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"derpp needs alpha, beta >= 0, got alpha={self.alpha}, beta={self.beta}")


class ReservoirBuffer:
    """A fixed-capacity reservoir sample of (raw feature, label, logits) over every sample offered so far.

    Logit rows keep the width the head had when they were stored (older rows are zero-padded; `widths`
    says which columns are real). The sampling is reproducible from (seed, samples seen), so the buffer's
    state needs no RNG state.
    """

    def __init__(self, capacity: int, seed: int):
        if capacity < 1:
            raise ValueError(f"a reservoir needs a capacity >= 1, got {capacity}")
        self.capacity, self.seed = capacity, seed
        self.features = np.zeros((0, 0), np.float32)
        self.labels = np.zeros(0, np.int64)
        self.logits = np.zeros((0, 0), np.float32)
        self.widths = np.zeros(0, np.int32)
        self.seen = 0

    def __len__(self) -> int:
        return len(self.labels)

    def offer(self, features: np.ndarray, labels: np.ndarray, logits: np.ndarray) -> None:
        """Reservoir sampling (Vitter's algorithm R): sample i (0-based, over all offers) is kept with
        probability capacity / (i + 1), replacing a uniformly chosen slot once the buffer is full."""
        rng = np.random.default_rng([self.seed, self.seen])
        if len(self) == 0:
            self.features = np.zeros((0, features.shape[1]), np.float32)
        width = logits.shape[1]
        if width > self.logits.shape[1]:
            self.logits = np.pad(self.logits, ((0, 0), (0, width - self.logits.shape[1])))
        padded = np.pad(logits, ((0, 0), (0, self.logits.shape[1] - width)))
        for i in range(len(labels)):
            if len(self) < self.capacity:
                slot = len(self)
                self.features = np.concatenate([self.features, features[i:i + 1]])
                self.labels = np.append(self.labels, labels[i])
                self.logits = np.concatenate([self.logits, padded[i:i + 1]])
                self.widths = np.append(self.widths, np.int32(width))
            else:
                slot = int(rng.integers(0, self.seen + 1))
                if slot < self.capacity:
                    self.features[slot], self.labels[slot] = features[i], labels[i]
                    self.logits[slot], self.widths[slot] = padded[i], width
            self.seen += 1

    def arrays(self) -> dict[str, np.ndarray]:
        return {"features": self.features, "labels": self.labels, "logits": self.logits, "widths": self.widths}

    def state(self) -> dict[str, np.ndarray]:
        return {**{k: v.copy() for k, v in self.arrays().items()}, "seen": np.array(self.seen)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.features = np.array(state["features"], np.float32)
        self.labels = np.array(state["labels"], np.int64)
        self.logits = np.array(state["logits"], np.float32)
        self.widths = np.array(state["widths"], np.int32)
        self.seen = int(state["seen"])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())


class DERppHead(_TrainedLinearHead):
    """DER++: CE on the current block + α·MSE(logits of replayed buffer samples, their stored logits)
    + β·CE(another replayed minibatch, its stored labels).

    [R] DER++ records a sample's logits at the training step that sees it; here a block is learned over several
    epochs, so each sample is offered to the reservoir once, with its logits after the block is learned.
    Replay minibatches have the stage-2 batch size and are drawn with replacement from the buffer.
    """

    def __init__(self, feature_dim: int, stage2: Stage2Config, config: DERppConfig, seed: int):
        super().__init__(feature_dim, stage2, seed)
        self.config = config
        self.buffer = ReservoirBuffer(config.buffer_size, seed)

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        new_classes = self.head.grow(labels)
        extra = None
        if len(self.buffer):
            with torch.no_grad():
                replay_h = apply_memory(memory, torch.from_numpy(self.buffer.features))
                replay_targets = self.head.columns(torch.from_numpy(self.buffer.labels))
            stored = torch.from_numpy(self.buffer.logits)
            real = torch.arange(stored.shape[1])[None, :] < torch.from_numpy(self.buffer.widths)[:, None]
            replay_h, replay_targets, stored, real = (t.to(self.device) for t in (replay_h, replay_targets, stored,
                                                                                  real))
            generator = torch.Generator().manual_seed(self.seed * 100_003 + self.fits + 1)
            k = self.stage2.optim.batch_size

            def extra(_idx: torch.Tensor) -> torch.Tensor:
                a = torch.randint(len(stored), (k,), generator=generator)
                b = torch.randint(len(stored), (k,), generator=generator)
                logits = self.head(take_rows(replay_h, a))[:, :stored.shape[1]]
                diff = (logits - take_rows(stored, a)).pow(2) * real[a]
                mse = diff.sum() / real[a].sum().clamp_min(1)
                return (self.config.alpha * mse
                        + self.config.beta * F.cross_entropy(self.head(take_rows(replay_h, b)), replay_targets[b]))

        losses = self._train(features, labels, memory, extra, new_classes)
        with torch.no_grad():
            logits = self.head(apply_memory(memory, features))
        self.buffer.offer(features.numpy(), labels.numpy(), logits.numpy())
        return losses

    def state(self) -> dict[str, np.ndarray]:
        return {**prefixed("head", self.head.state()), **prefixed("buffer", self.buffer.state()),
                "fits": np.array(self.fits)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.load_state(state_part(state, "head"))
        self.buffer.restore(state_part(state, "buffer"))
        self.fits = int(state["fits"])

    def memory_bytes(self) -> dict[str, int]:
        return {"head": self.head.nbytes(), "buffer": self.buffer.nbytes()}


class NearestMeanHead:
    """SimpleCIL: no training; each class is the mean of its features and a sample goes to the class mean
    with the highest cosine similarity. Sums are kept in float64 so the result does not depend on how the
    stream was cut into blocks."""

    def __init__(self, feature_dim: int):
        self.feature_dim = feature_dim
        self.classes = np.zeros(0, np.int64)
        self.sums = np.zeros((0, feature_dim), np.float64)
        self.counts = np.zeros(0, np.int64)

    def observe(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> None:
        """One batch into the class sums (each batch is learned as it streams)."""
        with torch.no_grad():
            h = apply_memory(memory, features).double().numpy()
        y = labels.numpy()
        for c in np.unique(y):
            rows = y == c
            found = np.flatnonzero(self.classes == c)
            if not len(found):
                self.classes = np.append(self.classes, c)
                self.sums = np.concatenate([self.sums, np.zeros((1, self.feature_dim))])
                self.counts = np.append(self.counts, 0)
                found = [len(self.classes) - 1]
            self.sums[found[0]] += h[rows].sum(axis=0)
            self.counts[found[0]] += int(rows.sum())

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Learn a block (its rows into the sums)."""
        self.observe(features, labels, memory)
        return {}

    def settle(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Nothing: `observe` summed the block's rows as they streamed."""
        return {}

    def end_task(self, memory: FeatureMemory | None) -> None:
        """Nothing: the class means are always up to date."""

    def frozen(self) -> NearestMeanHead:
        out = NearestMeanHead(self.feature_dim)
        out.restore(self.state())
        return out

    @torch.no_grad()
    def predict(self, features: torch.Tensor, memory: FeatureMemory | None) -> np.ndarray:
        return self.scored(features, memory)[0]

    @torch.no_grad()
    def scored(self, features: torch.Tensor, memory: FeatureMemory | None) -> tuple[np.ndarray, np.ndarray]:
        """(the class of the most similar mean, the cosine similarity) per row."""
        h = apply_memory(memory, features)
        if not len(self.classes):
            return best_class(self.classes, None, h.shape[0])
        means = torch.from_numpy(self.sums / self.counts[:, None]).float()
        return best_class(self.classes, normalize(h) @ normalize(means).T, h.shape[0])

    def state(self) -> dict[str, np.ndarray]:
        return {"classes": self.classes.copy(), "sums": self.sums.copy(), "counts": self.counts.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.classes = np.array(state["classes"], np.int64)
        self.sums = np.array(state["sums"], np.float64)
        self.counts = np.array(state["counts"], np.int64)

    def memory_bytes(self) -> dict[str, int]:
        return {"class_means": self.classes.nbytes + self.sums.nbytes + self.counts.nbytes}


@dataclass(frozen=True)
class SLDAConfig:
    shrinkage: float = 1e-4  # Σ ← (1 − ε) Σ + ε I before it is inverted (Hayes and Kanan's default)


class StreamingLDAHead:
    """Streaming LDA (Hayes and Kanan 2020): a mean per class and one covariance shared by every class; a row goes
    to the class c maximising h·Λμ_c − ½ μ_c·Λμ_c, Λ = ((1 − ε) Σ + ε I)⁻¹. Σ is the pooled within-class covariance
    of everything seen, kept as exact sums (per class: rows, feature sums; overall: the second moment Σ h hᵀ) in
    float64, so the streaming head is the batch solution on the same rows, whatever the order or cutting of the
    stream. (Avalanche's and CapyMOA's SLDA update Σ with a running estimate around the class means as they were
    when each row arrived; the sums here are that estimate without its approximation.) `covariance=False`: the
    Euclidean nearest class mean (Σ = I)."""

    def __init__(self, feature_dim: int, config: SLDAConfig = SLDAConfig(), covariance: bool = True):
        self.feature_dim, self.config, self.covariance = feature_dim, config, covariance
        self.classes = np.zeros(0, np.int64)
        self.sums = np.zeros((0, feature_dim), np.float64)
        self.counts = np.zeros(0, np.int64)
        self.second_moment = np.zeros((feature_dim, feature_dim) if covariance else (0, 0), np.float64)
        self.solved: tuple[np.ndarray, np.ndarray] | None = None  # `solution` until the statistics change

    def observe(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> None:
        """One batch into the sums (each batch is learned as it streams; the solve waits for the next prediction)."""
        with torch.no_grad():
            h = apply_memory(memory, features).double().numpy()
        y = labels.numpy()
        self.solved = None
        new = np.setdiff1d(np.unique(y), self.classes)
        if len(new):
            self.classes = np.concatenate([self.classes, new])
            self.sums = np.concatenate([self.sums, np.zeros((len(new), self.feature_dim))])
            self.counts = np.concatenate([self.counts, np.zeros(len(new), np.int64)])
        index = {int(c): i for i, c in enumerate(self.classes)}
        rows = np.array([index[int(c)] for c in y], np.int64)
        # new arrays, never changed in place: a frozen copy shares the old ones
        self.sums, self.counts = self.sums.copy(), self.counts.copy()
        np.add.at(self.sums, rows, h)
        np.add.at(self.counts, rows, 1)
        if self.covariance:
            self.second_moment = self.second_moment + h.T @ h

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Learn a block (its rows into the sums)."""
        self.observe(features, labels, memory)
        return {}

    def settle(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Nothing: `observe` summed the block's rows as they streamed."""
        return {}

    def end_task(self, memory: FeatureMemory | None) -> None:
        """Nothing: the statistics are always up to date."""

    def frozen(self) -> StreamingLDAHead:
        """A copy that predicts as this head does now (it shares the sums, which `observe` replaces, never
        changes)."""
        if len(self.classes):
            self.solution()  # solved once here, kept by the copy
        return copy.copy(self)

    def solution(self) -> tuple[np.ndarray, np.ndarray]:
        """(W, b): a row h scores h·W[c] + b[c] for class c (the classes in `self.classes` order)."""
        if self.solved is None:
            self.solved = self._solve()
        return self.solved

    def _solve(self) -> tuple[np.ndarray, np.ndarray]:
        means = self.sums / self.counts[:, None]
        if not self.covariance:  # argmin ‖h − μ‖² = argmax h·μ − ½ ‖μ‖²
            return means, -0.5 * np.einsum("cd,cd->c", means, means)
        n = int(self.counts.sum())
        within = self.second_moment - (self.sums.T / self.counts) @ self.sums  # Σ h hᵀ − Σ_c n_c μ_c μ_cᵀ
        sigma = within / max(n - len(self.classes), 1)  # unbiased where rows outnumber classes
        eps = self.config.shrinkage
        weights = np.linalg.solve((1 - eps) * sigma + eps * np.eye(self.feature_dim), means.T).T  # Λ μ_c
        return weights, -0.5 * np.einsum("cd,cd->c", means, weights)

    @torch.no_grad()
    def predict(self, features: torch.Tensor, memory: FeatureMemory | None) -> np.ndarray:
        return self.scored(features, memory)[0]

    @torch.no_grad()
    def scored(self, features: torch.Tensor, memory: FeatureMemory | None) -> tuple[np.ndarray, np.ndarray]:
        """(the class of the highest discriminant, its value) per row."""
        h = apply_memory(memory, features).double().numpy()
        if not len(self.classes):
            return best_class(self.classes, None, h.shape[0])
        weights, bias = self.solution()
        return best_class(self.classes, h @ weights.T + bias, h.shape[0])

    def state(self) -> dict[str, np.ndarray]:
        return {"classes": self.classes.copy(), "sums": self.sums.copy(), "counts": self.counts.copy(),
                "second_moment": self.second_moment.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.classes = np.array(state["classes"], np.int64)
        self.sums = np.array(state["sums"], np.float64)
        self.counts = np.array(state["counts"], np.int64)
        self.second_moment = np.array(state["second_moment"], np.float64)
        self.solved = None

    def memory_bytes(self) -> dict[str, int]:
        out = {"class_means": self.classes.nbytes + self.sums.nbytes + self.counts.nbytes}
        if self.covariance:
            out["covariance"] = self.second_moment.nbytes
        return out


@dataclass(frozen=True)
class BlindConfig:
    window: int = 50  # the labels it votes over: the last this many labelled training rows


class BlindHead:
    """The blind classifier of Al Kader Hammoud, Prabhu et al. (ICCV 2023): it never reads the input and predicts,
    for every row, the most frequent label among the last `window` labelled rows streamed (ties: the most recent).
    It learns every batch right after predicting it (`observe`), so on a stream whose labels come in runs its
    test-then-train accuracy is high, and near-future accuracy (memcl_ops/prequential.py) shows what that is worth."""

    def __init__(self, config: BlindConfig = BlindConfig()):
        self.config = config
        self.recent = np.zeros(0, np.int64)  # oldest first

    def observe(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> None:
        self.recent = np.concatenate([self.recent, labels.numpy().astype(np.int64)])[-self.config.window:]

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Learn a block (its labels into the window)."""
        self.observe(features, labels, memory)
        return {}

    def settle(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        """Nothing: `observe` took each batch's labels as it streamed."""
        return {}

    def end_task(self, memory: FeatureMemory | None) -> None:
        """Nothing to consolidate."""

    def frozen(self) -> BlindHead:
        out = BlindHead(self.config)
        out.recent = self.recent.copy()
        return out

    def predict(self, features: torch.Tensor, memory: FeatureMemory | None) -> np.ndarray:
        return self.scored(features, memory)[0]

    def scored(self, features: torch.Tensor, memory: FeatureMemory | None) -> tuple[np.ndarray, np.ndarray]:
        """(the vote's winner, its share of the window) for every row alike."""
        rows = features.shape[0]
        classes, counts = np.unique(self.recent, return_counts=True)
        if not len(classes):
            return best_class(classes, None, rows)
        tied = classes[counts == counts.max()]
        winner = next(int(c) for c in self.recent[::-1] if c in tied)
        return np.full(rows, winner, np.int64), np.full(rows, counts.max() / len(self.recent), np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {"recent": self.recent.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.recent = np.array(state["recent"], np.int64)

    def memory_bytes(self) -> dict[str, int]:
        return {"recent_labels": self.recent.nbytes}


class JointHead(_TrainedLinearHead):
    """Joint training, the non-continual upper bound: keeps every (raw feature, label) seen so far and, on each
    block, trains a fresh head on all of it at once (stage-2 CE objective and optimiser, no distillation)."""

    def __init__(self, feature_dim: int, stage2: Stage2Config, seed: int):
        super().__init__(feature_dim, stage2, seed)
        self.features = np.zeros((0, feature_dim), np.float32)
        self.labels = np.zeros(0, np.int64)

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: FeatureMemory | None) -> dict[str, float]:
        self.features = np.concatenate([self.features, features.numpy()])
        self.labels = np.concatenate([self.labels, labels.numpy()])
        x, y = torch.from_numpy(self.features), torch.from_numpy(self.labels)
        self.head = GrowingLinearHead(self.head.feature_dim)
        return self._train(x, y, memory, new_classes=self.head.grow(y))

    def state(self) -> dict[str, np.ndarray]:
        return {**prefixed("head", self.head.state()), "features": self.features.copy(),
                "labels": self.labels.copy(), "fits": np.array(self.fits)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.load_state(state_part(state, "head"))
        self.features = np.array(state["features"], np.float32)
        self.labels = np.array(state["labels"], np.int64)
        self.fits = int(state["fits"])

    def memory_bytes(self) -> dict[str, int]:
        return {"head": self.head.nbytes(), "data": self.features.nbytes + self.labels.nbytes}
