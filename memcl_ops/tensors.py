"""Small tensor helpers every method family uses."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

NORM_EPS = 1e-8


def normalize(v: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """Norm(v) = v / (‖v‖₂ + ε) along the last axis."""
    return v / (v.norm(dim=-1, keepdim=True) + eps)


def layer_norm(h: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Parameter-free LayerNorm over the feature axis."""
    return F.layer_norm(h, h.shape[-1:], eps=eps)


def state_nbytes(state: dict[str, np.ndarray]) -> int:
    return int(sum(np.asarray(v).nbytes for v in state.values()))
