"""What the runner (pipeline/runner.py) and each family's pipeline (features.py, nsr.py, lm.py) share: the run
state a round folds into, a round's outcome, the roles' actors of one run, starting Ray and the stream source.
Its own module so that the runner can import the pipelines and they these parts, with no import circle."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import ray
from ray import exceptions as rex

from memcl.actors.stream_source import StreamSource
from memcl.pipeline import auth, checkpoint
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import ConfigError, RunConfig, RuntimeConfig
from memcl.pipeline.journal import Journal
from memcl.pipeline.local import LocalActors
from memcl.pipeline.progress import Reports
from memcl_ops import metrics as M
from memcl_ops.data.sources import StreamInfo
from memcl_ops.methods import method_spec
from memcl_ops.prequential import Tally
from memcl_ops.roles.executor import Executor
from memcl_ops.rounds import RoundBatches

BatchHook = Callable[[int, int], None]  # called with (visit, batch index) after each batch is submitted


def ensure_ray(config) -> None:
    """Join `runtime.address` (or RAY_ADDRESS), or start Ray in-process; reuse a session already started."""
    if ray.is_initialized():
        return
    rt = config.runtime
    address = rt.address or os.environ.get("RAY_ADDRESS")
    tokens = auth.token_on()
    # The actors' own output (library prints, warnings, an actor's traceback) stays in Ray's session logs
    # (/tmp/ray/session_latest/logs): on the terminal it would break the progress bars, and an actor's error
    # reaches the driver as the exception it raised.
    if address:
        auth.check_token(address)  # a refused token in one line at once, before Ray's retries
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as err:
            refused = auth.refusal(err, address)
            if refused is None:
                raise
            raise refused from err
    else:
        if tokens:
            auth.ensure_local_token()
        # "local": a Ray of its own, never whichever cluster was started last on this machine (plain ray.init joins
        # the one /tmp/ray/ray_current_cluster names: a stale address, or someone else's cluster)
        ray.init(address="local", num_cpus=rt.num_cpus, include_dashboard=False,
                 object_store_memory=rt.object_store_mb * 2**20,
                 logging_level=logging.WARNING, log_to_driver=False)


@dataclass
class RunState:
    """The runner's own checkpointed progress. What grows with the run (the round log, the accuracy matrix's rows,
    the anytime rows, the prequential curve) is appended to the run folder's journal (pipeline/journal.py) at each
    commit; the state holds how many records each stream has, so a checkpoint stays one size."""

    next_round: int = 0
    seen_tasks: list[int] = field(default_factory=list)  # in order of first training
    wall: dict[str, float] = field(default_factory=dict)  # driver wall time per phase
    refused: dict[str, int] = field(default_factory=dict)  # dead-lettered training rows per reason
    refused_test: dict[str, int] = field(default_factory=dict)  # distinct dead-lettered test rows per reason
    refused_origins: dict[str, int] = field(default_factory=dict)  # dead-lettered rows per file (or stream)
    # the test rows refused so far ("origin:position:sample_id"): each evaluation reads its test rows again
    refused_test_rows: list[str] = field(default_factory=list)
    # the test-then-train figures so far (memcl_ops/prequential.py, Tally; its curve is in the journal)
    prequential: dict = field(default_factory=lambda: dataclasses.asdict(Tally()))
    realtime: dict | None = None  # the stream's clock (memcl_ops/realtime.py, StreamClock); None: not started
    recoveries: int = 0  # rounds replayed after an actor fault
    elapsed: float = 0.0  # driver wall time up to the last commit, over every session of a resumed run
    journal: dict[str, int] = field(default_factory=dict)  # records committed per journal stream
    last_log: dict | None = None  # the last committed round's log entry (what observers read)
    store: Journal | None = field(default=None, repr=False, compare=False)  # where the journal is (not saved)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "store"}

    def add_wall(self, phase: str, seconds: float) -> None:
        self.wall[phase] = self.wall.get(phase, 0.0) + seconds

    def append(self, stream: str, records: list) -> None:
        """Records of a committed round at the end of a journal stream."""
        self.store.append(stream, records)
        self.journal[stream] = self.journal.get(stream, 0) + len(records)

    def records(self, stream: str) -> list:
        """Every committed record of a journal stream (read from the run folder)."""
        return self.store.read(stream) if self.store is not None else []

    def count(self, stream: str) -> int:
        return self.journal.get(stream, 0)


@dataclass
class RoundOutcome:
    """What one streamed round produced; the runner folds it into the RunState once the round has completed."""

    accuracy: dict[int, float]  # per task evaluated after the round
    seen: list[int]  # every task trained so far, in order of first training
    ended: list[int]  # the visits this round ended (with boundaries, one accuracy-matrix row each)
    batches: int
    dead: pa.Table | None  # refused rows (train and test), with their sample_id and reason
    seconds: dict[str, float]  # driver wall time per phase
    log: dict = field(default_factory=dict)  # the family's report of the round (consolidation, arrival, ...)
    # the round's training rows predicted before they were learned (memcl_ops/prequential.py, PREDICTIONS); None:
    # the family predicts none
    predictions: pa.Table | None = None
    clock: dict | None = None  # the stream's clock after the round (memcl_ops/realtime.py); None: the family has none


@dataclass(frozen=True)
class Samples:
    """Exactly-once accounting of a run's training rows by sample_id."""

    stream: int  # rows the stream holds
    learned: int  # rows trained on (a replayed round counts once)
    unique_learned: int
    refused: int  # training rows refused at a gate, kept as dead letters
    refused_by_reason: dict[str, int]
    refused_test: int = 0  # distinct test rows refused (each evaluation reads them again; counted once)
    refused_test_by_reason: dict[str, int] = field(default_factory=dict)
    refused_by_origin: dict[str, int] = field(default_factory=dict)  # training and test rows per file (or stream)
    predicted_unlabelled: int = 0  # training rows without a label: predicted (predictions/), never learned


@dataclass(frozen=True)
class RunResult:
    """A finished run: its folder, summary (None while an entry it needs is missing), sample accounting and fault
    replays, typed; `metrics` is everything metrics.json holds (the family's entries included)."""

    run_dir: Path
    summary: M.Summary | None
    samples: Samples
    recoveries: int
    metrics: dict

    @property
    def matrix(self) -> np.ndarray:
        """The accuracy matrix: a row per visit ended (task-free: per evaluation point), a column per task."""
        return np.array(self.metrics["acc_matrix"], dtype=float)

    @classmethod
    def of(cls, run_dir: Path, metrics: dict) -> RunResult:
        samples = metrics["samples"]
        return cls(run_dir, M.Summary(**metrics["summary"]) if metrics["summary"] else None,
                   Samples(**samples),
                   metrics["recoveries"], metrics)


class Roles:
    """The stateful roles of one pipeline by name, as actors (`ActorCache`) or held in this process (`LocalActors`):
    their states, restore, revival after a fault, timings. `x` calls them."""

    def __init__(self, actors: ActorCache | LocalActors, names: list[str], stateless: tuple[str, ...] = (),
                 copies: dict[str, str] | None = None):
        self.actors, self.names = actors, names
        self.stateless = stateless  # roles without state worth checkpointing (encoders): only timed
        # roles whose state is another role's (data-parallel workers: worker 0's; a trainer: the predictor's copy of
        # its head): not checkpointed, restored from it
        self.copies = copies or {}
        self.x = actors.executor(self.handle)

    def handle(self, role: str) -> object | None:
        return self.actors.handle(role) if role in self.names or role in self.stateless else None

    def state(self) -> dict[str, checkpoint.State]:
        own = [r for r in self.names if r not in self.copies]
        return dict(zip(own, self.x.get([self.x.call(r, "state") for r in own])))

    def _part(self, parts: dict[str, checkpoint.State], role: str) -> checkpoint.State:
        return parts.get(self.copies.get(role, role), {})

    def all_names(self) -> list[str]:
        return [*self.names, *self.stateless]

    def restore(self, parts: dict[str, checkpoint.State] | None) -> None:
        """Every role to `parts`; None: the construction state the roles were just reset to, nothing to restore."""
        if parts is None:
            return
        # a role with an empty state (the frozen LM) leaves no arrays in a checkpoint
        self.x.get([self.x.call(r, "restore", self._part(parts, r)) for r in self.names])

    def resume(self, parts: dict[str, checkpoint.State], path: Path) -> None:
        """`restore` from the checkpoint at `path`, role by role: a state that lacks a key the role reads was
        written by an older memcl, and says so in one line."""
        for role in self.names:
            try:
                self.x.get(self.x.call(role, "restore", self._part(parts, role)))
            except KeyError as err:  # an actor's RayTaskError is also an instance of its cause's class
                cause = err.cause if isinstance(err, rex.RayTaskError) else err
                raise ConfigError(f"{path}: written by an older memcl (the {role} state lacks "
                                  f"{cause.args[0] if cause.args else ''!r}); it cannot be resumed, start a new run"
                                  ) from err

    def revive(self) -> None:
        self.actors.revive(self.names)

    def incarnations(self) -> dict[str, str]:
        return self.actors.incarnations(self.names)

    def placement(self) -> dict[str, dict]:
        """Where each role's actor runs now: its node, the Ray resources it holds and the device it computes on."""
        return self.actors.placement(self.all_names())

    def timings(self) -> dict[str, dict]:
        names = self.all_names()
        return dict(zip(names, self.x.get([self.x.call(r, "timings") for r in names])))


@dataclass
class RoundEnd:
    """What a family's consolidation at a round's end gives the loop."""

    log: dict  # the family's report of the round (its round-log entry)
    predictions: pa.Table | None = None  # the round's test-then-train predictions (memcl_ops/prequential.py)
    clock: dict | None = None  # the stream's clock after the round (memcl_ops/realtime.py)


class StreamPipeline(Protocol):
    """The roles of one run, wired for one method family. The round loop (pipeline/loop.py `stream_round`) is the
    same for every family; a family supplies its steps: what a round's start, each of its training batches and its
    end do, and how a task is evaluated."""

    info: StreamInfo
    roles: Roles
    x: Executor  # how the family's roles are called (actors, or objects of this process)
    runtime: RuntimeConfig
    task_free: bool  # one accuracy row per evaluation point (round) instead of one per visit ended
    # whether the stream is whole: every family's is from its start, except a followed folder until it ends
    ended: bool

    def plan(self) -> list[RoundBatches]: ...  # the rounds planned so far (all of them once the stream has ended)

    def begin_round(self, batches: RoundBatches, state: RunState, reports: Reports) -> None: ...

    # submit one training batch (visit, index); returns the handle that bounds the calls in flight (None: nothing)
    def observe(self, visit: int, index: int, letters: list) -> Any: ...

    # the round's end: its consolidation (`final`: the stream's last round)
    def end_round(self, state: RunState, reports: Reports, *, final: bool) -> RoundEnd: ...

    def visit_tasks(self, visits: list[int]) -> list[list[int]]: ...  # the tasks each visit trains

    # accuracy per task on its test data as of `after_visit` (refused test rows join `letters`)
    def evaluate(self, tasks: list[int], after_visit: int, letters: list, reports: Reports) -> dict[int, float]: ...

    # every role alive again, restored to parts (None: to the state the roles were constructed in)
    def revive(self, parts: dict[str, checkpoint.State] | None) -> None: ...

    def memory_report(self) -> dict[str, int]: ...

    # (rows trained on, distinct sample ids among them), for exactly-once accounting
    def learned_counts(self) -> tuple[int, int]: ...

    def finish(self, state: RunState) -> dict: ...  # the family's entries of metrics.json

    # optional, for a family whose test-then-train figures are not the loop's tally of predicted classes (the LM's
    # scores of generated answers): prequential_curve(state) -> the curve so far, a point per committed round
    # optional, for a family whose stream may not have ended (a followed folder): follow(wait) takes what has landed,
    # and with `wait` waits until something has or the stream ends

    def close(self) -> None: ...  # release what the pipeline holds besides its actors (a compiled graph)


def round_label(pipe: StreamPipeline, batches: RoundBatches) -> str:
    """How progress bars name a round: its task and visit, or the visits it spans."""
    info, first, last = pipe.info, batches[0][0], batches[-1][0]
    if first == last:
        return f"task {info.visits[first] + 1}/{len(info.task_classes)} (visit {first + 1}/{len(info.visits)})"
    return f"visits {first + 1}-{last + 1}/{len(info.visits)}"


def stream_source(config: RunConfig, actors: ActorCache) -> ray.actor.ActorHandle:
    rt = config.runtime
    # the "features" family predicts unlabelled training rows (and learns the others); NSR refuses them
    unlabelled = method_spec(config.method.name).family == "features"
    return actors.get("source", StreamSource, rt.actor_options("source"), config.data,
                      config.stream, rt.max_batch_rows, unlabelled, config.method, config.seed)


