"""Data-parallel learning on PyTorch's engine: N workers, one process each, joined in one torch.distributed group,
learn as one. Each worker takes its share of every optimizer step's rows (every N-th from its rank on) and weighs its
rows' losses by N over the step's row count; DDP all-reduces the gradients and averages them over the workers, which
is then the gradient of the whole step's mean loss: the same learning as one worker on the same steps, up to the
order of float sums. The workers start from the same state and take the same calls in the same order.

Ray-free: a pipeline starts the workers (actors), has worker 0 pick a `rendezvous_address` and every worker
`join_group` there; a learner wraps its trained forward with `data_parallel`."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

# how long a worker waits for the others at the rendezvous or an all-reduce before it fails: the others wait there
# while worker 0 alone evaluates (a returning task's recovery, a test set); a dead worker fails it at once
GROUP_TIMEOUT = timedelta(minutes=30)


def rendezvous_address(host: str) -> str:
    """`host`:<a free port>, where worker 0 of a data-parallel group is reached."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def join_group(address: str, rank: int, world: int, nccl: bool) -> None:
    """Join, as worker `rank` of `world`, the process group whose worker 0 is reached at `address`, leaving the group
    of an earlier run (or of the workers before a fault) first. NCCL where every worker has a GPU of its own (`nccl`),
    else gloo (CPUs, or workers sharing a GPU, which NCCL refuses)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"tcp://{address}", rank=rank, world_size=world,
                            timeout=GROUP_TIMEOUT)


@dataclass(frozen=True)
class DataParallel:
    """One worker's part of a data-parallel group: `module`, the trained forward DDP wraps, is what its steps call."""

    rank: int
    world: int
    module: nn.Module

    def rows(self, n: int) -> tuple[np.ndarray, float]:
        """This worker's positions among a step's `n` rows and the weight of each row's loss; with fewer rows than
        workers a worker left without one takes part in the all-reduce with a row that weighs nothing."""
        own = np.arange(self.rank, n, self.world)
        if not len(own):
            return np.zeros(1, np.int64), 0.0
        return own, self.world / n

    def group_mean(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` (this worker's weighed share) with the value of the whole step's mean loss (the average of the
        workers' shares) and this worker's own gradient: what a step reports, bit for bit the same on every worker,
        so an early stop on it stops them all together."""
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total / self.world + (loss - loss.detach())


def data_parallel(module: nn.Module, rank: int, world: int, find_unused: bool) -> DataParallel:
    """`module` wrapped by DDP for worker `rank` of `world` in the default group, which every worker has joined.
    Only what is trained is synchronised: frozen parameters and buffers are the same on every worker already.
    `find_unused`: a forward may leave trained parameters out (an adapter site it does not pass through)."""
    from torch.nn.parallel import DistributedDataParallel

    frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, frozen + [n for n, _ in module.named_buffers()])
    return DataParallel(rank, world, DistributedDataParallel(module, find_unused_parameters=find_unused))
