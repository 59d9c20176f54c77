"""How a trainer actor tells the driver how far a long call has got: (label, done, total, loss) on a Ray queue the
driver reads while it waits (pipeline/progress.py `Reports`)."""

from __future__ import annotations

from ray.util.queue import Queue

from memcl_ops.training import EpochHook


def epoch_reporter(queue: Queue | None, label: str) -> EpochHook | None:
    """An epoch hook for `memcl_ops.training.report_epochs`, or None when nobody listens."""
    if queue is None:
        return None
    return lambda done, total, loss: queue.put_nowait((label, done, total, loss))
