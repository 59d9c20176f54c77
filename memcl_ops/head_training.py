"""The training loop every trained linear head shares: DCDA's stage 2 for MARS, and the baselines' heads (LwF,
fine-tuning, EWC, DER++, joint) with their own terms added through `extra_loss` (docs/methods.md, "DCDA").

The head is trained on h̃ = memory(h) under no_grad from a frozen feature memory (MARS's slot memory, or none:
h̃ = h): CE + λ_LwF·LwF(current inputs) + λ_anchor·KD(anchor points), T = 3, against the teacher (memory_{t-1},
g_{t-1}) snapshotted at the end of the previous task, + λ_anchor_ce·CE(anchor points, their class). The memory is
anything with the `FeatureMemory` protocol (memcl_ops/learner.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from memcl_ops.learner import FeatureMemory, MemoryOutput
from memcl_ops.losses import old_class_kd, old_class_kd_full
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.tensors import take_rows
from memcl_ops.training import OptimConfig, optimize

# Stage-2 settings that switch every old-class term off (plain sequential fine-tuning when λ_LwF is 0 too).
NO_ANCHORS = {"lambda_anchor": 0.0, "lambda_anchor_ce": 0.0}
NO_OLD_CLASS_TERMS = {**NO_ANCHORS, "lambda_gaussian": 0.0}  # the anchor terms and the Gaussian replay
NO_DISTILL = {"stage2": {"lambda_lwf": 0.0, **NO_OLD_CLASS_TERMS}}


@dataclass(frozen=True)
class Stage2Config:
    optim: OptimConfig = OptimConfig(epochs=10)  # the head's epochs per round [R]
    # LwF's weight: 0.3, as the other old-class terms, since the anchors and the Gaussian replay already keep the
    # old classes (RESULTS.md, "Each class's own covariance"); `lwf` and `mars` fix 1 [R]
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
    # the teacher's anchor points and their logits stay within these bytes: past them the points of least routing
    # mass go first, so a stream of ever more (slot, class) pairs keeps a bounded teacher [X]
    teacher_bytes: int = 16 * 2**20

    def __post_init__(self) -> None:
        if self.init_scale <= 0:
            raise ValueError(f"stage2.init_scale must be > 0, got {self.init_scale}")
        if (self.lambda_gaussian < 0 or self.gaussian_per_class < 1 or not 0 < self.gaussian_shrink <= 1
                or self.gaussian_rank < 0 or self.teacher_bytes < 0):
            raise ValueError("stage2 needs lambda_gaussian >= 0, gaussian_per_class >= 1, 0 < gaussian_shrink <= 1, "
                             f"gaussian_rank >= 0 and teacher_bytes >= 0, got {self.lambda_gaussian}, "
                             f"{self.gaussian_per_class}, {self.gaussian_shrink}, {self.gaussian_rank}, "
                             f"{self.teacher_bytes}")



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
    def snapshot(cls, router: FeatureMemory | None, head: GrowingLinearHead,
                 anchors: tuple[torch.Tensor, np.ndarray, np.ndarray] | None = None,
                 budget: int | None = None) -> Teacher:
        """The teacher at the end of a task; `anchors`: (points, their classes, their masses) other than the
        memory's own anchors; `budget`: the anchors' bytes (points, logits, classes, masses) at most, the points of
        most routing mass kept (ties in order)."""
        if router is None:
            return cls({}, head.state(), np.zeros((0, head.feature_dim), np.float32),
                       np.zeros((0, head.num_classes), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))
        if anchors is None:
            points = router.anchors()[0]
            anchors = points, np.full(len(points), -1, np.int64), np.zeros(len(points), np.float32)
        points, labels, mass = anchors
        if budget is not None:
            per_point = 4 * (points.shape[1] + head.num_classes) + 8 + 4
            if len(points) * per_point > budget:
                keep = np.sort(np.argsort(-np.asarray(mass), kind="stable")[:budget // per_point])
                points, labels, mass = points[torch.from_numpy(keep)], np.asarray(labels)[keep], np.asarray(mass)[keep]
        return cls(router.state(), head.state(), points.numpy().copy(), head(points).numpy().copy(),
                   np.asarray(labels, np.int64).copy(), np.asarray(mass, np.float32).copy())

    def head(self, feature_dim: int) -> GrowingLinearHead:
        head = GrowingLinearHead(feature_dim)
        head.load_state(self.head_state)
        return head

    def router(self, like: FeatureMemory | None) -> FeatureMemory | None:
        """The teacher's memory: `like` as it stood at the snapshot."""
        return None if like is None else like.at_state(self.router_state)

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


def apply_memory(router: FeatureMemory | None, h: torch.Tensor) -> torch.Tensor:
    """h̃ of the feature memory, or h itself for methods without one."""
    return h if router is None else router(h).h_tilde


def train_stage2(head: GrowingLinearHead, router: FeatureMemory | None, features: torch.Tensor, labels: torch.Tensor,
                 teacher: Teacher | None, config: Stage2Config = Stage2Config(), *, seed: int = 0,
                 extra_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 routed: MemoryOutput | None = None, new_classes: list[int] = (),
                 device: torch.device | None = None) -> list[float]:
    """Train the classifier in place on h̃ of the frozen memory; returns the mean loss per epoch.

    The head must already have columns for `labels` (`head.grow`; `new_classes`: the labels it just added, started
    as `config.new_class_init` says). `extra_loss(minibatch indices)` is added to every minibatch's loss: the hook
    through which the baselines add their own term (EWC's penalty, DER++'s replay) to the same CE objective and
    loop. `routed`: `router(features)` if the caller has it already. `device`: where the epochs run (None: the
    CPU): the loop's tensors and the head go there and the head comes back to the CPU after, where it predicts and
    is checkpointed; `extra_loss` must compute there too.
    """
    with torch.no_grad():
        if router is not None and routed is None:
            routed = router(features)
        h_tilde = features if router is None else routed.h_tilde
        if config.new_class_init == "prototype":
            start_at_prototypes(head, h_tilde, labels, list(new_classes), config.init_scale)
        targets = head.columns(labels)
        ce_columns = None
        if config.ce_scope == "current":
            ce_columns = torch.unique(targets)
            targets = torch.searchsorted(ce_columns, targets)
        lwf_logits = anchors = anchor_logits = anchor_targets = labelled = weight = kd_weight = None
        if teacher is not None and teacher.head_state["classes"].size:
            old_head = teacher.head(head.feature_dim)
            teacher_router = None if config.lwf_teacher_memory == "current" else teacher.router(router)
            if router is None or teacher_router is None:  # no memory, or the current one: h̃ as computed above
                lwf_logits = old_head(h_tilde)
            else:
                lwf_logits = old_head(teacher_router(features, routed.ln_h).h_tilde)
            anchors = torch.tensor(teacher.anchors)  # a copy: a restored teacher's arrays are read-only
            anchor_logits = torch.tensor(teacher.anchor_logits)
            has_class = teacher.anchor_labels >= 0
            labelled = torch.from_numpy(has_class)
            anchor_targets = head.columns(torch.from_numpy(teacher.anchor_labels[has_class]))
            weight = anchor_point_weights(teacher.anchor_labels[has_class], teacher.anchor_mass[has_class],
                                          config.anchor_weighting)
            # the KD's points weighed the same way when every anchor has a class (slot anchors: uniform)
            kd_weight = weight if config.anchor_weighting == "class" and has_class.all() else None
    if device is not None:  # on the CPU every move returns the tensor itself
        (h_tilde, targets, ce_columns, lwf_logits, anchors, anchor_logits, anchor_targets, labelled, weight,
         kd_weight) = (None if t is None else t.to(device) for t in (
            h_tilde, targets, ce_columns, lwf_logits, anchors, anchor_logits, anchor_targets, labelled, weight,
            kd_weight))
        head.to(device)
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

    try:
        return optimize(head.parameters(), loss_on, len(features), config.optim, seed)
    finally:
        head.to("cpu")
