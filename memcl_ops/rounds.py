"""Rounds and evaluation points of a stream, defined once: the round loop (pipeline/loop.py) follows them, with its
roles as actors or held in this process.

* a round is a visit of a task, or K consecutive batches regardless of visits when task-free (`plan_rounds`); a
  stream that grows while it runs is planned a round at a time, each once the stream has gone past it;
* after a round, the tasks seen so far (the last `window` of them, if set, except after the last round) are
  evaluated on their test data as of the last visit ended, when the round ends a visit at an evaluation point
  (every `evaluate_every`-th visit and the last; task-free: every `evaluate_every`-th round and the last);
* the matrix gets one row per visit ended (task-free: one per evaluation point);
* **anytime** evaluation (`anytime` H, with task boundaries): each visit is cut into H rounds, and after every
  round every task, seen or not, is evaluated: a row of the anytime matrix (docs/methods.md, "Anytime accuracy");
  the accuracy matrix still gets one row per visit ended, over the tasks seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from memcl_ops.data.sources import StreamInfo

RoundBatches = list[tuple[int, int]]  # the (visit, batch index) pairs of one round


def plan_rounds(info: StreamInfo, task_free: bool, every: int, steps: int = 1, ended: bool = True
                ) -> list[RoundBatches]:
    """The units of consolidation, commit and replay: one visit each when task boundaries are given (`steps` > 1:
    each visit cut into that many rounds of as equal a number of batches as it has, for anytime evaluation); K
    consecutive batches regardless of visits when task-free (the learner is told nothing at boundaries;
    evaluation still happens after the round in which a visit ends).

    A stream that has not `ended` (a followed folder, whose batches arrive while it runs) is planned open-ended:
    the rounds the stream has gone past, without the last visit (task-free: the last K batches or fewer), which
    more batches may still join or which may prove the last. A round planned is then the same whenever it is
    planned, as the stream grows, is resumed, or was whole from the start."""
    if not task_free:
        visits = info.visit_batches if ended else info.visit_batches[:-1]
        return [[(v, int(i)) for i in part] for v, n in enumerate(visits)
                for part in np.array_split(np.arange(n), min(max(steps, 1), max(n, 1))) if len(part) or not n]
    flat = [(v, i) for v, n in enumerate(info.visit_batches) for i in range(n)]
    rounds = [flat[a:a + every] for a in range(0, len(flat), every)]
    return rounds if ended else rounds[:-1]


@dataclass(frozen=True)
class Schedule:
    """When a run evaluates and what."""

    task_free: bool
    rounds: int | None  # None: the stream may still grow (a followed folder), so no round is known to be its last
    evaluate_every: int = 1
    # evaluate only the most recently first-trained tasks (None: all seen); the last round evaluates all seen
    window: int | None = None
    anytime: int = 0  # H > 0: every round (H per visit) evaluates every task, seen or not

    def ended(self, info: StreamInfo, batches: RoundBatches) -> list[int]:
        """The visits a round ends."""
        return [v for v, i in batches if i == info.visit_batches[v] - 1]

    def due(self, info: StreamInfo, round_index: int, ended: list[int]) -> bool:
        if self.anytime:
            return True
        if self.task_free:
            return (round_index + 1) % self.evaluate_every == 0 or self.last(round_index)
        return any(v == len(info.visits) - 1 or (v + 1) % self.evaluate_every == 0 for v in ended)

    def tasks(self, seen: list[int], round_index: int, total: int) -> list[int]:
        """The tasks an evaluation after round `round_index` answers (of `total`)."""
        if self.anytime:
            return list(range(total))
        return sorted(seen if self.window is None or self.last(round_index) else seen[-self.window:])

    def last(self, round_index: int) -> bool:
        """Whether round `round_index` is known to be the stream's last."""
        return self.rounds is not None and round_index == self.rounds - 1

    def test_visit(self, batches: RoundBatches, ended: list[int]) -> int:
        """The visit whose test data a round is evaluated on (a drifting stream tests where its classes moved; an
        anytime round inside a visit, where they are in that visit)."""
        if ended:
            return ended[-1]
        return batches[-1][0] if self.anytime else max(batches[-1][0] - 1, 0)


def seen_after(seen: list[int], visit_tasks: Iterable[list[int]]) -> list[int]:
    """The tasks trained so far, in order of first training, after visits with these tasks."""
    seen = list(seen)
    for tasks in visit_tasks:
        seen += [t for t in tasks if t not in seen]
    return seen


def matrix_rows(accuracy: dict[int, float], ended: list[int], tasks: int, task_free: bool, seen: list[int]
                ) -> list[list[float]]:
    """The accuracy-matrix rows a round adds, over the tasks `seen`: one per visit ended (task-free: one if the
    round evaluated)."""
    row = [accuracy.get(t, float("nan")) if t in seen else float("nan") for t in range(tasks)]
    if task_free:
        return [row] if accuracy else []
    return [row for _ in ended]
