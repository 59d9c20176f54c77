"""Rounds and evaluation points of a stream, defined once: the runner (pipeline/runner.py) follows them with actors,
`stream_in_process` with an in-process learner, so both fill the same accuracy matrix.

* a round is a visit of a task, or K consecutive batches regardless of visits when task-free (`plan_rounds`);
* after a round, the tasks seen so far (the last `window` of them, if set, except after the last round) are
  evaluated on their test data as of the last visit ended, when the round ends a visit at an evaluation point
  (every `evaluate_every`-th visit and the last; task-free: every `evaluate_every`-th round and the last);
* the matrix gets one row per visit ended (task-free: one per evaluation point);
* **anytime** evaluation (`anytime` H, with task boundaries): each visit is cut into H rounds, and after every
  round every task, seen or not, is evaluated: a row of the anytime matrix (docs/methods.md, "Anytime accuracy");
  the accuracy matrix still gets one row per visit ended, over the tasks seen.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.data.sources import StreamInfo
from memcl_ops.learner import Round, StreamLearner
from memcl_ops.prequential import PrequentialConfig, Tally
from memcl_ops.realtime import RealtimeConfig, StreamClock
from memcl_ops.roles.stream_source import StreamSource

RoundBatches = list[tuple[int, int]]  # the (visit, batch index) pairs of one round


def plan_rounds(info: StreamInfo, task_free: bool, every: int, steps: int = 1) -> list[RoundBatches]:
    """The units of consolidation, commit and replay: one visit each when task boundaries are given (`steps` > 1:
    each visit cut into that many rounds of as equal a number of batches as it has, for anytime evaluation); K
    consecutive batches regardless of visits when task-free (the learner is told nothing at boundaries;
    evaluation still happens after the round in which a visit ends)."""
    if not task_free:
        return [[(v, int(i)) for i in part] for v, n in enumerate(info.visit_batches)
                for part in np.array_split(np.arange(n), min(max(steps, 1), max(n, 1))) if len(part) or not n]
    flat = [(v, i) for v, n in enumerate(info.visit_batches) for i in range(n)]
    return [flat[a:a + every] for a in range(0, len(flat), every)]


@dataclass(frozen=True)
class Schedule:
    """When a run evaluates and what."""

    task_free: bool
    rounds: int
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
            return (round_index + 1) % self.evaluate_every == 0 or round_index == self.rounds - 1
        return any(v == len(info.visits) - 1 or (v + 1) % self.evaluate_every == 0 for v in ended)

    def tasks(self, seen: list[int], round_index: int, total: int) -> list[int]:
        """The tasks an evaluation after round `round_index` answers (of `total`)."""
        if self.anytime:
            return list(range(total))
        last = round_index == self.rounds - 1
        return sorted(seen if self.window is None or last else seen[-self.window:])

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


@dataclass
class InProcessRun:
    """What `stream_in_process` leaves: the accuracy matrix, the rows refused at the gate, the learner's report and
    test-then-train predictions per round."""

    rows: list[list[float]] = field(default_factory=list)
    refused: list[pa.Table] = field(default_factory=list)
    reports: list[dict] = field(default_factory=list)
    predictions: list[pa.Table] = field(default_factory=list)  # per round, its test-then-train predictions
    anytime: list[list[float]] = field(default_factory=list)  # per round, every task's accuracy (anytime runs)

    def prequential(self, config: PrequentialConfig | None = None) -> dict | None:
        """The run's test-then-train figures, as the runner's metrics.json has them (None: nothing predicted)."""
        config = config or PrequentialConfig()
        if not self.predictions:
            return None
        tally = Tally()
        for table in self.predictions:
            tally.add(table, config.window)
        return tally.report(config)

    @property
    def matrix(self) -> np.ndarray:
        return np.array(self.rows, dtype=float)

    @property
    def refused_ids(self) -> np.ndarray:
        ids = [t.column(S.SAMPLE_ID).to_numpy() for t in self.refused if t.num_rows]
        return np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)


def stream_in_process(learner: StreamLearner, source: StreamSource, schedule: Schedule, every: int = 0,
                      clock: StreamClock | None = None, realtime: RealtimeConfig | None = None) -> InProcessRun:
    """Stream `source` through `learner` in this process, round by round, with the runner's rounds and evaluation
    points: the in-process executor of a run (`memcl run` is the actor one). `every`: batches per task-free round;
    `clock` and `realtime`: a stream that does not wait (memcl_ops/realtime.py), the learner `watch`ing each batch
    that arrives while it is busy."""
    info = source.describe()
    out, seen = InProcessRun(), []
    offsets = np.cumsum([0, *info.visit_batches])
    for r, batches in enumerate(plan_rounds(info, schedule.task_free, every, schedule.anytime)):
        visits = sorted({v for v, _ in batches})
        task = None if schedule.task_free else int(info.visits[visits[0]])
        learner.begin_round(Round(r, task, None if task is None else tuple(info.task_classes[task])))
        started, learned = time.perf_counter(), 0
        for v, i in batches:
            takes = clock is None or clock.admit(int(offsets[v] + i), realtime.rate)
            learned += takes
            batch, refused = source.train_batch(v, i)
            out.refused.append(refused)
            if batch is not None:
                (learner.observe if takes else learner.watch)(batch)
        report = learner.consolidate()
        if clock is not None and realtime.mode == "wall":
            clock.measured(time.perf_counter() - started, learned)
        if "prequential" in report:
            out.predictions.append(report.pop("prequential"))
        out.reports.append(report)
        ended = schedule.ended(info, batches)
        seen = seen_after(seen, (source.visit_tasks(v) for v in visits))
        accuracy = {}
        if schedule.due(info, r, ended):
            after = schedule.test_visit(batches, ended)
            accuracy = {t: _accuracy(learner, source, t, after, out.refused)
                        for t in schedule.tasks(seen, r, len(info.task_classes))}
        out.rows += matrix_rows(accuracy, ended, len(info.task_classes), schedule.task_free, seen)
        if schedule.anytime:
            out.anytime.append([accuracy[t] for t in range(len(info.task_classes))])
    return out


def _accuracy(learner: StreamLearner, source: StreamSource, task: int, after_visit: int, refused: list[pa.Table]
              ) -> float:
    right = total = 0
    for k in range(source.describe().test_batches[task]):
        batch, dead = source.test_batch(task, k, after_visit)
        refused.append(dead)
        if batch is not None:
            right += int((np.asarray(learner.predict(batch)) == S.labels_to_numpy(batch)).sum())
            total += batch.num_rows
    return right / total if total else float("nan")
