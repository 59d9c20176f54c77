"""DCDA: the two training stages of MARS, as plain functions over feature tensors (docs/methods.md, "DCDA").

Stage 1 trains the memory only (W_q, K, γ, β as written; by default K, γ, β, see `Stage1Config.train_query`) with
SupCon on Norm(h̃) + λ_smooth·‖h̃ − target‖², one epoch by default (`Stage1Config.optim`);
the classifier does not enter the loss, so it is frozen by construction.
Stage 2 trains the classifier only on h̃ computed once under no_grad from the frozen memory:
CE + λ_LwF·LwF(current inputs) + λ_anchor·KD(anchor points), T = 3, against the teacher
(memory_{t-1}, g_{t-1}) snapshotted at the end of the previous task, + λ_anchor_ce·CE(anchor points, their class).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from memcl_ops.losses import old_class_kd, old_class_kd_full, smoothness_loss, supcon_loss
from memcl_ops.mars.router import RouterOutput, SlotRouter
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.tensors import layer_norm, take_rows
from memcl_ops.training import OptimConfig, optimize


@dataclass(frozen=True)
class Stage1Config:
    # one fused-Adam epoch [R]: SupCon on frozen features is flat after it (RESULTS.md, "A fast MARS learner");
    # the MARS paper's schedule is epochs=20, fused=False [S]
    optim: OptimConfig = OptimConfig(epochs=1, fused=True)
    lambda_smooth: float = 0.3  # weight of the smoothness term pulling h̃ towards its target [S]
    temperature: float = 0.07  # SupCon τ [R]
    # what h̃ is pulled towards: LN(h_T), since raw h_T (the MARS paper) differs in scale from h̃ [R]
    smooth_target: Literal["ln", "raw"] = "ln"
    # train only K, γ, β, not W_q (the MARS paper trains it): W_q stays an isometry and stage 1 skips its D x D
    # gradient, at equal A_last (RESULTS.md) [R]
    train_query: bool = False


@dataclass(frozen=True)
class Stage2Config:
    optim: OptimConfig = OptimConfig(epochs=10)  # the head's epochs per round [R]
    # LwF's weight: 0.3, as the other old-class terms, since the anchors and the Gaussian replay already keep the
    # old classes (RESULTS.md, "Each class's own covariance"); `lwf` and `mars-paper` fix 1 [R]
    lambda_lwf: float = 0.3
    lambda_anchor: float = 1.0  # weight of the anchor KD that keeps the old head's answers at the anchors [R]
    temperature: float = 3.0  # KD temperature T [S]
    # LwF teacher input: h̃ under the previous memory (as written) or under the current one [R]
    lwf_teacher_memory: Literal["previous", "current"] = "previous"
    # CE over all seen classes, or only over the classes present in the block (PyCIL's LwF convention) [R]
    ce_scope: Literal["all", "current"] = "all"
    # anchor KD over the full softmax (the teacher padded by zeros), which Thm. 2's bound assumes, or old logits [R]
    anchor_scope: Literal["old", "all"] = "all"
    # one anchor point per (slot, class), so a slot shared by classes keeps a point for each (`ClassAnchors`), or
    # one per slot as written (RESULTS.md, "MARS with class anchors") [R]
    anchor_points: Literal["slot", "slot-class"] = "slot-class"
    # CE at the class anchors with their class as label: old classes keep a positive term against the new classes'
    # CE, a replay of prototypes (as PASS does); 0 is the MARS paper's loss (RESULTS.md, "CE at the class anchors") [R]
    lambda_anchor_ce: float = 0.3
    # each old class weighs alike at the anchors (its weight split by routing mass), or each point alike [R]
    anchor_weighting: Literal["point", "class"] = "class"
    # a new class's column starts at its prototype (weight imprinting, Qi et al. 2018), since a zero start (the MARS
    # paper) moves too little in a short visit (RESULTS.md, "New classes start at their prototypes") [R]
    new_class_init: Literal["zero", "prototype"] = "prototype"
    init_scale: float = 0.5  # a prototype column's norm, in units of the mean norm of the columns trained before [R]
    # CE on rows drawn per earlier class from a Gaussian of its frozen features (`ClassGaussians`), routed like real
    # rows: the anchors keep each class's mean, these its spread (RESULTS.md, "Each class's own covariance"); 0: off,
    # as in the MARS paper [R]
    lambda_gaussian: float = 0.3
    gaussian_per_class: int = 256  # draws per earlier class and fit: fewer leave the replay's own noise in A_last [R]
    gaussian_shrink: float = 0.1  # shrinkage of a class covariance towards its mean variance (few rows, many dims) [R]
    gaussian_rank: int = 32  # a class covariance's kept directions; the rest of its trace is spread evenly [R]

    def __post_init__(self) -> None:
        if self.init_scale <= 0:
            raise ValueError(f"stage2.init_scale must be > 0, got {self.init_scale}")
        if (self.lambda_gaussian < 0 or self.gaussian_per_class < 1 or not 0 < self.gaussian_shrink <= 1
                or self.gaussian_rank < 0):
            raise ValueError("stage2 needs lambda_gaussian >= 0, gaussian_per_class >= 1, 0 < gaussian_shrink <= 1 "
                             f"and gaussian_rank >= 0, got {self.lambda_gaussian}, {self.gaussian_per_class}, "
                             f"{self.gaussian_shrink}, {self.gaussian_rank}")


@dataclass
class Teacher:
    """The frozen (memory_{t-1}, g_{t-1}) pair and its anchors, snapshotted at the end of a task."""

    router_state: dict[str, np.ndarray]  # empty when the method has no memory
    head_state: dict[str, np.ndarray]
    anchors: np.ndarray  # (A, D) anchor points a_i under memory_{t-1}
    anchor_logits: np.ndarray  # (A, C_old) g_{t-1}(a_i)
    anchor_labels: np.ndarray  # (A,) the class of each anchor point (-1: a slot anchor, no class of its own)
    anchor_mass: np.ndarray  # (A,) the routing mass behind each class anchor (0 for a slot anchor)

    @classmethod
    @torch.no_grad()
    def snapshot(cls, router: SlotRouter | None, head: GrowingLinearHead,
                 anchors: tuple[torch.Tensor, np.ndarray, np.ndarray] | None = None) -> Teacher:
        """The teacher at the end of a task; `anchors`: (points, their classes, their masses) other than the
        router's slot anchors."""
        if router is None:
            return cls({}, head.state(), np.zeros((0, head.feature_dim), np.float32),
                       np.zeros((0, head.num_classes), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))
        if anchors is None:
            points = router.anchors()[0]
            anchors = points, np.full(len(points), -1, np.int64), np.zeros(len(points), np.float32)
        points, labels, mass = anchors
        return cls(router.state(), head.state(), points.numpy().copy(), head(points).numpy().copy(),
                   np.asarray(labels, np.int64).copy(), np.asarray(mass, np.float32).copy())

    def head(self, feature_dim: int) -> GrowingLinearHead:
        head = GrowingLinearHead(feature_dim)
        head.load_state(self.head_state)
        return head

    def router(self, like: SlotRouter | None) -> SlotRouter | None:
        if like is None:
            return None
        return SlotRouter.from_state(like.feature_dim, like.config, self.router_state)

    def state(self) -> dict[str, np.ndarray]:
        out = {f"router.{k}": v for k, v in self.router_state.items()}
        out.update({f"head.{k}": v for k, v in self.head_state.items()})
        out.update(anchors=self.anchors, anchor_logits=self.anchor_logits, anchor_labels=self.anchor_labels,
                   anchor_mass=self.anchor_mass)
        return out

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Teacher:
        def part(prefix: str) -> dict[str, np.ndarray]:
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        return cls(part("router."), part("head."), state["anchors"], state["anchor_logits"], state["anchor_labels"],
                   state["anchor_mass"])


class ClassAnchors:
    """Routing-weighted sums of LN(h) per (slot, class), m_ic = Σ_{x of class c} p_i(x) LN(h(x)) with mass
    Σ p_i(x), summed over every block the head was fitted on; the anchor of (i, c) is γ_i m_ic / mass + β_i under
    the memory at the task's end, for each pair with at least one sample's worth of mass."""

    def __init__(self, feature_dim: int):
        self.sums = torch.zeros(0, 0, feature_dim)  # (slots, classes, D)
        self.mass = torch.zeros(0, 0)
        self.classes = np.zeros(0, np.int64)

    @torch.no_grad()
    def add(self, router: SlotRouter, features: torch.Tensor, labels: torch.Tensor,
            routed: RouterOutput | None = None) -> None:
        """`routed`: `router(features)` if the caller has it already."""
        labels = labels.numpy()
        classes = np.union1d(self.classes, labels)
        slots = router.num_slots
        sums = torch.zeros(slots, len(classes), self.sums.shape[2])
        mass = torch.zeros(slots, len(classes))
        old = torch.from_numpy(np.searchsorted(classes, self.classes))
        sums[:self.sums.shape[0], old] = self.sums  # slots only grow
        mass[:self.mass.shape[0], old] = self.mass
        routed = router(features) if routed is None else routed
        probs, ln_h = routed.probs, routed.ln_h
        for c in np.unique(labels):  # one (S x n_c) @ (n_c x D) product per class of the block
            rows = torch.from_numpy(labels == c)
            column = int(np.searchsorted(classes, c))
            sums[:, column] += probs[rows].T @ ln_h[rows]
            mass[:, column] += probs[rows].sum(dim=0)
        self.sums, self.mass, self.classes = sums, mass, classes

    @torch.no_grad()
    def points(self, router: SlotRouter) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """(the anchor points, the class of each, the routing mass behind each)."""
        slot, column = torch.nonzero(self.mass >= 1.0, as_tuple=True)
        mass = self.mass[slot, column]
        mean = self.sums[slot, column] / mass.unsqueeze(1)
        return router.gamma[slot] * mean + router.beta[slot], self.classes[column.numpy()], mass.numpy()

    def state(self) -> dict[str, np.ndarray]:
        return {"sums": self.sums.numpy().copy(), "mass": self.mass.numpy().copy(), "classes": self.classes.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.sums, self.mass = torch.from_numpy(np.array(state["sums"])), torch.from_numpy(np.array(state["mass"]))
        self.classes = np.array(state["classes"], np.int64)


class ClassGaussians:
    """Each class's row count, feature sum (float64), total scatter tr Σ_{x of c} (x − μ_c)(x − μ_c)ᵀ (float64) and
    the top `rank` directions of that scatter as a (D, rank) factor F_c with orthogonal columns (F_c F_cᵀ ≈ the
    scatter). A block's rows merge in by incremental PCA (Ross et al. 2008): [F_c, the block's class-centred rows,
    the shift of the class mean] re-factored and cut to `rank` columns, so nothing large cancels and no D x D matrix
    is kept. Exact (up to rounding) for a class whose scatter has rank <= `rank`, whatever the cutting; beyond it the
    discarded directions survive in the trace, which `sample` spreads over them.

    Per class, not pooled: classes of different datasets spread differently (the 8 x 8 digits against MNIST against
    Fashion-MNIST), and one pooled covariance drew every class with the average shape (benchmarks/RESULTS.md, "Each
    class's own covariance")."""

    def __init__(self, feature_dim: int, rank: int):
        self.rank = min(rank, feature_dim)
        self.factors = torch.zeros(0, feature_dim, self.rank)
        self.traces = torch.zeros(0, dtype=torch.float64)
        self.sums = torch.zeros(0, feature_dim, dtype=torch.float64)
        self.counts = torch.zeros(0, dtype=torch.float64)
        self.classes = np.zeros(0, np.int64)

    @torch.no_grad()
    def add(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        labels = labels.numpy()
        classes = np.union1d(self.classes, labels)
        dim = features.shape[1]
        factors = torch.zeros(len(classes), dim, self.rank)
        traces = torch.zeros(len(classes), dtype=torch.float64)
        sums = torch.zeros(len(classes), dim, dtype=torch.float64)
        counts = torch.zeros(len(classes), dtype=torch.float64)
        old = torch.from_numpy(np.searchsorted(classes, self.classes))
        factors[old], traces[old], sums[old], counts[old] = self.factors, self.traces, self.sums, self.counts
        for c in np.unique(labels):
            rows = features[torch.from_numpy(labels == c)]
            i = int(np.searchsorted(classes, c))
            n_old, n_new = float(counts[i]), len(rows)
            block_sum = rows.sum(dim=0, dtype=torch.float64)
            block_mean = block_sum / n_new
            centred = rows - block_mean.float()  # centred first: nothing of the size of the mean is squared
            parts = [factors[i], centred.T]
            traces[i] += centred.double().square().sum()
            if n_old:
                shift = (sums[i] / n_old - block_mean) * (n_old * n_new / (n_old + n_new)) ** 0.5
                parts.append(shift.float()[:, None])
                traces[i] += shift.square().sum()
            factors[i] = self._top(torch.cat(parts, dim=1))
            sums[i] += block_sum
            counts[i] += n_new
        self.factors, self.traces, self.sums, self.counts, self.classes = factors, traces, sums, counts, classes

    def _top(self, stacked: torch.Tensor) -> torch.Tensor:
        """The top `rank` directions of stacked @ stackedᵀ as a factor with orthogonal columns, largest first, from
        the eigendecomposition of the smaller of the two Gram matrices (`stacked` has at least rank + 1 columns)."""
        dim, width = stacked.shape
        if not self.rank:
            return stacked[:, :0]
        if width <= dim:
            _, vectors = torch.linalg.eigh(stacked.T @ stacked)
            top = stacked @ vectors[:, -self.rank:]
        else:
            values, vectors = torch.linalg.eigh(stacked @ stacked.T)
            top = vectors[:, -self.rank:] * values[-self.rank:].clamp_min(0).sqrt()
        return top.flip(1)

    @torch.no_grad()
    def sample(self, per_class: int, shrink: float, generator: torch.Generator
               ) -> tuple[torch.Tensor, np.ndarray] | None:
        """`per_class` draws for every class with spread (two different rows), from N(μ_c, (1 − shrink) Σ_c +
        shrink · tr(Σ_c)/D · I), Σ_c its covariance: the factor's directions at their own variances and the rest of
        the trace spread evenly over the other D − rank directions. (rows, their classes); None while no class has
        spread."""
        dof = self.counts - 1
        spread = (dof >= 1) & (self.traces > 0)
        if not bool(spread.any()):
            return None
        dim = self.factors.shape[1]
        chosen = torch.nonzero(spread).flatten()
        factors, traces, dof = self.factors[chosen], self.traces[chosen], dof[chosen]
        energy = factors.double().square().sum(dim=1)  # (C, rank): the scatter's top eigenvalues
        residual = ((traces - energy.sum(dim=1)).clamp_min(0) / max(dim - self.rank, 1)) / dof  # per other direction
        mean_variance = traces / dof / dim
        floor = (1 - shrink) * residual + shrink * mean_variance  # every direction's variance, at least
        # each factor column scaled from its scatter eigenvalue e to the extra variance (1 − shrink)(e/dof − residual)
        extra = ((1 - shrink) * (energy / dof[:, None] - residual[:, None])).clamp_min(0)
        scale = (extra / energy.clamp_min(1e-30)).sqrt().float()
        coefficients = torch.randn(len(chosen), per_class, self.rank, generator=generator) * scale[:, None, :]
        noise = torch.randn(len(chosen), per_class, dim, generator=generator) * floor.sqrt().float()[:, None, None]
        means = (self.sums[chosen] / self.counts[chosen, None]).float()
        rows = means[:, None, :] + noise + torch.bmm(coefficients, factors.transpose(1, 2))
        return rows.reshape(-1, dim), np.repeat(self.classes[chosen.numpy()], per_class)

    def state(self) -> dict[str, np.ndarray]:
        return {"factors": self.factors.numpy().copy(), "traces": self.traces.numpy().copy(),
                "sums": self.sums.numpy().copy(), "counts": self.counts.numpy().copy(), "classes": self.classes.copy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        # a checkpoint of the pooled scatter (memcl before per-class covariances) has no "factors": the KeyError is
        # what a resume reports as a state written by an older memcl (pipeline/runner.py)
        factors = torch.from_numpy(np.array(state["factors"], np.float32))
        if factors.shape[1:] != self.factors.shape[1:]:
            raise ValueError(f"the checkpoint's class Gaussians keep {factors.shape[2]} directions of "
                             f"{factors.shape[1]} features per class, this run {self.rank} of {self.factors.shape[1]} "
                             "(stage2.gaussian_rank, the feature width)")
        self.factors = factors
        self.traces, self.sums, self.counts = (torch.from_numpy(np.array(state[k], np.float64))
                                               for k in ("traces", "sums", "counts"))
        self.classes = np.array(state["classes"], np.int64)


def anchor_point_weights(labels: np.ndarray, mass: np.ndarray, weighting: str) -> torch.Tensor:
    """One weight per anchor point, summing to 1: uniform ("point"), or uniform over classes and, within a class,
    proportional to each point's mass ("class")."""
    if weighting not in ("point", "class"):
        raise ValueError(f"anchor_weighting must be 'point' or 'class', got {weighting!r}")
    if weighting == "point" or not len(labels):
        return torch.full((len(labels),), 1.0 / max(len(labels), 1))
    _, inverse = np.unique(labels, return_inverse=True)
    total = np.bincount(inverse, weights=mass)
    if not (total > 0).all():
        raise ValueError("every class anchor needs a positive routing mass to be weighed per class")
    share = mass / total[inverse]
    return torch.as_tensor(share / (inverse.max() + 1), dtype=torch.float32)


def train_stage1(router: SlotRouter, features: torch.Tensor, labels: torch.Tensor,
                 config: Stage1Config = Stage1Config(), *, seed: int = 0) -> list[float]:
    """Train K, γ, β (and W_q if `config.train_query`) in place; returns the mean loss of each epoch run."""
    if config.train_query:
        router.train_query()
    router.w_q.requires_grad_(config.train_query)  # a fixed W_q: no D x D gradient
    with torch.no_grad():  # once per call, not per minibatch
        ln_all = layer_norm(features)

    def loss_on(idx: torch.Tensor) -> torch.Tensor:
        h, ln_h = take_rows(features, idx), take_rows(ln_all, idx)
        out = router(h, ln_h)
        target = ln_h if config.smooth_target == "ln" else h
        return (supcon_loss(out.h_tilde, labels[idx], config.temperature, config.temperature)
                + config.lambda_smooth * smoothness_loss(out.h_tilde, target))

    return optimize(router.memory_parameters(config.train_query), loss_on, len(features), config.optim, seed)


@torch.no_grad()
def start_at_prototypes(head: GrowingLinearHead, h: torch.Tensor, labels: torch.Tensor, new_classes: list[int],
                        scale: float) -> None:
    """Set the columns of `new_classes` (just grown, so still zero) to their classes' unit mean of `h`, scaled to
    `scale` x the mean norm of the other columns (x 1 when there are none), each with the others' mean bias."""
    if not new_classes:
        return
    new_columns = head.columns(torch.as_tensor(new_classes))
    trained = torch.ones(head.num_classes, dtype=torch.bool)
    trained[new_columns] = False
    norm = float(head.weight[trained].norm(dim=1).mean()) if trained.any() else 1.0
    bias = float(head.bias[trained].mean()) if trained.any() else 0.0
    for label, column in zip(new_classes, new_columns.tolist()):
        mean = h[labels == label].mean(dim=0)
        head.weight[column] = scale * norm * mean / mean.norm().clamp_min(1e-12)
        head.bias[column] = bias


def apply_memory(router: SlotRouter | None, h: torch.Tensor) -> torch.Tensor:
    """h̃ of the slot memory, or h itself for methods without one."""
    return h if router is None else router(h).h_tilde


def train_stage2(head: GrowingLinearHead, router: SlotRouter | None, features: torch.Tensor, labels: torch.Tensor,
                 teacher: Teacher | None, config: Stage2Config = Stage2Config(), *, seed: int = 0,
                 extra_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 routed: RouterOutput | None = None, new_classes: list[int] = ()) -> list[float]:
    """Train the classifier in place on h̃ of the frozen memory; returns the mean loss per epoch.

    The head must already have columns for `labels` (`head.grow`; `new_classes`: the labels it just added, started
    as `config.new_class_init` says). `extra_loss(minibatch indices)` is added to every minibatch's loss: the hook
    through which the baselines add their own term (EWC's penalty, DER++'s replay) to the same CE objective and
    loop. `routed`: `router(features)` if the caller has it already.
    """
    with torch.no_grad():
        if router is not None and routed is None:
            routed = router(features)
        h_tilde = features if router is None else routed.h_tilde
        if config.new_class_init == "prototype":
            start_at_prototypes(head, h_tilde, labels, list(new_classes), config.init_scale)
        targets = head.columns(labels)
        if config.ce_scope == "current":
            ce_columns = torch.unique(targets)
            targets = torch.searchsorted(ce_columns, targets)
        lwf_logits = anchors = anchor_logits = anchor_targets = kd_weight = None
        if teacher is not None and teacher.head_state["classes"].size:
            old_head = teacher.head(head.feature_dim)
            teacher_router = None if config.lwf_teacher_memory == "current" else teacher.router(router)
            if router is None or teacher_router is None:  # no memory, or the current one: h̃ as computed above
                lwf_logits = old_head(h_tilde)
            else:
                lwf_logits = old_head(teacher_router(features, routed.ln_h).h_tilde)
            anchors = torch.as_tensor(teacher.anchors)
            anchor_logits = torch.as_tensor(teacher.anchor_logits)
            has_class = teacher.anchor_labels >= 0
            labelled = torch.from_numpy(has_class)
            anchor_targets = head.columns(torch.from_numpy(teacher.anchor_labels[has_class]))
            weight = anchor_point_weights(teacher.anchor_labels[has_class], teacher.anchor_mass[has_class],
                                          config.anchor_weighting)
            # the KD's points weighed the same way when every anchor has a class (slot anchors: uniform)
            kd_weight = weight if config.anchor_weighting == "class" and has_class.all() else None
    T = config.temperature
    anchor_kd = old_class_kd_full if config.anchor_scope == "all" else old_class_kd

    def loss_on(idx: torch.Tensor) -> torch.Tensor:
        logits = head(take_rows(h_tilde, idx))
        ce_logits = logits if config.ce_scope == "all" else logits[:, ce_columns]
        loss = F.cross_entropy(ce_logits, targets[idx])
        if lwf_logits is not None and config.lambda_lwf:
            loss = loss + config.lambda_lwf * old_class_kd(logits, take_rows(lwf_logits, idx), T)
        if anchors is not None and len(anchors) and (config.lambda_anchor or config.lambda_anchor_ce):
            anchor_out = head(anchors)
            loss = loss + config.lambda_anchor * anchor_kd(anchor_out, anchor_logits, T, kd_weight)
            if config.lambda_anchor_ce and len(anchor_targets):
                ce = F.cross_entropy(anchor_out[labelled], anchor_targets, reduction="none")
                loss = loss + config.lambda_anchor_ce * (weight @ ce)
        if extra_loss is not None:
            loss = loss + extra_loss(idx)
        return loss

    return optimize(head.parameters(), loss_on, len(features), config.optim, seed)
