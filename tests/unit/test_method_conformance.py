"""One conformance suite every registered method passes (river-style check_estimator), in-process over memcl_ops
objects: all four roles of the method (memory, SGSE, stage 1, head learner) driven the way the runner drives them.

Parametrized over every registered method with a head learner (`family_methods("features")`), so a method registered
later is covered without touching this file. (Methods that train inside the encoder, NSR's adapter loop, have no
`HeadLearner` to drive here.)
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch

from memcl_ops.data.datasets import SyntheticSpec, make_synthetic
from memcl_ops.data.streams import StreamSpec, make_plan
from memcl_ops.mars.dcda import train_stage1
from memcl_ops.mars.router import RouterConfig
from memcl_ops.mars.sgse import NoveltyMonitor
from memcl_ops.methods import MethodConfig, build_head, build_memory, family_methods, method_spec
from memcl_ops.training import OptimConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM, TASKS, BATCH = 16, 4, 32
DATA = make_synthetic(SyntheticSpec(classes=8, dim=DIM, train_per_class=40, test_per_class=20, separation=2.0))
PLAN = make_plan(DATA.train_y, DATA.test_y, DATA.num_classes, StreamSpec(tasks=TASKS, batch_size=BATCH))
TEST_X = torch.from_numpy(DATA.test_x)  # every class, including those of tasks not learned yet

_BASE = MethodConfig()
CONFIG = replace(  # small enough to run every method several times in seconds; the buffer fills and replaces
    _BASE, router=RouterConfig(initial_slots=4),
    stage1=replace(_BASE.stage1, optim=OptimConfig(epochs=2, batch_size=BATCH)),
    stage2=replace(_BASE.stage2, optim=OptimConfig(epochs=3, batch_size=BATCH)),
    derpp=replace(_BASE.derpp, buffer_size=30), analytic=replace(_BASE.analytic, expansion_dim=64))


def task_block(task: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = PLAN.visit_rows[task]
    return torch.from_numpy(DATA.train_x[rows]), torch.from_numpy(DATA.train_y[rows])


class LocalMethod:
    """A method's roles wired in-process like pipeline/runner.py: route + SGSE per batch, then at the task end
    stage 1 on the block, the head's fit on the block, and its end_task."""

    def __init__(self, name: str, seed: int = 0):
        self.spec = method_spec(name)
        self.config = self.spec.resolve(CONFIG)
        self.seed = seed
        self.memory = build_memory(self.spec, self.config, DIM, seed)
        self.monitor = NoveltyMonitor(self.config.sgse) if self.spec.sgse else None
        self.head = build_head(self.spec, CONFIG, DIM, seed)
        self.rounds = 0

    def learn_task(self, task: int) -> None:
        x, y = task_block(task)
        if self.memory is not None:
            with torch.no_grad():
                for batch in x.split(BATCH):
                    query, probs = self.memory.route(batch)
                    self.memory.update_anchor_stats(batch)
                    if self.monitor is not None:
                        for expansion in self.monitor.observe(probs.max(dim=1).values.numpy(), query.numpy(),
                                                              batch.numpy()):
                            self.memory.add_slot(expansion.key)
        if self.spec.stage1:
            train_stage1(self.memory, x, y, self.config.stage1, seed=self.seed * 100_003 + self.rounds)
            self.rounds += 1
        self.head.fit(x, y, self.memory)
        self.head.end_task(self.memory)

    def predict(self) -> np.ndarray:
        return self.head.predict(TEST_X, self.memory)

    def state(self) -> dict[str, np.ndarray]:
        out = {f"head/{k}": v for k, v in self.head.state().items()}
        if self.memory is not None:
            out.update({f"memory/{k}": v for k, v in self.memory.state().items()})
        if self.monitor is not None:
            out.update({f"monitor/{k}": v for k, v in self.monitor.state().items()})
        out["rounds"] = np.array(self.rounds)
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        def part(prefix: str) -> dict[str, np.ndarray]:
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        self.head.restore(part("head/"))
        if self.memory is not None:
            self.memory.load_state(part("memory/"))
        if self.monitor is not None:
            self.monitor.restore(part("monitor/"))
        self.rounds = int(state["rounds"])


def through_npz(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state as a checkpoint stores it: plain numpy arrays in an npz, no pickled objects."""
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


@dataclass
class Record:
    """What an uninterrupted run of a method left after each task."""

    predictions: list[np.ndarray] = field(default_factory=list)  # on TEST_X
    states: list[dict[str, np.ndarray]] = field(default_factory=list)  # every role, as a checkpoint stores it
    reported: list[dict[str, int]] = field(default_factory=list)  # head.memory_bytes()
    kept: list[int] = field(default_factory=list)  # bytes of the non-scalar arrays of the head's state


@functools.cache
def reference(name: str) -> Record:
    """One uninterrupted run per method, shared by the checks below (each would otherwise repeat it)."""
    method, record = LocalMethod(name), Record()
    for t in range(TASKS):
        method.learn_task(t)
        record.predictions.append(method.predict())
        record.states.append(through_npz(method.state()))
        record.reported.append(method.head.memory_bytes())
        record.kept.append(sum(np.asarray(v).nbytes for v in method.head.state().values() if np.ndim(v) > 0))
    return record


def continue_and_compare(method: LocalMethod, record: Record, first: int) -> None:
    """Learn tasks `first`.. and match the reference's predictions after each, and its state at the end."""
    for t in range(first, TASKS):
        method.learn_task(t)
        np.testing.assert_array_equal(method.predict(), record.predictions[t], err_msg=f"after task {t}")
    assert_same_state(through_npz(method.state()), record.states[-1])


ALL = pytest.mark.parametrize("name", family_methods("features"))


@ALL
def test_restored_learner_continues_exactly_like_the_uninterrupted_one(name):
    record = reference(name)
    restored = LocalMethod(name)
    restored.restore(record.states[1])
    np.testing.assert_array_equal(restored.predict(), record.predictions[1])
    continue_and_compare(restored, record, first=2)


@ALL
def test_two_runs_with_one_seed_are_identical(name):
    continue_and_compare(LocalMethod(name), reference(name), first=0)


@ALL
def test_predictions_name_only_classes_already_streamed(name):
    """Asked about test inputs of every class, including the classes of tasks to come, the learner may only
    answer with labels it has been given: a head pre-sized for the whole label set, or one fed labels ahead
    of the stream, would name a future class for those inputs."""
    seen: set[int] = set()
    for t, predictions in enumerate(reference(name).predictions):
        seen |= set(PLAN.classes[t])
        predicted = set(np.unique(predictions).tolist())
        assert predicted <= seen, f"after task {t} it predicts {sorted(predicted - seen)}, not streamed yet"
        on_seen = np.isin(DATA.test_y, sorted(seen))
        accuracy = float((predictions[on_seen] == DATA.test_y[on_seen]).mean())
        assert accuracy > 1.5 / len(seen), f"after task {t}: accuracy {accuracy:.2f} on seen classes is near chance"


@ALL
def test_persistent_memory_bytes_are_every_array_it_keeps(name):
    """`memory_bytes` must account for everything the learner persists: the byte size of the non-scalar
    arrays of its state (scalars are bookkeeping such as fit counters)."""
    record = reference(name)
    for t, (reported, kept) in enumerate(zip(record.reported, record.kept, strict=True)):
        assert all(isinstance(v, int) and v >= 0 for v in reported.values()), reported
        assert sum(reported.values()) == kept, f"after task {t}: reported {reported}, state holds {kept} bytes"
        assert kept > 0
