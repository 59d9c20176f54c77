"""DCDA: MARS's own parts of its two training stages, as plain functions over feature tensors (docs/methods.md,
"DCDA").

Stage 1 trains the memory only (W_q, K, γ, β as written; by default K, γ, β, see `Stage1Config.train_query`) with
SupCon on Norm(h̃) + λ_smooth·‖h̃ − target‖², one epoch by default (`Stage1Config.optim`);
the classifier does not enter the loss, so it is frozen by construction.
Stage 2 is the loop every trained head shares (memcl_ops/head_training.py); MARS adds its old classes' points to
it: anchors per (slot, class) (`ClassAnchors`) and Gaussian draws per class (`ClassGaussians`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from memcl_ops.losses import smoothness_loss, supcon_loss
from memcl_ops.mars.router import RouterOutput, SlotRouter
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
