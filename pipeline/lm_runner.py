"""`memcl lm`: continual learning of (instruction -> short answer) tasks with a frozen small LM, several methods
side by side on one task stream, the memory methods at each byte budget (docs/methods.md, "MIITA").

Per task, through Arrow batches and actors:

    text pairs ──> LMEncoder.extract ──> (key, R_m) ──> MemoryManager.write_prototypes     (miita)
    text pairs ──────────────┴───────────────────────> MemoryManager.write_replay         (replay)
    text pairs ──> LMTrainer.train                                                        (lora)

then every seen task's test pairs are answered by generation with the method's state and scored by exact match:

    miita:  MemoryManager.prototype_state ──> LMEncoder.generate(adapted)
    replay: LMEncoder.query_keys ──> MemoryManager.demonstrations ──> LMEncoder.generate(demonstrations)
    lora:   LMTrainer.generate;   base: LMEncoder.generate

The extraction is the same for every method and budget, so it runs once per train batch. The frozen base model
has no state, so each task is answered once and its accuracy fills its column of every row.

Writes a run folder: config.yaml, metrics.json (per run: accuracy matrix, OP, BWT, memory bytes after every
task, wall seconds), results.csv (one row per run), <run>_acc_matrix.{csv,png}, <run>_acc_over_time.png,
op_bwt.png and predictions.jsonl (every generated answer).
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import ray

from actors.lm_encoder import LMEncoder
from actors.lm_trainer import LMTrainer
from actors.memory_manager import MemoryManager
from memcl_ops import metrics as M
from memcl_ops.arrow import schema as S
from memcl_ops.arrow.schema import ANSWER_NLL, PREDICTION
from memcl_ops.data.lm_tasks import LMStreamSpec, TextTask, build_stream, exact_match
from memcl_ops.mars.router import RouterConfig
from memcl_ops.methods import LMMethodConfig, family_methods, lm_method
from memcl_ops.miita.directions import MemoryConfig
from memcl_ops.models.causal_lm import LMSpec, check_lm_name
from pipeline import report
from pipeline.actor_cache import ActorCache
from pipeline.config import ConfigError, dump_config
from pipeline.progress import Progress
from pipeline.runner import ensure_ray


@dataclass(frozen=True)
class LMRuntimeConfig:
    address: str | None = None  # None: start Ray in-process; "auto": join a running cluster
    num_cpus: int | None = None  # for an in-process Ray; None: all cores
    object_store_mb: int = 512
    threads: int = 2  # torch threads in the LM actors
    batch_size: int = 16  # text pairs per Arrow batch
    # after each task, answer every seen task ("seen": the full accuracy matrix, Ā and forgetting) or only the new
    # one, then every task after the last ("new_and_final": the entries OP and BWT need, ~40 % less generation)
    evaluate: Literal["seen", "new_and_final"] = "seen"
    out: str = "runs"
    progress: bool = True


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
    runtime: LMRuntimeConfig = LMRuntimeConfig()


@dataclass(frozen=True)
class RunSpec:
    method: str
    budget: int | None  # None for the methods without memory

    @property
    def name(self) -> str:
        if self.budget is None:
            return self.method
        return f"{self.method}@{self.budget // 1024}KiB" if self.budget % 1024 == 0 else f"{self.method}@{self.budget}B"


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


class LMStream:
    """The task stream as Arrow text-pair batches in the object store (sample ids increase along the stream)."""

    def __init__(self, tasks: list[TextTask], batch_size: int):
        self.tasks = tasks
        self.train: list[list[ray.ObjectRef]] = []
        self.test: list[list[ray.ObjectRef]] = []
        next_id = 0
        for t, task in enumerate(tasks):
            for split, pairs in (("train", task.train), ("test", task.test)):
                refs = []
                for start in range(0, len(pairs), batch_size):
                    chunk = pairs[start:start + batch_size]
                    ids = np.arange(next_id, next_id + len(chunk))
                    next_id += len(chunk)
                    refs.append(ray.put(S.text_pair_batch(ids, [p.prompt for p in chunk], [p.answer for p in chunk],
                                                          task_ids=np.full(len(chunk), t), stream=task.name)))
                getattr(self, split).append(refs)


class LMPipeline:
    """The actors of an LM run and what each method does with them."""

    def __init__(self, config: LMRunConfig, stream: LMStream, actors: ActorCache):
        self.config, self.stream, self.actors = config, stream, actors
        rt = config.runtime
        self.encoder = actors.get("lm_encoder", LMEncoder, {"num_cpus": 1}, config.model, rt.threads)
        self.info = ray.get(self.encoder.info.remote())
        # extraction is method-independent: once per train batch, kept by reference for every run
        self.extracted = [[self.encoder.extract.remote(b) for b in batches] for batches in stream.train]
        self.query_keys: dict[int, list[ray.ObjectRef]] = {}
        self.memory: ray.actor.ActorHandle | None = None
        self.trainer: ray.actor.ActorHandle | None = None

    def start(self, spec: RunSpec) -> None:
        cfg, hidden = self.config, self.info["hidden"]
        if "byte-budget" in lm_method(spec.method).tags:
            self.memory = self.actors.get("memory", MemoryManager, {"num_cpus": 0}, hidden,
                                          RouterConfig(initial_slots=0), 0, cfg.seed, 1)
            if spec.method == "miita":
                ray.get(self.memory.use_prototypes.remote(hidden, hidden, self._memory_config(spec)))
            else:
                ray.get(self.memory.use_replay.remote(hidden, replace(cfg.method.replay, budget_bytes=spec.budget)))
        if spec.method == "lora":
            self.trainer = self.actors.get("lm_trainer", LMTrainer, {"num_cpus": 0}, cfg.model, cfg.method.finetune,
                                           cfg.seed, cfg.runtime.threads)

    def _memory_config(self, spec: RunSpec) -> MemoryConfig:
        return replace(self.config.method.memory, budget_bytes=spec.budget)

    def learn(self, spec: RunSpec, task: int) -> dict:
        """Absorb one task's training pairs; returns what the method reports about it."""
        if spec.method == "miita":
            outcomes = ray.get([self.memory.write_prototypes.remote(e) for e in self.extracted[task]])
            return {k: sum(o[k] for o in outcomes) for k in outcomes[0]}
        if spec.method == "replay":
            stored = ray.get([self.memory.write_replay.remote(b, e)
                              for b, e in zip(self.stream.train[task], self.extracted[task])])
            return {"stored": stored[-1]}
        if spec.method == "lora":
            return {"epoch_losses": ray.get(self.trainer.train.remote(*self.stream.train[task]))}
        return {}

    def answer(self, spec: RunSpec, task: int) -> list[ray.ObjectRef]:
        """Prediction batches for one task's test pairs under the method's current state."""
        tokens = self.stream.tasks[task].max_answer_tokens
        batches = self.stream.test[task]
        if spec.method == "lora":
            return [self.trainer.generate.remote(b, tokens) for b in batches]
        if spec.method == "miita":
            state = self.memory.prototype_state.remote()
            return [self.encoder.generate.remote(b, tokens, state, self._memory_config(spec), self.config.method.adapt)
                    for b in batches]
        if spec.method == "replay":
            if task not in self.query_keys:
                self.query_keys[task] = [self.encoder.query_keys.remote(b) for b in batches]
            return [self.encoder.generate.remote(b, tokens, demonstrations=self.memory.demonstrations.remote(k))
                    for b, k in zip(batches, self.query_keys[task])]
        return [self.encoder.generate.remote(b, tokens) for b in batches]

    def memory_bytes(self, spec: RunSpec) -> dict[str, int]:
        if "byte-budget" in lm_method(spec.method).tags:
            entry = "prototypes" if spec.method == "miita" else "replay_text"
            return {entry: ray.get(self.memory.memory_report.remote())[entry]}
        if spec.method == "lora":
            return ray.get(self.trainer.memory_bytes.remote())
        return {}


def score(predictions: list[pa.RecordBatch]) -> tuple[float, float, list[dict]]:
    """Exact-match accuracy and mean answer NLL of prediction batches, and one record per answer."""
    rows = []
    for batch in predictions:
        columns = (S.sample_ids_to_numpy(batch).tolist(), *(batch.column(c).to_pylist()
                                                             for c in (S.TEXT, S.ANSWER, PREDICTION, ANSWER_NLL)))
        for sid, prompt, answer, pred, nll in zip(*columns):
            rows.append({"sample_id": sid, "prompt": prompt, "answer": answer, "prediction": pred,
                         "correct": exact_match(pred, answer), "answer_nll": nll})
    if not rows:
        return float("nan"), float("nan"), rows
    return float(np.mean([r["correct"] for r in rows])), float(np.mean([r["answer_nll"] for r in rows])), rows


def run(config: LMRunConfig | None = None, *, run_dir: Path | None = None, progress: bool | None = None,
        actors: ActorCache | None = None) -> dict:
    """Run every method (and budget) of `config` over its task stream; returns the metrics written to
    metrics.json. `actors`: reuse the actors of earlier runs (they are reset); by default they are killed after."""
    config = config or LMRunConfig()
    try:  # before Ray starts: a bad config fails at once, with one line
        specs = run_specs(config)
        check_lm_name(config.model.name)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    own = actors is None
    actors = actors or ActorCache()
    try:
        return _run(config, specs, run_dir, progress, actors)
    finally:
        if own:
            actors.close()


def _run(config: LMRunConfig, specs: list[RunSpec], run_dir: Path | None, progress: bool | None,
         actors: ActorCache) -> dict:
    started = time.perf_counter()
    tasks = build_stream(config.stream)
    ensure_ray(config)
    bars = Progress(enabled=config.runtime.progress if progress is None else progress)
    run_dir = run_dir or new_lm_run_dir(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, run_dir / "config.yaml")
    stream = LMStream(tasks, config.runtime.batch_size)
    t0 = time.perf_counter()
    pipe = LMPipeline(config, stream, actors)
    bars.wait([ref for refs in pipe.extracted for ref in refs], "extract hidden states", "batch")
    extract_seconds = time.perf_counter() - t0
    runs, predictions = {}, []
    base_scores: dict[int, tuple[float, float]] = {}  # the frozen base answers each task once
    for spec in specs:
        runs[spec.name], rows = _one_run(config, pipe, spec, tasks, bars, base_scores)
        predictions += rows
    metrics = {
        "model": {**pipe.info, "spec": config.model.name}, "seed": config.seed,
        "tasks": [t.name for t in tasks], "answers": {t.name: list(t.answers) for t in tasks},
        "runs": runs, "wall_seconds": {"total": time.perf_counter() - started, "extract": extract_seconds},
        "actor_busy_seconds": {name: ray.get(actors.handle(name).timings.remote())
                               for name in ("lm_encoder", "memory", "lm_trainer") if name in actors.handles},
    }
    write_lm_run(run_dir, metrics, predictions)
    metrics["run_dir"] = str(run_dir)
    return metrics


def _one_run(config: LMRunConfig, pipe: LMPipeline, spec: RunSpec, tasks: list[TextTask], bars: Progress,
             base_scores: dict[int, tuple[float, float]]) -> tuple[dict, list[dict]]:
    """One method (at one budget) over the whole stream: learn each task, then answer the tasks due."""
    started = time.perf_counter()
    pipe.start(spec)
    acc = np.full((len(tasks), len(tasks)), np.nan)
    nll = np.full_like(acc, np.nan)
    log, wall, predictions = [], {"learn": 0.0, "evaluate": 0.0}, []
    bar = bars.bar(f"{spec.name}: tasks", len(tasks), unit="task")
    for i in range(len(tasks)):
        t = time.perf_counter()
        learned = pipe.learn(spec, i)
        wall["learn"] += time.perf_counter() - t
        t = time.perf_counter()
        final = i == len(tasks) - 1
        for j in range(i + 1) if final or config.runtime.evaluate == "seen" else [i]:
            if spec.method == "base" and j in base_scores:
                acc[i, j], nll[i, j] = base_scores[j]
                continue
            answers = bars.wait(pipe.answer(spec, j), f"{spec.name}: answer {tasks[j].name}", "batch", leave=False)
            acc[i, j], nll[i, j], rows = score(answers)
            predictions += [{"run": spec.name, "after_task": i, "task": j, **r} for r in rows]
            if spec.method == "base":
                base_scores[j] = acc[i, j], nll[i, j]
        wall["evaluate"] += time.perf_counter() - t
        log.append({"task": i, "name": tasks[i].name, "learned": learned, "memory_bytes": pipe.memory_bytes(spec),
                    "accuracy": {tasks[j].name: acc[i, j] for j in range(i + 1) if not np.isnan(acc[i, j])}})
        bar.update(1)
        bars.note(f"{spec.name} after {tasks[i].name}: mean accuracy on the tasks answered "
                  f"{np.nanmean(acc[i, :i + 1]):.3f}")
    bar.close()
    full = not np.isnan(acc[np.tril_indices(len(tasks))]).any()
    return {
        "method": spec.method, "budget_bytes": spec.budget, "acc_matrix": acc.tolist(),
        "op": M.final_accuracy(acc), "bwt": M.backward_transfer(acc),
        "a_mean": M.average_incremental_accuracy(acc) if full else None,
        "forgetting": M.forgetting(acc) if full else None,
        # teacher-forced NLL of the reference answers under the method's final state (lower is better)
        "nll_matrix": nll.tolist(), "final_answer_nll": float(np.mean(nll[-1])),
        "memory_bytes": log[-1]["memory_bytes"], "log": log,
        "wall_seconds": {"total": time.perf_counter() - started, **wall}}, predictions


def new_lm_run_dir(config: LMRunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model = config.model.name.replace(":", "_").replace("/", "_")
    for n in range(1000):
        path = Path(config.runtime.out) / f"{stamp}-lm-{model}-s{config.seed}{f'-{n}' if n else ''}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a fresh run folder under {config.runtime.out}")


def write_lm_run(run_dir: Path, metrics: dict, predictions: list[dict]) -> None:
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float))
    with open(run_dir / "predictions.jsonl", "w") as f:
        for row in predictions:
            f.write(json.dumps(row) + "\n")
    render_lm(run_dir, metrics)


def render_lm(run_dir: Path, metrics: dict) -> None:
    """results.csv, the accuracy matrix files of every run and the OP/BWT chart, from a metrics dict."""
    with open(run_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "method", "budget_bytes", "op", "bwt", "a_mean", "final_answer_nll", "memory_bytes",
                         "seconds"])
        for name, r in metrics["runs"].items():
            a_mean = "" if r["a_mean"] is None else f"{r['a_mean']:.4f}"
            writer.writerow([name, r["method"], r["budget_bytes"] or "", f"{r['op']:.4f}", f"{r['bwt']:.4f}", a_mean,
                             f"{r['final_answer_nll']:.3f}", sum(r["memory_bytes"].values()),
                             f"{r['wall_seconds']['total']:.1f}"])
    for name, r in metrics["runs"].items():
        view = {"acc_matrix": r["acc_matrix"], "visits": list(range(len(metrics["tasks"]))), "method": name,
                "dataset": "+".join(metrics["tasks"]), "seed": metrics["seed"]}
        report.write_matrix(run_dir, view, prefix=f"{name.replace('@', '_')}_")
    _op_bwt_chart(metrics, run_dir / "op_bwt.png")


def _op_bwt_chart(metrics: dict, path: Path) -> None:
    import matplotlib.pyplot as plt  # report.py selected the Agg backend

    names = list(metrics["runs"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(1.5 + 0.9 * len(names), 3.5))
    ax.bar(x - 0.2, [100 * metrics["runs"][n]["op"] for n in names], 0.4, label="OP")
    ax.bar(x + 0.2, [100 * metrics["runs"][n]["bwt"] for n in names], 0.4, label="BWT")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_ylabel("percent")
    ax.set_title(f"{metrics['model']['spec']}: {len(metrics['tasks'])} tasks (seed {metrics['seed']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(metrics: dict) -> str:
    tasks = metrics["tasks"]
    head = (f"{'run':<16} {'OP':>6} {'BWT':>7} {'NLL':>6}  " + " ".join(f"{t[:12]:>12}" for t in tasks)
            + "   memory bytes")
    lines = [f"{metrics['model']['spec']} (hidden {metrics['model']['hidden']}, key layer "
             f"{metrics['model']['key_layer']}), seed {metrics['seed']}; OP, BWT and final accuracy per task in %, "
             "NLL: mean teacher-forced NLL of the reference answers after the last task", "", head,
             "-" * len(head)]
    for name, r in metrics["runs"].items():
        final = r["acc_matrix"][-1]
        cells = " ".join(f"{100 * v:12.1f}" for v in final)
        mem = ", ".join(f"{k} {v:,}" for k, v in r["memory_bytes"].items()) or "-"
        scores = f"{100 * r['op']:6.1f} {100 * r['bwt']:7.1f} {r['final_answer_nll']:6.2f}"
        lines.append(f"{name:<16} {scores}  {cells}   {mem}")
    lines.append(f"\nwall seconds: {metrics['wall_seconds']['total']:.0f} total, "
                 f"{metrics['wall_seconds']['extract']:.0f} extraction; per run: "
                 + ", ".join(f"{n} {r['wall_seconds']['total']:.0f}" for n, r in metrics["runs"].items()))
    return "\n".join(lines)
