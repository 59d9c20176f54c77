"""The streams `memcl bench` compares methods on. Plain data (no Ray, no torch), so the command line can list
them cheaply; each is a set of dotted overrides of the embedded default `RunConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Suite:
    name: str
    summary: str
    overrides: dict[str, object] = field(default_factory=dict)  # dotted keys over the embedded RunConfig
    methods: tuple[str, ...] | None = None  # None: every registered method that can run the stream


SUITES: dict[str, Suite] = {s.name: s for s in [
    # Half the `memcl run` default's training images (600 instead of 1200 per class): DCDA stage 1 dominates the
    # time, and four MARS variants x 3 seeds at 1200 per class do not fit the suite's 15 minutes on 2 cores.
    Suite("fmnist-5x2", "Fashion-MNIST, 5 tasks x 2 classes, EfficientNet-Lite0 at 64 px, 600 train / 300 test "
          "images per class", {"stream.train_per_class": 600}),
    Suite("digits-mnist-fmnist", "three 10-class datasets as three tasks (scikit-learn digits, MNIST subset, "
          "Fashion-MNIST): a 30-class domain-and-class shift; EfficientNet-Lite0 at 64 px, up to 200 train / "
          "100 test images per class (digits has 135 / 45)",
          {"data.dataset": "digits-mnist-fmnist", "stream.tasks": 3, "stream.shuffle_classes": False,
           "stream.train_per_class": 200, "stream.test_per_class": 100}),
    Suite("bbc-text", "BBC News (5 topics) with MiniLM-L6 sentence features: 2 topics, then one topic per task",
          {"data.dataset": "bbc-news", "encoder.spec.name": "minilm", "stream.tasks": 4,
           "stream.first_task_classes": 2, "stream.train_per_class": None, "stream.test_per_class": None}),
    # separation 0.6 (class-mean std, noise std 1) keeps the 40 classes overlapping: with the drift generator's
    # default 4.0 every method that remembers at all scores 100 % and the table says nothing.
    Suite("synthetic-drift", "generated 32-d features, 20 tasks x 2 classes (class-mean std 0.6, noise std 1), "
          "every class mean drifting (random walk) and 5 abrupt shifts; old classes are tested where their means "
          "have drifted to",
          {"data.dataset": "drift", "data.drift.visits": 20, "data.drift.tasks": 20, "data.drift.recurrence": 0.0,
           "data.drift.separation": 0.6, "data.drift.train_per_visit": 400, "data.drift.test_per_task": 200}),
    # real drift: tasks return (half the visits after the first of each) and three times a returning task's two
    # labels trade places; the headline is the model at the end, so a head that keeps the old concept pays for it
    Suite("real-drift", "generated 32-d features, 6 tasks x 2 classes over 30 visits, tasks returning, three "
          "concept changes (a returning task's labels swapped), slow drift of every class mean; tested where the "
          "classes are and as they are labelled at the end",
          {"data.dataset": "drift", "data.drift.visits": 30, "data.drift.tasks": 6, "data.drift.recurrence": 0.5,
           "data.drift.separation": 2.0, "data.drift.shifts": 0, "data.drift.concept_changes": 3,
           "data.drift.train_per_visit": 400, "data.drift.test_per_task": 200}),
]}


def suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown bench suite {name!r}; known: {sorted(SUITES)}") from None
