"""Small tensor helpers every method family uses."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F

NORM_EPS = 1e-8


def resolve_device(name: str) -> torch.device:
    """`name` as a torch device; "auto": the first GPU this process sees, else the CPU. Ray makes visible to an
    actor that reserved GPUs exactly those (CUDA_VISIBLE_DEVICES); one that reserved none sees every GPU, so the
    pipeline asks for "auto" only for a role placed on a GPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def best_class(classes: np.ndarray, scores: np.ndarray | torch.Tensor, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(the class of each row's highest score, that score); (-1, -inf) for every row while there is no class."""
    if not len(classes):
        return np.full(rows, -1, dtype=np.int64), np.full(rows, -np.inf, dtype=np.float32)
    scores = scores.numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    best = scores.argmax(axis=1)
    return np.asarray(classes, np.int64)[best], scores[np.arange(len(best)), best].astype(np.float32)


def normalize(v: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """Norm(v) = v / (‖v‖₂ + ε) along the last axis."""
    return v / (v.norm(dim=-1, keepdim=True) + eps)


def layer_norm(h: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Parameter-free LayerNorm over the feature axis."""
    return F.layer_norm(h, h.shape[-1:], eps=eps)


def take_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] along the first axis: on the CPU several times faster for a block of rows (the same values); the index
    follows x to its device, as x[idx] allows a CPU index on a CUDA tensor and index_select does not."""
    return x.index_select(0, idx.to(x.device))


def array_bytes(state: dict[str, np.ndarray]) -> int:
    """Bytes of the non-scalar arrays of a state, text counted as UTF-8 (as text replay meters it): what a
    learner's `memory_bytes` must add up to (0-d values are bookkeeping: counters, settings)."""
    arrays = [np.asarray(v) for v in state.values()]
    return int(sum(sum(len(s.encode()) for s in a.ravel().tolist()) if a.dtype.kind == "U" else a.nbytes
                   for a in arrays if a.ndim > 0))


def parameter_bytes(parameters: Iterable[torch.Tensor]) -> int:
    return int(sum(p.numel() * p.element_size() for p in parameters))


def prefixed(prefix: str, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A part's state under `prefix.` in a composed state."""
    return {f"{prefix}.{k}": v for k, v in state.items()}


def state_part(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The inverse of `prefixed`."""
    return {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
