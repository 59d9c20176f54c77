"""A linear classifier over global class ids that grows as new classes appear."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from memcl_ops.tensors import best_class


class GrowingLinearHead(nn.Module):
    """Column j scores global class `classes[j]`; columns are appended in order of first appearance.

    Growing never touches existing columns, so old logits are unchanged by `grow`.
    """

    def __init__(self, feature_dim: int):
        super().__init__()
        self.feature_dim = feature_dim
        self.weight = nn.Parameter(torch.zeros(0, feature_dim))
        self.bias = nn.Parameter(torch.zeros(0))
        self.classes: list[int] = []

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @torch.no_grad()
    def grow(self, labels: np.ndarray | torch.Tensor | list[int]) -> list[int]:
        """Add a zero-initialised column for each label not seen before; returns the new labels."""
        seen = set(self.classes)
        new = []
        for label in np.unique(np.asarray(labels, dtype=np.int64)).tolist():
            if label < 0:
                raise ValueError(f"labels must be >= 0, got {label}")
            if label not in seen:
                new.append(label)
        if new:
            self.weight = nn.Parameter(torch.cat([self.weight.data, torch.zeros(len(new), self.feature_dim)]))
            self.bias = nn.Parameter(torch.cat([self.bias.data, torch.zeros(len(new))]))
            self.classes.extend(new)
        return new

    def columns(self, labels: torch.Tensor) -> torch.Tensor:
        """Column indices of global labels (all must be known to the head)."""
        lookup = {c: i for i, c in enumerate(self.classes)}
        try:
            return torch.tensor([lookup[int(y)] for y in labels.tolist()], dtype=torch.long)
        except KeyError as err:
            raise ValueError(f"label {err.args[0]} is not a class of this head") from None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.T + self.bias

    @torch.no_grad()
    def predict(self, h: torch.Tensor) -> np.ndarray:
        """Global class ids of the highest logit (-1 if the head has no class yet)."""
        return self.scored(h)[0]

    @torch.no_grad()
    def scored(self, h: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(the class of the highest logit, that logit) per row."""
        return best_class(np.asarray(self.classes, np.int64), self(h) if self.classes else None, h.shape[0])

    def state(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight.detach().numpy().copy(), "bias": self.bias.detach().numpy().copy(),
                "classes": np.asarray(self.classes, dtype=np.int64)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.weight = nn.Parameter(torch.as_tensor(np.array(state["weight"], dtype=np.float32)))
        self.bias = nn.Parameter(torch.as_tensor(np.array(state["bias"], dtype=np.float32)))
        self.classes = [int(c) for c in state["classes"]]

    def nbytes(self) -> int:
        return self.weight.numel() * 4 + self.bias.numel() * 4 + 8 * len(self.classes)
