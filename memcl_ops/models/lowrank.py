"""SVD compression of LoRA deltas through their factors (NSR, docs/methods.md, "NSR").

A LoRA delta ΔW = B A (d_out×d_in, B: d_out×r, A: r×d_in, scale folded into B) has rank ≤ r, so its thin SVD
comes exactly from two QRs and one r×r SVD, in O((d_out + d_in)·r²) instead of the O(d_out·d_in·min) of
`torch.linalg.svd(ΔW)` (what peft does):

    B = Q_B R_B,  Aᵀ = Q_A R_A,  svd(R_B R_Aᵀ) = U' Σ V'ᵀ   =>   ΔW = (Q_B U') Σ (Q_A V')ᵀ

Compression keeps the smallest rank k whose singular values hold a fraction η_E of the energy Σσ², capped at
k_max, and stores the balanced factors B' = U_k Σ_k^½, A' = Σ_k^½ V_kᵀ (balanced so neither factor strays far
from 1 in magnitude, which fp16 needs) in the storage dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

ENERGY_SLACK = 1e-9  # cumulative energy within this of η_E counts as reaching it (η_E = 1 must keep full rank)


@dataclass(frozen=True)
class CompressionConfig:
    energy: float = 0.90  # η_E: fraction of Σσ² to keep [R]
    max_rank: int = 4  # k_max [R] (benchmarks/RESULTS.md: 0.295 MB per ViT-B/16 task)
    dtype: Literal["float16", "float32"] = "float16"  # storage dtype of the factors [R]

    def __post_init__(self) -> None:
        if not 0.0 < self.energy <= 1.0:
            raise ValueError(f"compression energy must be in (0, 1], got {self.energy}")
        if self.max_rank < 1:
            raise ValueError(f"compression max_rank must be >= 1, got {self.max_rank}")


def factored_svd(B: torch.Tensor, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD (U, S, Vh) of B @ A from the factors (computed in float64, returned in B's dtype).

    U: (d_out, k), S: (k,) descending, Vh: (k, d_in) with k = min(r, d_out, d_in), r = B.shape[1] (trailing
    singular values are 0 when the factors are rank-deficient).
    """
    if B.ndim != 2 or A.ndim != 2 or B.shape[1] != A.shape[0]:
        raise ValueError(f"factors must be (d_out, r) and (r, d_in), got {tuple(B.shape)} and {tuple(A.shape)}")
    b, a = B.double(), A.double()
    q_b, r_b = torch.linalg.qr(b)
    q_a, r_a = torch.linalg.qr(a.T)
    u, s, vh = torch.linalg.svd(r_b @ r_a.T, full_matrices=False)
    return (q_b @ u).to(B.dtype), s.to(B.dtype), (vh @ q_a.T).to(B.dtype)


def energy_rank(singular_values: torch.Tensor, energy: float, max_rank: int) -> int:
    """min(k_max, smallest k with Σ_{i<k} σ_i² ≥ η_E · Σ σ_i²); 0 for an all-zero delta."""
    s2 = singular_values.double().pow(2)
    total = float(s2.sum())
    if total == 0.0:
        return 0
    kept = torch.cumsum(s2, 0) / total
    k = int(torch.searchsorted(kept, torch.tensor(energy - ENERGY_SLACK, dtype=kept.dtype))) + 1
    return min(k, max_rank, len(s2))


@dataclass(frozen=True)
class CompressedDelta:
    """ΔW ≈ B @ A with B: (d_out, k), A: (k, d_in) in the storage dtype."""

    B: np.ndarray
    A: np.ndarray
    energy_kept: float  # Σ_{i<k}σ_i² / Σσ_i² of the delta it came from (1.0 for a zero delta)

    @property
    def rank(self) -> int:
        return self.A.shape[0]

    @property
    def nbytes(self) -> int:
        return self.B.nbytes + self.A.nbytes

    def dense(self) -> torch.Tensor:
        return torch.from_numpy(self.B.astype(np.float32)) @ torch.from_numpy(self.A.astype(np.float32))

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 (B, A) as stored (the fp16 rounding included)."""
        return self.B.astype(np.float32), self.A.astype(np.float32)


def compress(B: torch.Tensor, A: torch.Tensor, config: CompressionConfig = CompressionConfig()) -> CompressedDelta:
    """Compress the delta B @ A (scale already in B) to the energy-rule rank, in the storage dtype."""
    u, s, vh = factored_svd(B, A)
    k = energy_rank(s, config.energy, config.max_rank)
    s2 = s.double().pow(2)
    kept = float(s2[:k].sum() / s2.sum()) if float(s2.sum()) > 0 else 1.0
    root = s[:k].sqrt()
    dtype = np.dtype(config.dtype)
    with np.errstate(over="ignore"):  # overflow is checked just below, with a message that says what to do
        b = (u[:, :k] * root).cpu().numpy().astype(dtype)
        a = (root[:, None] * vh[:k]).cpu().numpy().astype(dtype)
    if not (np.isfinite(b).all() and np.isfinite(a).all()):
        raise ValueError(f"delta factors overflow {config.dtype} (largest singular value {float(s[0]):.3g}); "
                         "store in float32")
    return CompressedDelta(b, a, kept)


def mix_and_refactor(parts: Sequence[tuple[float, Mapping[str, CompressedDelta]]], rank: int
                     ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Factors (B0, A0) of rank ≤ `rank` of ΔW0 = Σ_i w_i ΔW_i per site (the NSR warm start).

    ΔW0 is itself a product of stacked factors, [w_1 B_1 … w_m B_m] @ [A_1; …; A_m], so its SVD is exact via
    `factored_svd`; the top `rank` components are kept in the peft convention B0 = U_r Σ_r, A0 = V_rᵀ
    (orthonormal rows of A, so components with σ = 0 still train, as in a fresh LoRA).
    """
    sites = sorted({s for _, deltas in parts for s in deltas})
    out = {}
    for site in sites:
        bs, as_ = [], []
        for w, deltas in parts:
            if site in deltas and deltas[site].rank:
                b, a = deltas[site].factors()
                bs.append(w * torch.from_numpy(b))
                as_.append(torch.from_numpy(a))
        if not bs:
            continue
        u, s, vh = factored_svd(torch.cat(bs, 1), torch.cat(as_, 0))
        k = min(rank, len(s))
        out[site] = ((u[:, :k] * s[:k]).numpy(), vh[:k].numpy().copy())
    return out
