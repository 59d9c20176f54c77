"""The one minibatch optimisation loop every trained component uses."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OptimConfig:
    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 128


def optimize(parameters: Iterable[torch.nn.Parameter], loss_on: Callable[[torch.Tensor], torch.Tensor],
             num_samples: int, config: OptimConfig, seed: int) -> list[float]:
    """Adam over shuffled minibatches; `loss_on(indices)` returns the loss of one minibatch.

    Returns the sample-weighted mean loss of each epoch. Deterministic for a given seed.
    """
    params = list(parameters)
    if num_samples == 0 or config.epochs == 0:
        return []
    optimizer = torch.optim.Adam(params, lr=config.lr)
    generator = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(config.epochs):
        order = torch.randperm(num_samples, generator=generator)
        total = 0.0
        for start in range(0, num_samples, config.batch_size):
            idx = order[start:start + config.batch_size]
            loss = loss_on(idx)
            optimizer.zero_grad(set_to_none=True)
            if loss.requires_grad:
                loss.backward()
                optimizer.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / num_samples)
    return history
