"""The one minibatch optimisation loop every trained component uses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

EpochHook = Callable[[int, int, float], None]  # (epochs done, epochs in all, the epoch's mean loss), after each epoch
# Observers of every `optimize` loop running in this process (an actor's progress report to the driver). A listener
# list rather than an argument: the loop sits under every method's head, and none of them need to know.
_epoch_hooks: list[EpochHook] = []


@contextmanager
def report_epochs(hook: EpochHook | None) -> Iterator[None]:
    """Call `hook` after each epoch of every `optimize` loop run inside the block."""
    if hook is None:
        yield
        return
    _epoch_hooks.append(hook)
    try:
        yield
    finally:
        _epoch_hooks.remove(hook)


class ProgressQueue(Protocol):
    """Where a role reports how far a long call has got: (label, done, total, loss) tuples; on Ray a
    `ray.util.queue.Queue` the driver reads while it waits (pipeline/progress.py `Reports`)."""

    def put_nowait(self, item: tuple[str, int, int, float]) -> None: ...


def epoch_reporter(queue: ProgressQueue | None, label: str) -> EpochHook | None:
    """An epoch hook for `report_epochs` that puts each epoch on `queue`, or None when nobody listens."""
    if queue is None:
        return None
    return lambda done, total, loss: queue.put_nowait((label, done, total, loss))


@dataclass(frozen=True)
class OptimConfig:
    epochs: int = 10  # the most epochs run
    lr: float = 1e-3  # Adam's step size
    batch_size: int = 128  # rows per minibatch
    # Early stop [R]: after an epoch whose mean loss is not below (1 - tolerance) x the best epoch so far for
    # `patience` epochs in a row, stop. patience 0: always run `epochs` epochs (the schedule of the MARS paper).
    patience: int = 0
    tolerance: float = 0.0  # the relative loss drop that counts as progress for the early stop
    # torch's fused Adam kernel (the same update rule; on CPU several times faster than the default per-tensor
    # loop for large parameters, equal to it up to float rounding) [R]
    fused: bool = False


def optimize(parameters: Iterable[torch.nn.Parameter], loss_on: Callable[[torch.Tensor], torch.Tensor],
             num_samples: int, config: OptimConfig, seed: int) -> list[float]:
    """Adam over shuffled minibatches; `loss_on(indices)` returns the loss of one minibatch.

    Returns the sample-weighted mean loss of each epoch run (fewer than `config.epochs` when the early stop of
    `config.patience` / `config.tolerance` ended the loop). Deterministic for a given seed.
    """
    params = list(parameters)
    if num_samples == 0 or config.epochs == 0:
        return []
    optimizer = torch.optim.Adam(params, lr=config.lr, **({"fused": True} if config.fused else {}))
    generator = torch.Generator().manual_seed(seed)
    history = []
    for epoch in range(config.epochs):
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
        stop = plateaued(history, config.patience, config.tolerance)
        for hook in _epoch_hooks:
            hook(epoch + 1, epoch + 1 if stop else config.epochs, history[-1])
        if stop:
            break
    return history


def plateaued(history: list[float], patience: int, tolerance: float) -> bool:
    """True when none of the last `patience` epoch losses fell below (1 - tolerance) x the best loss before them
    (|best| for negative losses); never with patience 0 or fewer than patience + 1 epochs."""
    if patience <= 0 or len(history) <= patience:
        return False
    best = min(history[:-patience])
    return min(history[-patience:]) >= best - tolerance * abs(best)
