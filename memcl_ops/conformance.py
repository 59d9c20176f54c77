"""An importable conformance check for a `StreamLearner` (memcl_ops/learner.py), in the spirit of river's
`check_estimator`: `check_learner(make, stream)` streams `stream` through learners `make()` builds and runs the
checks the learner's tags (memcl_ops/methods.py, TAGS) select; a failed check raises `AssertionError` whose message
starts with the check's name. The checks:

* ``npz``: every state after a round is plain arrays that survive an npz round trip with `allow_pickle=False`
  exactly (keys, dtypes, values), as pipeline/checkpoint.py stores it;
* ``restore``: a fresh learner restored from the state after a middle round predicts what the original predicted
  then, and continues bit for bit: the same predictions after every later round and the same final state
  (skipped for ``learns-nothing``);
* ``seed``: a second run from `make()` is identical to the first (predictions and states after every round);
* ``memory-bytes``: `memory_bytes()` adds up, after every round, to the bytes of the non-scalar arrays of the state
  (`memcl_ops.tensors.array_bytes`: text as UTF-8; 0-d values are bookkeeping). So everything a learner
  checkpoints is reported, trained weights (LoRA factors, heads) included, each learner naming its parts
  (skipped for ``learns-nothing``);
* ``classes`` (classifiers, i.e. not ``generative``): no prediction names a class the stream has not trained on yet
  (-1, "no class", is allowed), and accuracy on the probe rows of seen classes beats `margin` times chance.

After each round the learner answers the stream's probe batches: all of them, future classes included, for a
``task-free`` learner; only those of the tasks trained so far for a task-aware one (it needs each row's task).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round, StreamLearner
from memcl_ops.tensors import array_bytes

Prediction = np.ndarray | list[str]


@dataclass(frozen=True)
class Visit:
    """One round of a stream: what `begin_round` is told and the training batches `observe` gets, in order."""

    round: Round
    batches: tuple[pa.RecordBatch, ...]


@dataclass(frozen=True)
class Stream:
    rounds: tuple[Visit, ...]  # at least two (one to restore after, one to continue with)
    probes: tuple[pa.RecordBatch, ...]  # labelled batches (task column set for task-aware learners)


@dataclass
class Report:
    ran: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why


@dataclass
class Trace:
    """What one run left after each round."""

    predictions: list[list[Prediction]] = field(default_factory=list)
    states: list[dict[str, np.ndarray]] = field(default_factory=list)  # through npz
    reported: list[dict[str, int]] = field(default_factory=list)


def check_learner(make: Callable[[], StreamLearner], stream: Stream, *, margin: float = 1.5) -> Report:
    """Run every check `make()`'s tags select over `stream`; raises AssertionError naming the failed check."""
    if len(stream.rounds) < 2:
        raise ValueError("a conformance stream needs at least two rounds")
    report = Report()
    first = make()
    tags = first.tags
    reference = _trace(first, stream)
    report.ran.append("npz")
    if "learns-nothing" in tags:
        report.skipped.update(restore="learns nothing", **{"memory-bytes": "learns nothing"})
    else:
        _check_restore(make, stream, reference)
        _check_memory_bytes(reference)
        report.ran += ["restore", "memory-bytes"]
    second = _trace(make(), stream)
    for r in range(len(stream.rounds)):
        _same("seed", f"predictions after round {r}", second.predictions[r], reference.predictions[r])
        _same_state("seed", f"state after round {r}", second.states[r], reference.states[r])
    report.ran.append("seed")
    if "generative" in tags:
        report.skipped["classes"] = "generative: answers are text, not class labels"
    elif "input-blind" in tags:
        report.skipped["classes"] = "input-blind: it never reads the input"
    else:
        _check_classes(stream, reference, "task-free" not in tags, margin)
        report.ran.append("classes")
    return report


def _fail(check: str, message: str) -> AssertionError:
    return AssertionError(f"{check}: {message}")


def _due(stream: Stream, r: int, task_aware: bool) -> list[pa.RecordBatch]:
    """The probes asked after round `r`."""
    if not task_aware:
        return list(stream.probes)
    seen = {v.round.task for v in stream.rounds[:r + 1]}
    return [p for p in stream.probes if set(S.task_ids_to_numpy(p).tolist()) <= seen]


def _play(learner: StreamLearner, stream: Stream, first: int) -> Iterator[tuple[int, list[Prediction]]]:
    """Stream rounds `first`.., yielding the predictions on the due probes after each."""
    task_aware = "task-free" not in learner.tags
    for r in range(first, len(stream.rounds)):
        visit = stream.rounds[r]
        learner.begin_round(visit.round)
        for batch in visit.batches:
            learner.observe(batch)
        learner.consolidate()
        yield r, [learner.predict(p) for p in _due(stream, r, task_aware)]


def _trace(learner: StreamLearner, stream: Stream) -> Trace:
    trace = Trace()
    for r, predictions in _play(learner, stream, 0):
        trace.predictions.append(predictions)
        trace.states.append(_through_npz(learner.state(), r))
        trace.reported.append(learner.memory_bytes())
    return trace


def _through_npz(state: dict[str, np.ndarray], r: int) -> dict[str, np.ndarray]:
    """The state as a checkpoint stores and reads it back; it must come back exactly."""
    for k, v in state.items():
        if not isinstance(v, np.ndarray) or v.dtype.kind == "O":
            raise _fail("npz", f"after round {r}, {k!r} is {type(v).__name__} "
                               f"{getattr(v, 'dtype', '')}, not a plain numpy array")
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as z:
        back = {k: z[k] for k in z.files}
    _same_state("npz", f"state after round {r}", back, state)
    return back


def _same(check: str, what: str, got: list[Prediction], want: list[Prediction]) -> None:
    if len(got) != len(want):
        raise _fail(check, f"{what}: {len(got)} probe answers, expected {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        if isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)):
                raise _fail(check, f"{what}, probe {i}: {np.asarray(a)[:8]} != {b[:8]}")
        elif list(a) != list(b):
            raise _fail(check, f"{what}, probe {i}: {list(a)[:4]} != {list(b)[:4]}")


def _same_state(check: str, what: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    if got.keys() != want.keys():
        raise _fail(check, f"{what}: keys differ by {sorted(got.keys() ^ want.keys())[:6]}")
    for k in want:
        a, b = np.asarray(got[k]), np.asarray(want[k])
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            raise _fail(check, f"{what}: {k!r} differs ({a.dtype}{a.shape} vs {b.dtype}{b.shape})")


def _check_restore(make: Callable[[], StreamLearner], stream: Stream, reference: Trace) -> None:
    k = (len(stream.rounds) - 1) // 2
    learner = make()
    learner.restore(reference.states[k])
    _same("restore", f"predictions right after restoring the state after round {k}",
          [learner.predict(p) for p in _due(stream, k, "task-free" not in learner.tags)], reference.predictions[k])
    for r, predictions in _play(learner, stream, k + 1):
        _same("restore", f"predictions after round {r}", predictions, reference.predictions[r])
    _same_state("restore", "final state", _through_npz(learner.state(), len(stream.rounds) - 1), reference.states[-1])


def _check_memory_bytes(reference: Trace) -> None:
    for r, (reported, state) in enumerate(zip(reference.reported, reference.states)):
        if not all(isinstance(v, int) and v >= 0 for v in reported.values()):
            raise _fail("memory-bytes", f"after round {r}: {reported} are not non-negative ints")
        kept = array_bytes(state)
        if sum(reported.values()) != kept or not kept:
            raise _fail("memory-bytes", f"after round {r}: reported {reported} (sum {sum(reported.values())}), "
                                        f"the state holds {kept} bytes in arrays")


def _check_classes(stream: Stream, reference: Trace, task_aware: bool, margin: float) -> None:
    seen: set[int] = set()
    task_classes: dict[int, int] = {}  # task -> its number of classes (the chance level of a task-aware answer)
    for r, visit in enumerate(stream.rounds):
        seen |= {int(y) for b in visit.batches for y in S.labels_to_numpy(b) if y >= 0}
        if visit.round.task is not None and visit.round.classes:
            task_classes[visit.round.task] = len(visit.round.classes)
        probes = _due(stream, r, task_aware)
        predicted = np.concatenate([np.asarray(p) for p in reference.predictions[r]])
        labels = np.concatenate([S.labels_to_numpy(p) for p in probes])
        future = sorted(set(predicted.tolist()) - seen - {-1})
        if future:
            raise _fail("classes", f"after round {r} it predicts {future}, not streamed yet")
        on_seen = np.isin(labels, sorted(seen))
        if not on_seen.any():
            raise _fail("classes", f"after round {r} no probe row is of a class seen so far")
        if task_aware:
            tasks = np.concatenate([S.task_ids_to_numpy(p) for p in probes])[on_seen]
            chance = float(np.mean([1 / task_classes[int(t)] for t in tasks]))
        else:
            chance = 1 / len(seen)
        accuracy = float((predicted[on_seen] == labels[on_seen]).mean())
        if not accuracy > margin * chance:
            raise _fail("classes", f"after round {r}: accuracy {accuracy:.2f} on seen classes is not above "
                                   f"{margin} x chance ({chance:.2f})")
