"""`memcl lm`: continual learning of (instruction -> short answer) tasks with a frozen small LM, the "lm"
methods side by side on one task stream, the memory methods at each byte budget (docs/methods.md, "MIITA").
`memcl.pipeline.runner.run` of an `LMRunConfig` runs each (method, budget) through the one round loop (pipeline/loop.py:
fault replay, checkpoints, `--resume`), one round per task, through Arrow batches and actors:

    text pairs ──> LMEncoder.extract ──> (key, R_m) ──> MemoryManager.write_prototypes     (miita)
    text pairs ──────────────┴───────────────────────> MemoryManager.write_replay         (replay)
    text pairs ──> LMTrainer.train                                                        (lora)

then the tasks due are answered by generation with the method's state and scored by exact match:

    miita:  MemoryManager.prototype_state ──> LMEncoder.generate(adapted)
    replay: LMEncoder.query_keys ──> MemoryManager.demonstrations ──> LMEncoder.generate(demonstrations)
    lora:   LMTrainer.generate;   base: LMEncoder.generate

The extraction is the same for every method and budget, so it runs once per train batch. The frozen base model
has no state, so each task is answered once and its accuracy fills its column of every row.

Test-then-train: each task's training pairs are answered by the method as it stands before it learns them (a memory
method batch by batch, the LoRA trainer task by task, as it learns), scored like the test pairs: the run's
prequential accuracy.

Writes a run folder: config.yaml, runs/<run>/ (each run's checkpoints and metrics.json), metrics.json (per run:
accuracy matrix, its summary (A_last, the MIITA paper's OP; BWT), prequential accuracy, memory bytes after every task,
wall seconds), results.csv (one row per run), <run>_acc_matrix.{csv,png}, <run>_acc_over_time.png,
<run>_prequential.png, a_last_bwt.png and predictions.jsonl (every generated answer: `split` "test", the test pairs
answered after task `after_task`; "train", the training pairs answered before they were learned, `after_task` the
last task learned before theirs).
"""

from __future__ import annotations

import csv
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray

from memcl.actors.lm_encoder import LMEncoder
from memcl.actors.lm_trainer import LMTrainer
from memcl.actors.memory_manager import MemoryManager
from memcl.pipeline import checkpoint, preflight, report, run_folder
from memcl.pipeline.actor_cache import FAULTS, ActorCache, failed_to_start
from memcl.pipeline.config import ConfigError, Placement, RuntimeConfig, dump_config
from memcl.pipeline.errors import RunInterrupted, RunStopped, one_line
from memcl.pipeline.executors import ReplicaPool
from memcl.pipeline.local import LocalActors
from memcl.pipeline.loop import PhaseHook, discard_unstarted, new_run_dir, stream
from memcl.pipeline.progress import Progress, Reports
from memcl.pipeline.roles import BatchHook, Roles, RoundEnd, RunResult, RunState, ensure_ray
from memcl.pipeline.trainer_group import TrainerGroup
from memcl_ops import files
from memcl_ops import metrics as M
from memcl_ops.arrow import schema as S
from memcl_ops.data.lm_tasks import LMStreamSpec, TextPair, TextTask, answer_scores, build_stream, task_batches
from memcl_ops.data.sources import StreamInfo
from memcl_ops.method_config import LMMethodConfig
from memcl_ops.methods import family_methods, lm_method
from memcl_ops.models.causal_lm import LMSpec, LMUnavailable, check_lm
from memcl_ops.roles.lm import LMFlow
from memcl_ops.roles.lm_trainer import REPLICATED as TRAINER_REPLICATED
from memcl_ops.rounds import RoundBatches, plan_rounds

log = logging.getLogger("memcl")

SCORES = ("exact", "first_word", "label_restricted", "rouge_l")  # per answer: memcl_ops/data/lm_tasks.py
QUERY_COST = ("prompt_tokens", "ms_per_query")


@dataclass(frozen=True)
class LMRunConfig:
    """`memcl lm` with no config: SmolLM2-135M-Instruct on five tasks (24 train / 16 test pairs each); the frozen
    base, text replay and MIITA at 16 KiB and 64 KiB, and sequential LoRA, side by side."""

    seed: int = 0
    model: LMSpec = LMSpec()
    stream: LMStreamSpec = LMStreamSpec()
    methods: tuple[str, ...] = ("base", "replay", "miita", "lora")
    budgets: tuple[int, ...] = (16 * 1024, 64 * 1024)  # C_mem in bytes, for the memory methods
    method: LMMethodConfig = LMMethodConfig()
    runtime: RuntimeConfig = RuntimeConfig()  # the runtime of every run (`memcl run`'s section)


@dataclass(frozen=True)
class RunSpec:
    method: str
    budget: int | None  # None for the methods without memory

    @property
    def name(self) -> str:
        if self.budget is None:
            return self.method
        return f"{self.method}@{self.budget // 1024}KiB" if self.budget % 1024 == 0 else f"{self.method}@{self.budget}B"


def check_config(config: LMRunConfig) -> tuple[list[RunSpec], list[TextTask]]:
    """The (method, budget) runs of `config` and its task stream, or ConfigError (one line) for what would fail
    after Ray starts: a method or budget, the model (its name, and the package or folder it loads from), a task, more
    GPUs reserved than this machine has (when Ray starts here)."""
    try:
        specs = run_specs(config)
        check_lm(config.model)
        tasks = build_stream(config.stream)
    except (ValueError, LMUnavailable) as err:
        raise ConfigError(str(err)) from err
    if config.runtime.data_parallel > 1 and not any("trains-backbone" in lm_method(s.method).tags for s in specs):
        raise ConfigError("runtime.data_parallel: none of the methods " + ", ".join(config.methods) + " has a trainer "
                          "that learns data-parallel (the LoRA trainer does: "
                          + ", ".join(m for m in family_methods("lm") if "trains-backbone" in lm_method(m).tags)
                          + "); leave it at 1")
    if not preflight.joins_a_cluster(config.runtime):  # Ray will start here, with this machine's GPUs
        preflight.check_gpus(reserved_gpus(config, specs), preflight.local_gpus(), "this machine has",
                             preflight.LM_COPIES)
    return specs, tasks


def reserved_gpus(config: LMRunConfig, specs: list[RunSpec]) -> dict[str, tuple[float, int]]:
    """The GPUs the actors of `specs`' runs reserve, per role (preflight.lm_reserved_gpus)."""
    return preflight.lm_reserved_gpus(config.runtime, set().union(*(lm_method(s.method).tags for s in specs)))


def run_specs(config: LMRunConfig) -> list[RunSpec]:
    if not config.methods:
        raise ValueError("methods is empty; choose from " + ", ".join(family_methods("lm")))
    specs = []
    for method in config.methods:
        if "byte-budget" in lm_method(method).tags:
            if not config.budgets or min(config.budgets) <= 0:
                raise ValueError(f"{method} needs positive byte budgets, got {config.budgets}")
            specs += [RunSpec(method, b) for b in config.budgets]
        else:
            specs.append(RunSpec(method, None))
    return specs


class LMContext:
    """What every run of one `memcl lm` shares: the task stream as Arrow text-pair batches in the object store
    (sample ids increase along the stream), the frozen LM's actor, its extractions and the base model's answers."""

    def __init__(self, config: LMRunConfig, tasks: list[TextTask], actors: ActorCache | LocalActors):
        self.config, self.tasks, self.actors = config, tasks, actors
        train, test = task_batches(tasks, config.stream.batch_size, config.stream.answer_batch_size)
        put = (lambda b: b) if actors.local else ray.put  # roles of this process read the batches themselves
        self.train = [[put(b) for b in batches] for batches in train]
        self.test = [[put(b) for b in batches] for batches in test]
        rt = config.runtime
        # copies of the frozen LM: extraction and answers go to them in turn (stateless, so any copy gives the same)
        self.replicas = [f"lm_encoder{'' if r == 0 else r}" for r in range(rt.lm_replicas)]
        actors.keep_only("lm_encoder", self.replicas)
        for replica in self.replicas:
            actors.get(replica, LMEncoder, rt.actor_options("lm_encoder", Placement(num_cpus=1)), config.model,
                       rt.actor_threads)
        self.pool = ReplicaPool(lambda: [actors.handle(r) for r in self.replicas])
        self.x = actors.executor(lambda role: self.pool if role == "lm_encoder" else None)
        self.model = actors.call("lm_encoder", "info")
        self.extracted: dict[int, list] = {}  # per task: (key, R_m) batches, computed once
        self.query_keys: dict[int, list] = {}  # per task: the test prompts' keys (replay)
        self.base_answers: dict[int, tuple[float, float, list[dict]]] = {}  # per task: the frozen model's scores
        self.info = StreamInfo(name="+".join(t.name for t in tasks), payload="text", task_classes=[[] for _ in tasks],
                               visits=list(range(len(tasks))), visit_batches=[len(b) for b in self.train],
                               test_batches=[len(b) for b in self.test], num_samples=sum(len(t.train) for t in tasks),
                               labels=None, fingerprint="")

    def extraction(self, task: int, index: int) -> object:
        refs = self.extracted.setdefault(task, [None] * len(self.train[task]))
        if refs[index] is None:
            refs[index] = self.x.call("lm_encoder", "extract", self.train[task][index])
        return refs[index]

    def forget_calls(self) -> None:
        """Drop results of calls to the LM actor (after a fault they may be lost with it)."""
        self.extracted.clear()
        self.query_keys.clear()


@dataclass
class OpenTask:
    """The task being streamed: the calls that answer and learn its batches, and its round-log entry."""

    index: int
    started: float
    answers: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    log: dict = field(default_factory=dict)


class LMPipeline:
    """The actors of one (method, budget) run and what the method does with them."""

    def __init__(self, ctx: LMContext, spec: RunSpec):
        self.ctx, self.spec = ctx, spec
        self.info = ctx.info
        cfg, rt = ctx.config, ctx.config.runtime
        method = lm_method(spec.method)
        self.method = method.resolve_lm(cfg.method)  # with the settings the method fixes
        probe = LMFlow(ctx.actors.executor(lambda role: None), method, self.method, spec.budget)
        names = list(ctx.replicas)
        stores = probe.stores(ctx.model["hidden"], ctx.model["vocab"])
        if stores:
            ctx.actors.get("memory", MemoryManager, rt.actor_options("memory"), stores, 1)
            names.append("memory")
        self.trainers = None
        if probe.trains:  # runtime.data_parallel workers learning as one
            self.trainers = TrainerGroup(ctx.actors, "lm_trainer", rt.data_parallel, LMTrainer,
                                         rt.actor_options("lm_trainer"), cfg.model, self.method.finetune, cfg.seed,
                                         rt.actor_threads, replicated=TRAINER_REPLICATED)
            names += self.trainers.workers
        self.roles = Roles(ctx.actors, names, copies=self.trainers.copies if self.trainers else None)
        self.x, self.runtime = ctx.actors.executor(self._handle), rt
        self.flow = LMFlow(self.x, method, self.method, spec.budget)
        self.task_free = False  # one round per task
        self.ended = True  # a stream planned whole at its start (only the features family follows a folder)

    def _handle(self, role: str):
        if role == "lm_encoder":
            return self.ctx.pool
        return self.trainers.handle() if role == "lm_trainer" and self.trainers else self.roles.handle(role)

    def plan(self) -> list[RoundBatches]:
        return plan_rounds(self.info, task_free=False, every=0)

    def begin_round(self, batches: RoundBatches, state: RunState, reports: Reports) -> None:
        self.task = OpenTask(batches[0][0], time.perf_counter())

    def observe(self, task: int, index: int, letters: list) -> object:
        """One batch of the task's training pairs: answered by the method as it stands before it is learned
        (test-then-train, unless `stream.answer_training_pairs` is off), then written into a memory method's
        memory; the LoRA baseline learns the task's batches at its end, the frozen base nothing. Returns the call
        that bounds the calls in flight (an answer reads the memory after the writes before it)."""
        ctx, flow, now = self.ctx, self.flow, self.task
        pairs, tokens = ctx.train[task][index], ctx.tasks[task].max_answer_tokens
        if ctx.config.stream.answer_training_pairs:  # the memory's calls run in the order they are sent
            now.answers.append(flow.answer(pairs, tokens))
        if flow.prototypes or flow.demonstrations:
            now.writes.append(flow.learn_batch(pairs, ctx.extraction(task, index)))
        return now.answers[-1] if now.answers else now.writes[-1] if now.writes else None

    def end_round(self, state: RunState, reports: Reports, *, final: bool) -> RoundEnd:
        """The task's end: the LoRA baseline's epochs over the task's pairs (its answers first); what the method
        reports about the task, with the answers to its training pairs scored."""
        ctx, flow, now = self.ctx, self.flow, self.task
        answers = self.x.get(now.answers)
        answered = time.perf_counter()
        if flow.trains:
            losses = self.x.get(flow.learn_task(ctx.train[now.index]))
            self.trainers.drain()
            learned: dict = {"epoch_losses": losses}
        elif flow.prototypes:
            outcomes = self.x.get(now.writes)
            learned = {k: outcomes[-1][k] if k == "stored" else sum(o[k] for o in outcomes) for k in outcomes[0]}
        elif flow.demonstrations:
            learned = {"stored": self.x.get(now.writes)[-1]}
        else:  # the frozen base learns nothing: it only answers
            learned = {}
        _, _, rows = score(answers, ctx.tasks[now.index], "train")
        # the training pairs as answered before they were learned; the test pairs join at evaluation
        now.log = {"task": now.index, "name": ctx.tasks[now.index].name, "learned": learned, "nll": {}, "scores": {},
                   "predictions": [{"run": self.spec.name, "split": "train", "after_task": now.index - 1,
                                    "task": now.index, **r} for r in rows],
                   # the LoRA trainer's and the frozen base's answering apart from their learning (a memory method's
                   # answers and writes interleave, so its learning time includes its answers)
                   "answer_seconds": answered - now.started if flow.trains or not learned else 0.0}
        return RoundEnd(now.log)

    def visit_tasks(self, visits: list[int]) -> list[list[int]]:
        return [[v] for v in visits]

    def evaluate(self, tasks: list[int], after_visit: int, letters: list, reports: Reports) -> dict[int, float]:
        """Each task's test pairs answered by the method as it stands (the frozen base's answers once per task, the
        same for every later evaluation); the answers join the round's predictions."""
        ctx, bars, log = self.ctx, reports.progress, self.task.log
        accuracy = {}
        for j in tasks:
            if self.spec.method == "base" and j in ctx.base_answers:
                accuracy[j], log["nll"][j], rows = ctx.base_answers[j]
            else:
                started = time.perf_counter()
                answers = bars.wait(self.answer(j), f"{self.spec.name}: answer {ctx.tasks[j].name}", "batch",
                                    leave=False)
                accuracy[j], log["nll"][j], rows = score(answers, ctx.tasks[j])
                ms = 1000 * (time.perf_counter() - started) / max(len(rows), 1)
                rows = [{**r, "ms_per_query": ms} for r in rows]
                if self.spec.method == "base":
                    ctx.base_answers[j] = accuracy[j], log["nll"][j], rows
            log["scores"][j] = {name: float(np.mean([r[name] for r in rows])) for name in SCORES + QUERY_COST}
            log["predictions"] += [{"run": self.spec.name, "split": "test", "after_task": self.task.index, "task": j,
                                    **r} for r in rows]
        if accuracy:
            bars.note(f"{self.spec.name} after {ctx.tasks[self.task.index].name}: mean accuracy on the tasks answered "
                      f"{np.mean(list(accuracy.values())):.3f}")
        return accuracy

    def answer(self, task: int) -> list:
        """Prediction batches for one task's test pairs under the method's current state."""
        ctx, flow = self.ctx, self.flow
        tokens, batches = ctx.tasks[task].max_answer_tokens, ctx.test[task]
        if flow.demonstrations and task not in ctx.query_keys:  # the prompts' keys, the same for every run
            ctx.query_keys[task] = [flow.query_keys(b) for b in batches]
        keys = ctx.query_keys[task] if flow.demonstrations else [None] * len(batches)
        return [flow.answer(b, tokens, k) for b, k in zip(batches, keys)]

    def revive(self, parts: dict[str, checkpoint.State] | None) -> None:
        self.ctx.forget_calls()
        if self.trainers:
            self.trainers.break_up()
        self.roles.revive()
        if self.trainers:
            self.trainers.join()
        self.roles.restore(parts)

    def memory_report(self) -> dict[str, int]:
        return self.flow.memory_report()

    def learned_counts(self) -> tuple[int, int]:
        for role in ("memory", "lm_trainer"):
            if role in self.roles.names:
                return tuple(self.x.get(self.x.call(role, "learned_counts")))
        return 0, 0

    def close(self) -> None:
        """Nothing to release: this family streams through classic actor calls only."""

    def prequential_curve(self, state: RunState) -> list[dict]:
        """The prequential figures after each round so far (TensorBoard logs the last)."""
        return self._prequential(state)["curve"]

    def _prequential(self, state: RunState) -> dict:
        """Test-then-train: each training pair's headline score, answered before it was learned, in stream order:
        overall, over the last `runtime.prequential.window` pairs and per task, and after each task (a round logged
        before runs answered their training pairs has none)."""
        window = self.ctx.config.runtime.prequential.window
        scores: list[float] = []
        curve, per_task = [], {}
        for entry in state.records("round_log"):
            task = self.ctx.tasks[int(entry["task"])]
            mine = [float(p[headline(task)]) for p in entry["predictions"] if p.get("split") == "train"]
            if mine:
                per_task[task.name] = float(np.mean(mine))
            scores += mine
            curve.append({"rows": len(scores), "accuracy": float(np.mean(scores)) if scores else None,
                          "window": float(np.mean(scores[-window:])) if scores else None})
        return {"accuracy": curve[-1]["accuracy"] if curve else None,
                "window_accuracy": curve[-1]["window"] if curve else None, "window": window, "rows": len(scores),
                "per_task": per_task, "curve": curve}

    def finish(self, state: RunState) -> dict:
        acc, round_log = np.array(state.records("acc_rows"), dtype=np.float64), state.records("round_log")
        nll = np.full_like(acc, np.nan)
        for i, entry in enumerate(round_log):
            for j, value in entry["nll"].items():
                nll[i, int(j)] = value
        per_score = {name: np.full_like(acc, np.nan) for name in SCORES + QUERY_COST}
        for i, entry in enumerate(round_log):
            for j, values in entry["scores"].items():
                for name, value in values.items():
                    per_score[name][i, int(j)] = value

        # the headline (`summary`, the loop's: A_last, the MIITA paper's OP) is exact match, or ROUGE-L on free-text
        # tasks; A_last and BWT of every score beside it
        return {"method": self.spec.method, "run": self.spec.name, "budget_bytes": self.spec.budget,
                "prequential": self._prequential(state),
                # teacher-forced NLL of the reference answers under the method's final state (lower is better)
                "nll_matrix": nll.tolist(), "final_answer_nll": float(np.mean(nll[-1])),
                "scores": {name: {"a_last": M.final_accuracy(per_score[name]),
                                  "bwt": M.backward_transfer(per_score[name])} for name in SCORES},
                # what one answer costs: prompt tokens read (replay's demonstrations included) and wall ms
                "query_cost": {name: float(np.nanmean(per_score[name])) for name in QUERY_COST},
                "log": [{"task": e["task"], "name": e["name"], "learned": e["learned"], "memory_bytes": e["memory"],
                         "accuracy": {self.ctx.tasks[int(j)].name: a for j, a in e["accuracy"].items()}}
                        for e in round_log]}


def score(predictions: list[pa.RecordBatch], task: TextTask, split: str = "test") -> tuple[float, float, list[dict]]:
    """The task's headline score (exact match or ROUGE-L, memcl_ops/data/lm_tasks.py) and mean answer NLL of
    prediction batches of the task's `split` pairs ("test" or "train"), and one record per answer with every
    score."""
    pairs = {p.prompt: p for p in (task.train if split == "train" else task.test)}  # with the answers each accepts
    rows = []
    for batch in predictions:
        columns = (S.sample_ids_to_numpy(batch).tolist(), *(batch.column(c).to_pylist() for c in (
            S.TEXT, S.ANSWER, S.PREDICTION, S.ANSWER_NLL, S.PROMPT_TOKENS)))
        for sid, prompt, answer, pred, nll, read in zip(*columns):
            scores = answer_scores(pred, pairs.get(prompt, TextPair(prompt, answer)), task.answers)
            rows.append({"sample_id": sid, "prompt": prompt, "answer": answer, "prediction": pred,
                         "correct": bool(scores["exact"]), **scores, "answer_nll": nll, "prompt_tokens": read})
    if not rows:
        return float("nan"), float("nan"), rows
    nll = [r["answer_nll"] for r in rows if np.isfinite(r["answer_nll"])]  # a copying baseline scores no NLL
    return float(np.mean([r[headline(task)] for r in rows])), float(np.mean(nll)) if nll else float("nan"), rows


def headline(task: TextTask) -> str:
    """The score that is a task's accuracy: exact match, or ROUGE-L on a free-text task."""
    return "rouge_l" if task.metric == "rouge-l" else "exact"


@dataclass(frozen=True)
class LMResult:
    """A finished `memcl lm`: its folder, each (method, budget) run's result by name, and what metrics.json holds."""

    run_dir: Path
    runs: dict[str, RunResult]
    metrics: dict


def run_methods(config: LMRunConfig, *, run_dir: Path | None = None, resumed: bool = False,
                progress: bool | None = None, actors: ActorCache | LocalActors | None = None,
                on_batch: BatchHook | None = None, on_phase: PhaseHook | None = None) -> LMResult:
    """What `memcl.pipeline.runner.run` does with an `LMRunConfig`: every method (and budget) of `config` over its task
    stream, each through the one round loop (`resumed`: continue the runs of `run_dir`). `actors`: reuse the
    actors of earlier runs (they are reset), or `LocalActors` to hold every role in this process; by default the
    actors are started and killed after."""
    specs, tasks = check_config(config)  # before Ray starts: a bad config fails at once, with one line
    own, given_dir = actors is None, run_dir
    actors = actors or ActorCache()
    lock = None
    try:
        if run_dir is not None and run_dir.is_dir():  # a folder given (a resume): refused before Ray if in use
            lock = run_folder.RunLock(run_dir)
        started = time.perf_counter()
        rt = config.runtime
        if not actors.local:
            ensure_ray(config)
            preflight.check_gpus(reserved_gpus(config, specs), ray.cluster_resources().get("GPU", 0),
                                 "the cluster has", preflight.LM_COPIES)
        bars = Progress(enabled=rt.progress if progress is None else progress)
        run_dir = run_dir or new_run_dir(rt.out, f"lm-{config.model.name}-s{config.seed}")
        if not run_dir.is_dir():
            run_folder.create(run_dir)
        lock = lock or run_folder.RunLock(run_dir)  # held while this process runs it (`memcl runs clean` leaves it)
        if not resumed:
            dump_config(config, run_dir / "config.yaml")
        try:
            t0 = time.perf_counter()
            ctx = LMContext(config, tasks, actors)
            bars.wait([ctx.extraction(t, i) for t in range(len(tasks)) for i in range(len(ctx.train[t]))],
                      "extract hidden states", "batch")
            extract_seconds = time.perf_counter() - t0
            runs, skipped = {}, {}
            for spec in specs:
                folder = run_dir / "runs" / spec.name.replace("@", "_")
                if resumed and (folder / "metrics.json").is_file():
                    runs[spec.name] = RunResult.of(folder, report.read_metrics(folder / "metrics.json"))
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                try:
                    runs[spec.name] = stream(LMPipeline(ctx, spec), folder, resumed, rt, bars,
                                             {"dataset": ctx.info.name, "seed": config.seed},
                                             started=time.perf_counter(), on_batch=on_batch, on_phase=on_phase)
                except Exception as err:  # this (method, budget) cannot run (a budget too small for one entry)
                    if not (isinstance(err, ValueError) or failed_to_start(err)):
                        raise
                    kept = sorted((folder / "checkpoints").glob("ckpt-*.npz"))
                    if kept:  # a run that committed a round is never skipped: its folder and checkpoint stay
                        raise ConfigError(f"{spec.name}: the run cannot go on from its checkpoint {kept[-1]} "
                                          f"({one_line(err)[0]}); the checkpoint is kept") from err
                    skipped[spec.name] = one_line(err)[0]
                    log.warning("memcl lm: skipped %s: %s", spec.name, skipped[spec.name])
                    shutil.rmtree(folder, ignore_errors=True)
        except KeyboardInterrupt:
            raise RunInterrupted(run_dir, command="memcl lm") from None
        except RunStopped as stop:
            raise RunStopped(f"{stop.run_dir.name}: {stop.why}", run_dir, command="memcl lm") from stop
        except Exception:
            if not resumed and given_dir is None:
                discard_unstarted(run_dir)
            raise
        encoder_busy = {}
        for replica in ctx.replicas:
            try:
                encoder_busy[replica] = actors.call(replica, "timings")
            except FAULTS:  # killed as the last run ended (chaos mode): its busy time went with it
                encoder_busy[replica] = {}
        predictions = [p for r in runs.values() for e in r.metrics["round_log"] for p in e["predictions"]]
        metrics = {
            "model": {**ctx.model, "spec": config.model.name}, "seed": config.seed,
            "tasks": [t.name for t in tasks], "answers": {t.name: list(t.answers) for t in tasks},
            "runs": {name: _run_entry(r.metrics) for name, r in runs.items()},
            "skipped": skipped,  # run name -> why it could not run
            "wall_seconds": {"total": time.perf_counter() - started, "extract": extract_seconds},
            # the frozen LM serves every run (its busy time is the whole command's); the others are per run
            "actor_busy_seconds": {**encoder_busy,
                                   **{name: r.metrics["actor_busy_seconds"] for name, r in runs.items()}},
        }
        write_lm_run(run_dir, metrics, predictions)
        metrics["run_dir"] = str(run_dir)
        return LMResult(run_dir, runs, metrics)
    finally:
        if lock is not None:
            lock.release()
        if own:
            actors.close()


def _run_entry(metrics: dict) -> dict:
    """One run's entry in the `memcl lm` metrics: its results without the answers (those go to predictions.jsonl)."""
    keep = ("method", "budget_bytes", "acc_matrix", "summary", "prequential", "nll_matrix",
            "final_answer_nll", "scores", "query_cost", "memory_bytes", "log", "samples", "recoveries", "wall_seconds")
    return {k: metrics[k] for k in keep}


def write_lm_run(run_dir: Path, metrics: dict, predictions: list[dict]) -> None:
    files.write_json(run_dir / "metrics.json", metrics)
    with files.atomic_open(run_dir / "predictions.jsonl", "w") as f:
        for row in predictions:
            f.write(files.json_text(row, indent=None) + "\n")
    render_lm(run_dir, metrics)


def render_lm(run_dir: Path, metrics: dict) -> None:
    """results.csv, the accuracy matrix files and prequential chart of every run and the A_last/BWT chart, from a
    metrics dict."""
    with files.atomic_open(run_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "method", "budget_bytes", "a_last", "bwt", "a_mean", "prequential",
                         "final_answer_nll", "memory_bytes", "seconds"])
        for name, r in metrics["runs"].items():
            s = r["summary"]
            writer.writerow([name, r["method"], r["budget_bytes"] or "", _csv_cell(s["a_last"]), _csv_cell(s["bwt"]),
                             _csv_cell(s.get("a_mean")), _csv_cell(_prequential_accuracy(r)),
                             _csv_cell(r["final_answer_nll"], ".3f"),
                             sum(r["memory_bytes"].values()),
                             f"{r['wall_seconds']['total']:.1f}"])
    for name, r in metrics["runs"].items():
        view = {"acc_matrix": r["acc_matrix"], "visits": list(range(len(metrics["tasks"]))), "method": name,
                "dataset": "+".join(metrics["tasks"]), "seed": metrics["seed"], "prequential": r.get("prequential")}
        report.write_matrix(run_dir, view, prefix=f"{name.replace('@', '_')}_")
        if (r.get("prequential") or {}).get("rows"):
            report.prequential_chart(view, run_dir / f"{name.replace('@', '_')}_prequential.png", "training pairs")
    _headline_chart(metrics, run_dir / "a_last_bwt.png")


def _headline_chart(metrics: dict, path: Path) -> None:
    import matplotlib.pyplot as plt  # report.py selected the Agg backend

    names = list(metrics["runs"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(1.5 + 0.9 * len(names), 3.5))
    for offset, key, label in ((-0.2, "a_last", "A_last"), (0.2, "bwt", "BWT")):  # an undefined figure: no bar
        ax.bar(x + offset, [100 * _float(metrics["runs"][n]["summary"][key]) for n in names], 0.4, label=label)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_ylabel("percent")
    ax.set_title(f"{metrics['model']['spec']}: {len(metrics['tasks'])} tasks (seed {metrics['seed']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files.save_figure(fig, path, dpi=110)
    plt.close(fig)


def _float(value: float | None) -> float:
    """A figure of metrics.json as a number (null, an undefined figure: NaN)."""
    return float("nan") if value is None else float(value)


def _csv_cell(value: float | None, spec: str = ".4f") -> str:
    """A figure in results.csv: empty where it is undefined."""
    number = _float(value)
    return format(number, spec) if np.isfinite(number) else ""


def _prequential_accuracy(run: dict) -> float | None:
    """A run's prequential accuracy (None in a run folder written before runs had one)."""
    return run.get("prequential", {}).get("accuracy")


def summary_table(metrics: dict) -> str:
    tasks = metrics["tasks"]
    width = max([16, *(len(n) for n in (*metrics["runs"], *metrics.get("skipped", {})))])  # the run names' column
    head = (f"{'run':<{width}} {'A_last':>6} {'BWT':>7} {'preq':>6} {'NLL':>6}  "
            + " ".join(f"{t[:12]:>12}" for t in tasks)
            + "   memory bytes")
    lines = [f"{metrics['model']['spec']} (hidden {metrics['model']['hidden']}, key layer "
             f"{metrics['model']['key_layer']}), seed {metrics['seed']}; A_last (the MIITA paper's OP), BWT and "
             "final accuracy per task in %, preq: the training pairs answered before they were learned "
             "(test-then-train), NLL: mean teacher-forced NLL of the reference answers after the last task",
             "", head,
             "-" * len(head)]
    for name, r in metrics["runs"].items():
        final = r["acc_matrix"][-1]
        cells = " ".join(f"{M.figure_text(v, '.1f'):>12}" for v in final)
        mem = ", ".join(f"{k} {v:,}" for k, v in r["memory_bytes"].items()) or "-"
        s = r["summary"]
        preq = _prequential_accuracy(r)
        scores = (f"{M.figure_text(s['a_last'], '.1f'):>6} {M.figure_text(s['bwt'], '.1f'):>7} "
                  f"{M.figure_text(preq, '.1f'):>6} {M.figure_text(r['final_answer_nll'], '.2f', 1):>6}")
        lines.append(f"{name:<{width}} {scores}  {cells}   {mem}")
    for name, why in metrics.get("skipped", {}).items():
        lines.append(f"{name:<{width}} skipped: {why}")
    lines.append(f"\nwall seconds: {metrics['wall_seconds']['total']:.0f} total, "
                 f"{metrics['wall_seconds']['extract']:.0f} extraction; per run: "
                 + ", ".join(f"{n} {r['wall_seconds']['total']:.0f}" for n, r in metrics["runs"].items()))
    return "\n".join(lines)
