"""Losses of DCDA and the distillation baselines (docs/methods.md, "DCDA")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memcl_ops.tensors import normalize


def supcon_loss(features: torch.Tensor, labels: torch.Tensor, temperature: float = 0.07,
                base_temperature: float = 0.07) -> torch.Tensor:
    """Supervised contrastive loss, single view (Khosla et al. 2020, `SupContrast` "all" mode).

    Positives of anchor i are the other samples of its class in the batch. Anchors with no positive
    are left out (the reference code would divide by zero); with none left the loss is 0.
    """
    z = normalize(features)
    n = z.shape[0]
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    logits = (z @ z.T / temperature).masked_fill(self_mask, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positives = (labels[:, None] == labels[None, :]) & ~self_mask
    counts = positives.sum(dim=1)
    valid = counts > 0
    if not bool(valid.any()):
        return z.sum() * 0.0
    mean_log_prob_pos = log_prob.masked_fill(~positives, 0.0).sum(dim=1)[valid] / counts[valid]
    return -(temperature / base_temperature) * mean_log_prob_pos.mean()


def smoothness_loss(h_tilde: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(1/N) Σ ‖h̃_i − target_i‖²."""
    return (h_tilde - target).pow(2).sum(dim=1).mean()


def _row_mean(rows: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return rows.mean() if weights is None else weights @ rows


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
            weights: torch.Tensor | None = None) -> torch.Tensor:
    """T² · KL(softmax(teacher/T) ‖ softmax(student/T)), averaged over rows (Hinton et al.), or summed with
    `weights` (one per row: summing to 1 for a weighted mean)."""
    t = temperature
    log_p_student = F.log_softmax(student_logits / t, dim=1)
    p_teacher = F.softmax(teacher_logits / t, dim=1)
    return t * t * _row_mean(F.kl_div(log_p_student, p_teacher, reduction="none").sum(1), weights)


def old_class_kd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """KD restricted to the teacher's (old) classes: the first `teacher_logits.shape[1]` columns.

    This is both L_LwF (on current inputs) and L_anchor (on anchor points) of DCDA stage 2.
    """
    old = teacher_logits.shape[1]
    if old == 0 or student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    return kd_loss(student_logits[:, :old], teacher_logits, temperature, weights)


def old_class_kd_full(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                      weights: torch.Tensor | None = None) -> torch.Tensor:
    """KD of the student's full softmax (old and new classes) towards the teacher's old-class distribution,
    i.e. the teacher padded with zero probability for the new classes.

    Unlike `old_class_kd`, this also keeps new-class logits from taking over inputs the teacher gave to old
    classes, which is the "anchor prediction consistency" MARS's retention bound (Thm. 2) relies on.
    """
    old = teacher_logits.shape[1]
    if old == 0 or student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    t = temperature
    p_teacher = F.softmax(teacher_logits / t, dim=1)
    log_p_student = F.log_softmax(student_logits / t, dim=1)[:, :old]
    return t * t * _row_mean((p_teacher * (torch.log(p_teacher.clamp_min(1e-12)) - log_p_student)).sum(1), weights)
