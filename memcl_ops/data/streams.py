"""Stream specs: how a labelled dataset becomes a non-stationary stream of tasks.

Class-incremental split: classes are shuffled with a seeded order (default seed 1993, the PyCIL/DER
convention) and cut into tasks. Options:

* `task_free`: the learner gets no task boundaries (task_id is null on training rows); the runner
  consolidates every K batches instead. Evaluation still happens at the true boundaries.
* `visits`: the order in which tasks are streamed, with repeats for recurrence (e.g. 0 1 2 0 1 2).
  A revisit streams the task's training rows again under new sample ids (`revisit_rows: repeat`), or rows of the
  task that no earlier visit streamed (`revisit_rows: new`: each visit draws `train_per_class` rows per class,
  disjoint across the task's visits). The test rows are the dataset's test split: never streamed.
* `drift`: gradual boundaries. The last `drift` fraction of each visit is blended with the start of
  the next one: a row there is swapped with a row of the next visit with probability rising linearly
  to 1/2. Every row is still streamed exactly once per visit and keeps its true task id.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from memcl_ops.buffer import BufferConfig
from memcl_ops.realtime import RealtimeConfig


@dataclass(frozen=True)
class StreamSpec:
    tasks: int = 5  # tasks the classes are split into
    first_task_classes: int | None = None  # None: classes split evenly; else the first task's size
    class_order_seed: int = 1993  # the seeded class order (a common class-incremental convention)
    shuffle_classes: bool = True  # split the classes in that seeded order, or in label order
    train_per_class: int | None = None  # subsample (seeded) per class; None: all rows
    test_per_class: int | None = None  # the same for the test rows
    sample_seed: int = 0  # subsampling and within-task shuffling
    task_free: bool = False  # learners get no boundaries: rounds of `method.consolidate_every` batches
    visits: tuple[int, ...] | None = None  # task order with repeats; None: 0..tasks-1 once
    # what a revisit streams: the task's rows again ("repeat"), or rows no earlier visit of the task streamed ("new",
    # train_per_class per class and visit; None: the class's rows split evenly over the task's visits)
    revisit_rows: Literal["repeat", "new"] = "repeat"
    drift: float = 0.0  # share of each visit blended into the next task (gradual boundaries)
    batch_size: int = 256  # rows per batch the stream emits
    # explicit global class ids of each task (tasks may share classes, e.g. binary topic pairs); overrides the
    # seeded split above and must list `tasks` tasks
    task_classes: tuple[tuple[int, ...], ...] | None = None
    # whether the stream waits for each consolidation, or goes on while the trainers consolidate in the background
    # (memcl_ops/realtime.py; the "features" methods)
    realtime: RealtimeConfig = RealtimeConfig()
    # the labelled rows waiting for a consolidation: their byte budget and which go first past it
    # (memcl_ops/buffer.py)
    buffer: BufferConfig = BufferConfig()
    # an arrow:<folder> stream: take every data file renamed into train/ while the run goes on (docs/guide.md, "Live
    # streams"), rounds planned as their batches arrive
    follow: bool = False
    # with follow: end the stream once the run has waited this many seconds for a new file (None: run until stopped)
    idle_timeout_s: float | None = None
    poll_s: float = 0.5  # with follow: how often train/ is listed for new files while the run waits for them

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.batch_size < 1:
            raise ValueError(f"tasks and batch_size must be at least 1, got tasks={self.tasks}, "
                             f"batch_size={self.batch_size}")
        if self.visits is not None and any(not 0 <= v < self.tasks for v in self.visits):
            raise ValueError(f"visits {list(self.visits)} name tasks outside 0..{self.tasks - 1}")
        if self.task_classes is not None and (len(self.task_classes) != self.tasks
                                              or not all(self.task_classes)):
            raise ValueError(f"task_classes must list {self.tasks} non-empty tasks, got {self.task_classes}")
        if not 0.0 <= self.drift <= 1.0:
            raise ValueError(f"drift must be in [0, 1], got {self.drift}")
        if self.revisit_rows not in ("repeat", "new"):
            raise ValueError(f"revisit_rows must be repeat or new, got {self.revisit_rows!r}")
        if self.idle_timeout_s is not None and self.idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be above 0 seconds (null: follow until stopped), got "
                             f"{self.idle_timeout_s}")
        if self.poll_s <= 0:
            raise ValueError(f"poll_s must be above 0 seconds, got {self.poll_s}")


def task_classes(num_classes: int, spec: StreamSpec) -> list[list[int]]:
    """The global class ids of each task, in the seeded class order (or as `spec.task_classes` lists them)."""
    if spec.task_classes is not None:
        outside = sorted({c for cs in spec.task_classes for c in cs if not 0 <= c < num_classes})
        if outside:
            raise ValueError(f"task_classes name classes {outside} outside 0..{num_classes - 1}")
        return [list(cs) for cs in spec.task_classes]
    order = np.arange(num_classes)
    if spec.shuffle_classes:
        order = np.random.RandomState(spec.class_order_seed).permutation(num_classes)
    if spec.first_task_classes is None:
        if num_classes % spec.tasks:
            divisors = [n for n in range(1, num_classes + 1) if num_classes % n == 0]
            raise ValueError(f"{num_classes} classes do not split evenly into {spec.tasks} tasks: tasks accepts "
                             f"{', '.join(map(str, divisors))}, or set first_task_classes")
        sizes = [num_classes // spec.tasks] * spec.tasks
    else:
        rest = num_classes - spec.first_task_classes
        if spec.tasks < 2 or rest % (spec.tasks - 1):
            raise ValueError(f"after {spec.first_task_classes} classes, {rest} do not split into "
                             f"{spec.tasks - 1} tasks")
        sizes = [spec.first_task_classes] + [rest // (spec.tasks - 1)] * (spec.tasks - 1)
    cuts = np.cumsum([0, *sizes])
    return [order[a:b].tolist() for a, b in itertools.pairwise(cuts)]


def _subsample(labels: np.ndarray, classes: list[int], per_class: int | None, rng: np.random.Generator) -> np.ndarray:
    rows = []
    for c in classes:
        idx = np.flatnonzero(labels == c)
        if per_class is not None and per_class < len(idx):
            idx = np.sort(rng.choice(idx, per_class, replace=False))
        rows.append(idx)
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Batch:
    """One training batch of the plan: stream positions, dataset rows, true tasks, and the visit index."""

    sample_ids: np.ndarray
    rows: np.ndarray
    tasks: np.ndarray
    visit: int


@dataclass
class StreamPlan:
    """Everything about a stream that is fixed before it starts (so a resumed run reproduces it)."""

    spec: StreamSpec
    classes: list[list[int]]
    train_rows: list[np.ndarray]  # per task, dataset rows of its training data
    test_rows: list[np.ndarray]  # per task, dataset rows of its test data
    visits: list[int]
    visit_rows: list[np.ndarray] = field(default_factory=list)  # per visit, rows in stream order
    visit_tasks: list[np.ndarray] = field(default_factory=list)  # per visit, the true task of each row

    @property
    def num_tasks(self) -> int:
        return len(self.classes)

    @property
    def label_set(self) -> frozenset[int]:
        return frozenset(c for cs in self.classes for c in cs)

    def batches_of_visit(self, visit: int) -> list[Batch]:
        """The batches of one visit, with sample ids continuing across visits."""
        start = sum(len(r) for r in self.visit_rows[:visit])
        rows, tasks = self.visit_rows[visit], self.visit_tasks[visit]
        bs = self.spec.batch_size
        return [Batch(np.arange(start + a, start + min(a + bs, len(rows)), dtype=np.int64), rows[a:a + bs],
                      tasks[a:a + bs], visit) for a in range(0, len(rows), bs)]

    def all_batches(self) -> Iterator[Batch]:
        for v in range(len(self.visits)):
            yield from self.batches_of_visit(v)

    @property
    def num_samples(self) -> int:
        return int(sum(len(r) for r in self.visit_rows))


def _disjoint_shares(labels: np.ndarray, classes: list[int], per_class: int | None, shares: int, task: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """`shares` disjoint draws of `per_class` rows of each class (None: every row of the class, split evenly)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(shares)]
    for c in classes:
        idx = rng.permutation(np.flatnonzero(labels == c))
        n = len(idx) // shares if per_class is None else per_class
        if n * shares > len(idx) or n < 1:
            raise ValueError(f"stream.revisit_rows=new: task {task} visits {shares} times, which needs {shares} x "
                             f"{n} rows of class {c}; it has {len(idx)} (lower stream.train_per_class)")
        for k in range(shares):
            parts[k].append(np.sort(idx[k * n:(k + 1) * n]))
    return [np.concatenate(p) for p in parts]


def make_plan(train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int, spec: StreamSpec) -> StreamPlan:
    classes = task_classes(num_classes, spec)
    rng = np.random.default_rng(spec.sample_seed)
    visits = list(spec.visits) if spec.visits is not None else list(range(spec.tasks))
    if spec.revisit_rows == "new":
        shares = [_disjoint_shares(train_labels, cs, spec.train_per_class, max(1, visits.count(t)), t, rng)
                  for t, cs in enumerate(classes)]
        train_rows = [np.sort(np.concatenate(s)) for s in shares]
    else:
        train_rows = [_subsample(train_labels, cs, spec.train_per_class, rng) for cs in classes]
    test_rows = [_subsample(test_labels, cs, spec.test_per_class, rng) for cs in classes]
    plan = StreamPlan(spec, classes, train_rows, test_rows, visits)
    for i, v in enumerate(visits):
        rows = shares[v][visits[:i].count(v)] if spec.revisit_rows == "new" else train_rows[v]
        plan.visit_rows.append(rng.permutation(rows))
        plan.visit_tasks.append(np.full(len(rows), v, dtype=np.int64))
    if spec.drift > 0:
        _blend_boundaries(plan, spec.drift, rng)
    return plan


def _blend_boundaries(plan: StreamPlan, drift: float, rng: np.random.Generator) -> None:
    for i in range(len(plan.visits) - 1):
        rows, tasks = plan.visit_rows[i], plan.visit_tasks[i]
        nxt_rows, nxt_tasks = plan.visit_rows[i + 1], plan.visit_tasks[i + 1]
        tail = int(len(rows) * drift)
        head = 0
        for k in range(tail):
            pos = len(rows) - tail + k
            if head < len(nxt_rows) and rng.random() < 0.5 * (k + 1) / (tail + 1):
                rows[pos], nxt_rows[head] = nxt_rows[head], rows[pos]
                tasks[pos], nxt_tasks[head] = nxt_tasks[head], tasks[pos]
                head += 1
