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


class SampleIds:
    """The sample ids a role has learned, for exactly-once accounting: how many it was given (`added`) and the set
    of them, kept as sorted disjoint ranges [start, end). A stream's ids come in runs, so the ranges stay few however
    long the stream, and so does the state a checkpoint copies."""

    def __init__(self) -> None:
        self.ranges = np.zeros((0, 2), np.int64)
        self.added = 0

    def add(self, ids: np.ndarray) -> None:
        """Rows learned, by their sample ids (a repeated id counts in `added`, once in the set)."""
        self.added += len(ids)
        ids = np.unique(np.asarray(ids, np.int64))
        if not len(ids):
            return
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        runs = np.stack([ids[np.r_[0, breaks]], ids[np.r_[breaks - 1, len(ids) - 1]] + 1], axis=1)
        self.ranges = _merge_ranges(np.concatenate([self.ranges, runs]))

    def __len__(self) -> int:
        """Distinct ids."""
        return int((self.ranges[:, 1] - self.ranges[:, 0]).sum())

    def array(self) -> np.ndarray:
        return np.concatenate([np.arange(a, b) for a, b in self.ranges]) if len(self.ranges) else np.zeros(0, np.int64)

    def state(self) -> dict[str, np.ndarray]:
        return {"ranges": self.ranges.copy(), "added": np.array(self.added, np.int64)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.ranges = np.asarray(state["ranges"], np.int64).reshape(-1, 2)
        self.added = int(state["added"])


def _merge_ranges(ranges: np.ndarray) -> np.ndarray:
    """Sorted disjoint [start, end) ranges covering the union of `ranges` (touching ranges joined)."""
    ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
    ends = np.maximum.accumulate(ranges[:, 1])
    starts_new = np.r_[True, ranges[1:, 0] > ends[:-1]]
    first = np.flatnonzero(starts_new)
    last = np.r_[first[1:] - 1, len(ranges) - 1]
    return np.stack([ranges[first, 0], ends[last]], axis=1)
