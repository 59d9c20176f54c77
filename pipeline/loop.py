"""The round loop every run goes through (`memcl.pipeline.runner.run` starts it for each family): a family's pipeline
(pipeline/features.py, pipeline/nsr.py, pipeline/lm.py) streams one round at a time, and the loop does what every
run needs:

* rounds: a visit of a task, or K batches when task-free (`plan_rounds`), each streamed by the family's pipeline
  with a bound on the calls in flight; a stream that grows while it runs (`stream.follow`) is planned a round at a
  time, the loop waiting for its batches until the stream ends (`stream.idle_timeout_s`) or is stopped;
* fault replay: if an actor dies during any step that calls the actors (the start, a resume, a round, its
  commit's memory report and state, the observers, the run's report, a revival itself), every actor is brought
  back (Ray restarts it, or a new one is started), all are restored to the last committed state and the step is
  replayed, so each sample is learned exactly once and the result equals an uninterrupted run;
* commit: the accuracy matrix (a row per visit ended; task-free: per evaluation point), dead letters
  (`dead_letters/*.parquet`, rows that broke the Arrow contract, with their sample_id), the round log, wall time
  per phase;
* atomic checkpoints of every actor and of the run state after each round, and `--resume` from the last one;
* the run folder: metrics.json and the report files.

A round changes nothing of the run state (`RunState`) until it has completed; that is what makes it replayable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from memcl.pipeline import checkpoint, report, run_folder
from memcl.pipeline.actor_cache import ActorRestarted, is_fault
from memcl.pipeline.chaos import Chaos
from memcl.pipeline.config import ConfigError, RuntimeConfig
from memcl.pipeline.errors import RunStopped
from memcl.pipeline.journal import Journal
from memcl.pipeline.progress import InFlight, Progress, Reports
from memcl.pipeline.roles import BatchHook, RoundOutcome, RunResult, RunState, StreamPipeline, round_label
from memcl.pipeline.tracking import TensorBoardLog
from memcl_ops import files
from memcl_ops import metrics as M
from memcl_ops.arrow import schema as S
from memcl_ops.data.sources import StreamInfo
from memcl_ops.prequential import PrequentialConfig, Tally, labelled, unlabelled
from memcl_ops.rounds import RoundBatches, Schedule, matrix_rows, seen_after

log = logging.getLogger("memcl")

RoundHook = Callable[[int, "RunState", "StreamPipeline"], None]  # called after each round is committed
PhaseHook = Callable[[str], None]  # called as each step of the run begins (`Reports.phase`)
T = TypeVar("T")


def new_run_dir(out: str, name: str) -> Path:
    base = Path(out) / f"{time.strftime('%Y%m%d-%H%M%S')}-{name.replace(':', '_').replace('/', '_')}"
    path, n = base, 1
    while True:
        try:
            return run_folder.create(path)  # with the marker that lets `memcl runs clean` remove it
        except FileExistsError:
            path, n = base.with_name(f"{base.name}-{n}"), n + 1


def discard_unstarted(run_dir: Path | None) -> None:
    """Remove a run folder this call created when the run failed before committing anything (no checkpoint, no
    metrics): it would hold only config.yaml, a run that never was."""
    if run_dir is not None and run_dir.is_dir() and not any(run_dir.rglob("ckpt-*")) and not any(
            run_dir.rglob("metrics.json")):
        shutil.rmtree(run_dir, ignore_errors=True)


class Recovery:
    """Every step of a run that calls its actors goes through `run`: where an actor fault interrupts the step, every
    role is revived and restored to the last committed state (`last_good`; None before the first: the actors'
    construction state) and the step runs again from there. An actor Ray restarted between two calls fails none of
    them but has lost its state: each step ends by checking that every role is still the process it was (and so does
    a step that fails with an error of its own, which a role's lost state may have caused), and a restart found
    there is a fault of the step. A fault while reviving is one more fault of the step;
    `runtime.max_recoveries` faults in a row of one step end the run (RunStopped, its checkpoint kept)."""

    def __init__(self, pipe: StreamPipeline, state: RunState, rt: RuntimeConfig, run_dir: Path, reports: Reports):
        self.pipe, self.state, self.rt, self.run_dir, self.reports = pipe, state, rt, run_dir, reports
        self.last_good: dict[str, checkpoint.State] | None = None
        self.incarnations: dict[str, str] | None = None  # each role's process since the last revival

    def run(self, what: str, step: Callable[[], T]) -> T:
        faults, revive = 0, False
        while True:
            try:
                if revive:
                    self.reports.phase("restore")
                    t_revive = time.perf_counter()
                    self.pipe.revive(self.last_good)
                    seconds = time.perf_counter() - t_revive
                    self.state.add_wall("recovery", seconds)
                    log.info("revived every role in %.1f s", seconds)
                    self.incarnations, revive = None, False
                if self.incarnations is None:
                    self.incarnations = self.pipe.roles.incarnations()
                result = step()
                self._check_incarnations()
                return result
            except Exception as err:
                if not is_fault(err):
                    restarted = self._restarted()
                    if restarted is None:
                        raise
                    err = restarted  # the error came from a role that had lost its state: the restart is the fault
                faults += 1
                role = self.pipe.roles.actors.role_of(err)
                where = f"the {role} actor" if role else "an actor"
                if faults > self.rt.max_recoveries:
                    raise RunStopped(f"{what}: {faults} actor faults in a row (runtime.max_recoveries = "
                                     f"{self.rt.max_recoveries}), the last in {where} ({type(err).__name__})",
                                     self.run_dir) from err
                log.warning("actor fault in %s (%s, %s); restoring the last committed state and replaying", what,
                            where, type(err).__name__)
                self.state.recoveries += 1
                revive = True

    def _check_incarnations(self) -> None:
        now = self.pipe.roles.incarnations()
        restarted = [role for role, token in now.items() if self.incarnations.get(role) != token]
        if restarted:
            raise ActorRestarted(restarted[0])

    def _restarted(self) -> Exception | None:
        """After a step raised an error that is no actor fault: the fault behind it if a role was restarted since the
        step began (its state lost, the step computed on a mix of states), else None."""
        if self.incarnations is None:
            return None
        try:
            self._check_incarnations()
        except Exception as err:
            return err if is_fault(err) else None
        return None


def stream(pipe: StreamPipeline, run_dir: Path, resumed: bool, rt: RuntimeConfig, bars: Progress, metrics: dict, *,
           started: float, setup_wall: dict[str, float] | None = None, on_batch: BatchHook | None = None,
           on_round: RoundHook | None = None, on_phase: PhaseHook | None = None) -> RunResult:
    """Stream every round of `pipe` (after the last checkpoint of `run_dir` when `resumed`), then write the run's
    metrics: `metrics` (what the caller knows: method, seed, ...) with the runner's and the family's. With
    `runtime.chaos_seconds`, an actor of the run is killed every that many seconds while it streams."""
    state = RunState()
    # the trainers report epochs through it
    reports = Reports(bars, keep_losses=rt.tensorboard, on_phase=on_phase, local=pipe.roles.actors.local)
    recovery = Recovery(pipe, state, rt, run_dir, reports)
    ckpt_dir = run_dir / "checkpoints"
    found = checkpoint.latest_valid(ckpt_dir) if resumed else None
    if resumed and found is None:
        bars.say(f"memcl: {run_dir} has no complete checkpoint yet: the run starts from its beginning")
    if found is not None:
        path, parts, meta = found
        unknown = meta.keys() - RunState.__dataclass_fields__.keys()
        if unknown or parts.keys() - set(pipe.roles.names):
            raise ConfigError(f"{path}: written by an older memcl (run state {sorted(unknown)}, roles "
                              f"{sorted(parts)}); it cannot be resumed, start a new run")
        state = recovery.state = RunState(**meta)  # before the resume: a fault there counts among its recoveries
        recovery.run("the resume", lambda: pipe.roles.resume(parts, path))
        recovery.last_good = parts
        if not pipe.ended:  # the driver's plan over the files the checkpoint took, and what landed since
            recovery.run("following the stream", partial(pipe.follow, wait=False))
        rounds = pipe.plan()
        done = (f"{state.next_round} of {len(rounds)} rounds done" if pipe.ended
                else f"{state.next_round} done, following the folder for more")
        bars.say(f"memcl: resuming {run_dir} after {_round_name(pipe, rounds, state.next_round - 1)} ({done}), "
                 f"from {path.name}")
    state.store = Journal(run_dir)
    state.store.cut(state.journal)  # what a killed run appended after its last checkpoint goes
    for phase, seconds in (setup_wall or {}).items():  # before the stream: actor starts, the feature cache's encoding
        if seconds:
            state.add_wall(phase, seconds)
    earlier = state.elapsed  # the sessions before this one (a resumed run's total counts them, as its phases do)
    board = TensorBoardLog(run_dir) if rt.tensorboard else None
    chaos = (Chaos(pipe.roles.actors, pipe.roles.all_names, rt.chaos_seconds, metrics.get("seed", 0))
             if rt.chaos_seconds else contextlib.nullcontext())
    with chaos:
        reports.phase("start")
        recovery.last_good = recovery.run("the start", pipe.roles.state)  # what a fault rolls every actor back to

        def round_step(rounds: list[RoundBatches], r: int
                       ) -> tuple[RoundOutcome, dict[str, int], dict[str, checkpoint.State]]:
            outcome = stream_round(pipe, rounds, r, state, reports, on_batch)
            reports.phase("commit")
            return outcome, pipe.memory_report(), pipe.roles.state()

        r = state.next_round
        while (rounds := _plan_through(pipe, r, recovery)) is not None:
            outcome, memory, committed = recovery.run(f"round {r}", partial(round_step, rounds, r))
            _commit_round(pipe, state, r, outcome, memory, run_dir, rt.prequential, rt.anytime > 0,
                          set(pipe.info.late_labels))  # read each round: a followed folder's label files add to them
            state.elapsed = earlier + time.perf_counter() - started
            recovery.last_good = committed
            reports.phase("checkpoint")
            if rt.checkpoint:
                t_ckpt = time.perf_counter()
                checkpoint.write(ckpt_dir, r, committed, state.to_json())
                state.add_wall("checkpoint", time.perf_counter() - t_ckpt)
            if on_round is not None:
                recovery.run(f"the observers of round {r}", partial(on_round, r, state, pipe))
            if board is not None:
                board.round(state, pipe.prequential_curve(state) if hasattr(pipe, "prequential_curve")
                            else state.records("curve")[-1:])
            r += 1
        reports.phase("report")
        metrics.update(recovery.run("the run's report", lambda: {
            **_run_metrics(pipe, state, earlier + time.perf_counter() - started, rt),
            **pipe.finish(state)}))
    reports.close()
    if isinstance(chaos, Chaos):
        metrics["chaos"] = chaos.report()
    report.write_run(run_dir, metrics)
    if board is not None:
        board.close(metrics)
    metrics["run_dir"] = str(run_dir)
    return RunResult.of(run_dir, metrics)


def _plan_through(pipe: StreamPipeline, r: int, recovery: Recovery) -> list[RoundBatches] | None:
    """The rounds planned up to round r at least, or None once the stream has ended before it. A stream that may
    still grow (a followed folder) first takes what has landed, and while round r is not planned yet waits for more
    or for its end (`pipe.follow`)."""
    rounds = pipe.plan()
    while not pipe.ended:
        planned = r < len(rounds)
        recovery.run("following the stream", partial(pipe.follow, wait=not planned))
        rounds = pipe.plan()
        if planned or r < len(rounds):
            break
    return rounds if r < len(rounds) else None


def stream_round(pipe: StreamPipeline, rounds: list[RoundBatches], r: int, state: RunState, reports: Reports,
                 on_batch: BatchHook | None) -> RoundOutcome:
    """One round, the same for every family: each training batch observed (at most `runtime.max_in_flight` calls
    outstanding), the round's end consolidated, then the tasks due at this evaluation point evaluated (`Schedule`:
    after the visits the round ends; task-free, every `evaluate_every`-th round). `rounds`: the plan so far, which
    holds the stream's last round only once the stream has ended (`pipe.ended`)."""
    rt, info, batches = pipe.runtime, pipe.info, rounds[r]
    final = pipe.ended and r == len(rounds) - 1
    letters: list = []
    started = time.perf_counter()
    pipe.begin_round(batches, state, reports)
    in_flight = InFlight(rt.max_in_flight, reports.progress.bar(f"{round_label(pipe, batches)} stream", len(batches)),
                         pipe.x.get)
    for v, i in batches:
        in_flight.add(pipe.observe(v, i, letters))
        if on_batch is not None:
            on_batch(v, i)
    in_flight.drain()
    streamed = time.perf_counter()
    end = pipe.end_round(state, reports, final=final)
    consolidated = time.perf_counter()
    schedule = Schedule(pipe.task_free, len(rounds) if pipe.ended else None, rt.evaluate_every, rt.evaluate_window,
                        rt.anytime)
    ended = schedule.ended(info, batches)
    seen = seen_after(state.seen_tasks, pipe.visit_tasks(sorted({v for v, _ in batches})))
    accuracy: dict[int, float] = {}
    if schedule.due(info, r, ended):
        reports.phase("evaluate")
        accuracy = pipe.evaluate(schedule.tasks(seen, r, len(info.task_classes)), schedule.test_visit(batches, ended),
                                 letters, reports)
    refused = [t for t in pipe.x.get(letters) if t.num_rows]
    seconds = {"stream": streamed - started, "consolidate": consolidated - streamed,
               "evaluate": time.perf_counter() - consolidated}
    return RoundOutcome(accuracy, seen, ended, len(batches), pa.concat_tables(refused) if refused else None,
                        seconds, end.log, end.predictions, end.clock)


def _round_name(pipe: StreamPipeline, rounds: list[RoundBatches], r: int) -> str:
    """Round r as a person reads it: the last visit it ended, or its number (task-free, or a visit not ended)."""
    info = pipe.info
    ended = [v for v, i in rounds[r] if i == info.visit_batches[v] - 1] if not pipe.task_free else []
    return f"visit {ended[-1] + 1} of {len(info.visits)}" if ended else f"round {r + 1}"


def _commit_round(pipe: StreamPipeline, state: RunState, r: int, outcome: RoundOutcome, memory: dict[str, int],
                  run_dir: Path, prequential: PrequentialConfig, anytime: bool, late_labels: set[int]) -> None:
    """Fold a completed round (and the memory report read after it) into the run state and write its dead
    letters and the predictions of its unlabelled rows; calls no actor, so a commit is never half done."""
    if outcome.clock is not None:
        state.realtime = outcome.clock
    if outcome.predictions is not None:
        tally = Tally(**state.prequential)
        tally.add(outcome.predictions, prequential.window)
        _write_predictions(run_dir, r, unlabelled(outcome.predictions))
        _settle_late_labels(run_dir, r, tally, labelled(outcome.predictions), late_labels)
        state.append("curve", tally.curve)
        tally.curve = []
        state.prequential = dataclasses.asdict(tally)
    for phase, seconds in outcome.seconds.items():
        state.add_wall(phase, seconds)
    state.seen_tasks = outcome.seen
    added = matrix_rows(outcome.accuracy, outcome.ended, len(pipe.info.task_classes), pipe.task_free, outcome.seen)
    if anytime:
        state.append("anytime_rows", [[outcome.accuracy.get(t, float("nan"))
                                       for t in range(len(pipe.info.task_classes))]])
    state.append("acc_rows", added)
    state.append("rows", [{"round": r, "visits_ended": outcome.ended}] * len(added) if pipe.task_free
                 else [{"round": r, "visit": v} for v in outcome.ended])
    dead = outcome.dead
    if dead is not None and dead.num_rows:
        dead = _new_refusals(dead, state)
    if dead is not None and dead.num_rows:
        (run_dir / "dead_letters").mkdir(exist_ok=True)
        files.write_parquet(dead, run_dir / "dead_letters" / f"round-{r:06d}.parquet")  # a replay overwrites
        for split, reason, origin in zip(dead.column("split").to_pylist(), dead.column("reason").to_pylist(),
                                         dead.column("origin").to_pylist(), strict=True):
            counts = state.refused_test if split == "test" else state.refused
            counts[reason] = counts.get(reason, 0) + 1
            where = origin or "the encoder"  # rows the encoder refused (undecodable payloads) carry no origin
            state.refused_origins[where] = state.refused_origins.get(where, 0) + 1
    evaluated = [a for a in outcome.accuracy.values() if not np.isnan(a)]
    state.last_log = {"round": r, "visits_ended": outcome.ended, "batches": outcome.batches,
                      "accuracy": outcome.accuracy, "mean_evaluated": float(np.mean(evaluated)) if evaluated
                      else None, "memory": memory, "seconds": outcome.seconds, **outcome.log,
                      "refused": 0 if dead is None else dead.num_rows, "time": time.time()}
    state.append("round_log", [state.last_log])
    state.next_round = r + 1


def _write_predictions(run_dir: Path, r: int, predicted: pa.Table) -> None:
    """The round's unlabelled rows as predicted, in `predictions/round-N.parquet` (a replay overwrites, never adds;
    a round without any writes none)."""
    path = _predictions_path(run_dir, r)
    if not predicted.num_rows:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(exist_ok=True)
    files.write_parquet(predicted.drop_columns([S.LABEL]), path)


def _predictions_path(run_dir: Path, r: int) -> Path:
    return run_dir / "predictions" / f"round-{r:06d}.parquet"


def _settle_late_labels(run_dir: Path, r: int, tally: Tally, learned: pa.Table, late_labels: set[int]) -> None:
    """Rows labelled in round r by a label file (`late_labels`, the stream's; each settles one row that came
    unlabelled, in this round or before): score the predictions made while they were unlabelled, read back from
    the sink of rounds up to r. The stream and the sink are the record, so no checkpoint keeps a list of the ids
    awaiting a label, and a round without late labels reads nothing."""
    labels = {i: y for i, y in zip(learned.column(S.SAMPLE_ID).to_pylist(), learned.column(S.LABEL).to_pylist(),
                                   strict=True) if i in late_labels}
    sink = [path for k in range(r + 1) if (path := _predictions_path(run_dir, k)).exists()] if labels else []
    if not sink:
        return
    tally.settle(ds.dataset(sink, format="parquet").to_table(
        columns=[S.SAMPLE_ID, "prediction"], filter=ds.field(S.SAMPLE_ID).isin(list(labels))), labels)


def first_visit_square(acc: np.ndarray, info: StreamInfo) -> np.ndarray:
    """The T x T matrix of the rows after each task's first visit (what A_last, Ā, forgetting and BWT read)."""
    first_rows = [info.visits.index(t) for t in range(len(info.task_classes)) if t in info.visits]
    return acc[np.ix_(first_rows, list(range(len(first_rows))))] if first_rows else acc


def learned_points(rows: list[dict], round_log: list[dict], info: StreamInfo) -> list[int]:
    """Per task, the first evaluation point (row) after its first visit had ended (task-free runs)."""
    ended_in = {v: e["round"] for e in round_log for v in e["visits_ended"]}
    last = len(rows) - 1
    return [next((p for p, row in enumerate(rows) if row["round"] >= ended_in[info.visits.index(t)]), last)
            if t in info.visits else last for t in range(len(info.task_classes))]


def _new_refusals(dead: pa.Table, state: RunState) -> pa.Table:
    """`dead` without the test rows an earlier evaluation already refused (each evaluation reads its test rows
    again); the test rows it adds are remembered in `state`."""
    keys = [f"{o}:{p}:{i}" for o, p, i in zip(dead.column("origin").to_pylist(), dead.column("position").to_pylist(),
                                            dead.column(S.SAMPLE_ID).to_pylist(), strict=True)]
    seen = set(state.refused_test_rows)
    keep = [split != "test" or key not in seen for split, key in zip(dead.column("split").to_pylist(), keys,
                                                                        strict=True)]
    state.refused_test_rows += [key for key, split, k in zip(keys, dead.column("split").to_pylist(), keep,
                                                              strict=True) if split == "test" and k]
    return dead.filter(pa.array(keep, pa.bool_()))


def summary(pipe: StreamPipeline, acc: np.ndarray, rows: list[dict], round_log: list[dict]) -> dict:
    """A_last, Ā, forgetting and BWT of the model as it stands at the end of the stream (docs/methods.md, "Metrics";
    Ā and forgetting None where the matrix is evaluated only in part), or {} while A_last's or BWT's entries are
    missing. With boundaries, every visit's row counts, a returning task's included."""
    if pipe.task_free:
        complete = acc.size and not np.isnan(acc[-1]).any()
        return M.Summary.over_points(acc, learned_points(rows, round_log, pipe.info)).as_dict() if complete else {}
    if not revisits(pipe.info):
        return first_pass(pipe.info, acc)
    if not acc.size or np.isnan(acc[-1]).any():
        return {}
    visits = pipe.info.visits
    first_rows = [visits.index(t) if t in visits else len(acc) - 1 for t in range(len(pipe.info.task_classes))]
    out = M.Summary.over_points(acc, first_rows).as_dict()
    seen = np.arange(len(acc))[:, None] >= np.array(first_rows)[None, :]  # task j trained by row i
    if np.isnan(acc[seen]).any():  # as for the first pass: Ā and forgetting only over a complete matrix
        out.update(a_mean=None, forgetting=None)
    return out


def revisits(info: StreamInfo) -> bool:
    """Whether a task of the stream returns after its first visit."""
    return len(info.visits) > len(set(info.visits))


def first_pass(info: StreamInfo, acc: np.ndarray) -> dict:
    """The four numbers of the rows after each task's first visit only (a returning task's later visits unread):
    the headline of a stream where no task returns, reported beside it where one does."""
    square = first_visit_square(acc, info)
    return M.Summary.of(square).as_dict() if M.Summary.computable(square) else {}


def _anytime(pipe: StreamPipeline, matrix: list[list[float]]) -> dict:
    """The anytime matrix (a row per round, every task), the visit and step each row was evaluated at, and its
    summary (memcl_ops/metrics.py, anytime_summary)."""
    rounds = pipe.plan()
    row_visits = [rounds[r][-1][0] for r in range(len(matrix))]
    steps = [sum(1 for q in range(r) if rounds[q][-1][0] == rounds[r][-1][0]) for r in range(len(row_visits))]
    return {"matrix": matrix, "row_visits": row_visits, "row_steps": steps,
            **M.anytime_summary(np.array(matrix), row_visits, pipe.info.visits)}


def _run_metrics(pipe: StreamPipeline, state: RunState, wall: float, rt: RuntimeConfig) -> dict:
    info = pipe.info
    matrix, rows, round_log = state.records("acc_rows"), state.records("rows"), state.records("round_log")
    tasks = len(info.task_classes)  # a followed folder's earlier rows were written before its later tasks came
    acc = np.array([[*row, *[np.nan] * (tasks - len(row))] for row in matrix], dtype=np.float64).reshape(
        len(matrix), tasks)
    learned, unique = pipe.learned_counts()
    tally = Tally(**{**state.prequential, "curve": state.records("curve")})
    timings = pipe.roles.timings()
    return {
        "dataset": info.name,
        "task_classes": info.task_classes,
        "visits": info.visits,
        "task_free": pipe.task_free,
        "acc_matrix": acc.tolist(),
        "rows": rows,
        "summary": summary(pipe, acc, rows, round_log),
        "first_pass": first_pass(info, acc) if not pipe.task_free and revisits(info) else None,
        "final_accuracy_all_tasks": float(np.nanmean(acc[-1])) if acc.size and not np.isnan(acc[-1]).all() else None,
        "prequential": tally.report(rt.prequential) if tally.curve else None,
        "anytime": _anytime(pipe, state.records("anytime_rows")) if rt.anytime and state.count("anytime_rows")
        else None,
        "samples": {"stream": info.num_samples, "learned": learned, "unique_learned": unique,
                    "refused": sum(state.refused.values()), "refused_by_reason": state.refused,
                    "refused_test": sum(state.refused_test.values()), "refused_test_by_reason": state.refused_test,
                    "refused_by_origin": state.refused_origins,
                    "predicted_unlabelled": state.prequential["predicted_unlabelled"]},
        "realtime": state.realtime,
        "memory_bytes": {k: v for k, v in pipe.memory_report().items() if k != "num_slots"},
        "wall_seconds": {"total": wall, **state.wall},
        "actor_busy_seconds": {f"{actor}.{stage}": v["seconds"] for actor, stages in timings.items()
                               for stage, v in stages.items()},
        "placement": pipe.roles.placement(),
        "round_log": round_log,
        "consolidations": (state.realtime or {}).get("published", len(round_log)),
        "recoveries": state.recoveries,
    }
