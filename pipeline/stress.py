"""`memcl stress`: a long-horizon drift stream (generated in feature space, no encoder) through the real actor
pipeline. After every round it samples the slot count against SGSE's bound so far, expansions, memory bytes
(slots, monitor references, prototypes, bank, head), the resident memory of every actor and of the driver, the
Ray object-store usage and the throughput; it writes `stress.csv`, `stress.png` and `stress.json` (with the
checks below) into the run folder. `compare` runs the same stream once per SGSE signal, the method's own first.

Checks: the final slot count stays within SGSE's bound S_0 + N_T + αM (N_T: the novel events the generator
injected, M: the tests the monitor ran, α = 0.05); on revisits (visits that start no novel regime) at most α of
the tests expand; at least 95 % of the novel events (each task's first visit, each abrupt shift) are detected
within 3 blocks; the resident memory of every process grows by less than 3 % between 10 % and 100 % of the
stream; the throughput of the last tenth of the stream is at least 0.95 of the second tenth's; every store with a
declared byte budget (the monitor's per-sample references, the consolidation buffer) is
within it at every sample, and each store's bytes at 10 % and 100 % of the stream are reported beside it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import time
from pathlib import Path
from typing import get_args

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import psutil
import ray

from memcl.pipeline import preflight, runner
from memcl.pipeline.config import ConfigError, RunConfig, load_config
from memcl.pipeline.errors import RunInterrupted, RunStopped
from memcl.pipeline.features import FeaturePipeline
from memcl.pipeline.loop import discard_unstarted, new_run_dir
from memcl.pipeline.roles import ensure_ray
from memcl_ops import files
from memcl_ops.mars.sgse import Signal
from memcl_ops.methods import METHODS
from memcl_ops.metrics import figure_text
from memcl_ops.rounds import plan_rounds

ALPHA = 0.05  # SGSE's per-test false-expansion bound
DETECTION_BLOCKS = 3  # a novel event counts as detected if a test within this many blocks of its start expands
DETECTION_RATE = 0.95
STRESS_DEFAULTS: dict[str, object] = {
    "data.dataset": "drift",
    "method.stage1.optim.epochs": 2,
    "method.stage2.optim.epochs": 3,
    "runtime.evaluate_every": 10,
    "runtime.evaluate_window": 5,
    "runtime.progress": False,
    "runtime.out": "runs/stress",
}


def stress_config(tasks: int, task_free: bool, overrides: dict[str, object] | None = None) -> RunConfig:
    return load_config(overrides={**STRESS_DEFAULTS, "data.drift.visits": tasks, "stream.task_free": task_free,
                                  **(overrides or {})})


def object_store_bytes() -> int | None:
    """Plasma usage across the cluster, from Ray's memory summary (needs grpcio)."""
    from ray._private.internal_api import memory_summary

    address = ray.get_runtime_context().gcs_address
    match = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(address=address, stats_only=True))
    return int(match.group(1)) * 2**20 if match else None


class Sampler:
    """The on_round hook: a row of measurements every `stride` rounds (reading the object store costs ~0.2 s)."""

    def __init__(self, samples_per_round: list[int], initial_slots: int, event_starts: list[int], rows: int = 200):
        self.samples_per_round, self.initial_slots = samples_per_round, initial_slots
        self.event_starts = np.array(event_starts)
        self.stride = max(len(samples_per_round) // rows, 1)
        self.rows: list[dict] = []
        self.test_steps: list[int] = []
        self.start = self.last = time.perf_counter()
        self.last_round = -1

    def _rss(self, pipe: FeaturePipeline) -> dict[str, int | None]:
        """Resident bytes, the bytes unique to the process (USS: its RSS less the pages it shares, such as Ray's
        object store mapped into every process that reads it) and PID of every role's process and the driver's,
        read anew each time: a fault (or chaos mode) may have restarted an actor since the last sample; one that
        vanished since its PID was read is not sampled (None)."""
        rss: dict[str, int | None] = {}
        for role, pid in [*pipe.roles.actors.pids(pipe.roles.names).items(), ("driver", os.getpid())]:
            rss[f"pid.{role}"] = pid
            try:
                memory = psutil.Process(pid).memory_full_info()
                rss[f"rss.{role}"], rss[f"uss.{role}"] = memory.rss, memory.uss
            except psutil.NoSuchProcess:
                rss[f"rss.{role}"] = rss[f"uss.{role}"] = None
        return rss

    def __call__(self, r: int, state: runner.RunState, pipe: FeaturePipeline) -> None:
        last_round = r == len(self.samples_per_round) - 1
        if (r + 1) % self.stride and not last_round:
            return
        now = time.perf_counter()
        interval = sum(self.samples_per_round[self.last_round + 1:r + 1])
        samples = sum(self.samples_per_round[:r + 1])
        memory = state.last_log["memory"]
        slots = memory.get("num_slots", 0)
        x = pipe.x
        tests = x.get(x.call("monitor", "counters"))["tests"] if x.has("monitor") else 0
        self.rows.append({
            "round": r, "elapsed_s": now - self.start, "samples": samples,
            "throughput": interval / (now - self.last), "slots": slots, "expansions": slots - self.initial_slots,
            "bound": self.initial_slots + int((self.event_starts < samples).sum()) + ALPHA * tests,
            **{f"bytes.{k}": v for k, v in memory.items() if k != "num_slots"},
            **self._rss(pipe), "object_store": object_store_bytes() or 0})
        if last_round and x.has("monitor"):
            self.test_steps = x.get(x.call("monitor", "test_steps"))
        self.last, self.last_round = time.perf_counter(), r  # the sampling itself is not charged to the stream


def novelty(event_starts: list[int], visit_samples: int, test_steps: list[int], expansion_steps: list[int],
            block: int) -> dict:
    """Detection of every novel event and false expansions on revisits, from the stream positions (samples
    observed) of the monitor's tests and expansions. A test's block ends at its step; it belongs to the visit of
    its last sample. Revisits are the visits that start no novel event."""
    tests, expansions = np.array(test_steps, dtype=np.int64), np.array(expansion_steps, dtype=np.int64)
    novel_visits = {s // visit_samples for s in event_starts}
    delays = []
    for start in event_starts:
        hits = expansions[(expansions > start) & (expansions <= start + DETECTION_BLOCKS * block)]
        delays.append(int(np.ceil((hits.min() - start) / block)) if hits.size else None)
    on_revisit = ~np.isin((tests - 1) // visit_samples, list(novel_visits))
    false = int((~np.isin((expansions - 1) // visit_samples, list(novel_visits))).sum())
    revisit_tests = int(on_revisit.sum())
    detected = [d for d in delays if d is not None]
    return {"events": len(event_starts), "detected": len(detected),
            "detection_rate": len(detected) / len(event_starts) if event_starts else 1.0,
            "median_delay_blocks": float(np.median(detected)) if detected else None, "delays_blocks": delays,
            "revisit_tests": revisit_tests, "false_expansions": false,
            "false_rate": false / revisit_tests if revisit_tests else 0.0}


def rss_growth(rows: list[dict], tenth: int, kind: str = "rss") -> dict[str, float]:
    """Per role, how much its process's resident memory (`kind` "uss": its unique memory) grew from 10 % of the
    stream (or from its process's first sample, where a fault restarted the actor later) to the end; a process
    sampled fewer than twice is left out."""
    growth = {}
    for key in [k for k in rows[-1] if k.startswith(f"{kind}.")]:
        role = key[len(kind) + 1:]
        late = next((r for r in reversed(rows) if r.get(key) is not None), None)
        if late is None:
            continue
        same = [r for r in rows[tenth - 1:] if r.get(f"pid.{role}") == late[f"pid.{role}"] and r.get(key) is not None]
        if len(same) >= 2:
            growth[role] = late[key] / same[0][key] - 1
    return growth


RSS_GROWTH = 0.03  # per process, from the second tenth of the stream to its end
THROUGHPUT_RATIO = 0.95  # the last tenth's throughput over the second tenth's, at least


def budgets(config: RunConfig) -> dict[str, int]:
    """The stores of the memory report that declare a byte budget, and that budget."""
    return {"monitor.rows": config.method.sgse.reference_bytes, "buffer": config.stream.buffer.bytes}


def stores(rows: list[dict], tenth: int, budget: dict[str, int]) -> dict[str, dict]:
    """Each store of the memory report: its bytes at 10 % of the stream and at the end, its most, and its budget
    where it declares one (within it: at every sample)."""
    out = {}
    for key in [k for k in rows[-1] if k.startswith("bytes.")]:
        name, seen = key[6:], [r.get(key) or 0 for r in rows]
        out[name] = {"at_10pct": seen[tenth - 1], "at_end": seen[-1], "max": max(seen), "budget": budget.get(name),
                     "holds": name not in budget or max(seen) <= budget[name]}
    return out


def checks(rows: list[dict], metrics: dict, info_novel: int, initial_slots: int, detection: dict,
           budget: dict[str, int]) -> dict:
    n = len(rows)
    tenth = max(n // 10, 1)
    tests = metrics["slots"]["monitor"].get("tests", 0)
    bound = initial_slots + info_novel + ALPHA * tests
    final_slots = rows[-1]["slots"]
    growth = rss_growth(rows, tenth)
    second = np.mean([r["throughput"] for r in rows[tenth:2 * tenth]])
    last = np.mean([r["throughput"] for r in rows[-tenth:]])
    batches = sum(entry["batches"] for entry in metrics["round_log"])
    return {
        "slots": {"final": final_slots, "initial": initial_slots, "novel_events": info_novel, "tests": tests,
                  "bound": bound, "holds": final_slots <= bound},
        "novelty": {**detection, "false_rate_holds": detection["false_rate"] <= ALPHA,
                    "detection_holds": detection["detection_rate"] >= DETECTION_RATE},
        "monitor_ms_per_batch": 1000 * metrics["actor_busy_seconds"].get("monitor.monitor", 0.0) / max(batches, 1),
        "rss_growth_10_to_100pct": growth, "rss_holds": all(g < RSS_GROWTH for g in growth.values()),
        "uss_growth_10_to_100pct": rss_growth(rows, tenth, "uss"),
        # a slower end of the stream is the regression to catch; a faster one is not
        "throughput": {"second_tenth": second, "last_tenth": last, "ratio": last / second,
                       "holds": last / second >= THROUGHPUT_RATIO},
        "stores": (kept := stores(rows, tenth, budget)), "stores_hold": all(v["holds"] for v in kept.values()),
    }


def write(run_dir: Path, rows: list[dict], result: dict) -> None:
    with files.atomic_open(run_dir / "stress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    files.write_json(run_dir / "stress.json", result)
    x = np.array([r["samples"] for r in rows])
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    axes[0, 0].plot(x, [r["slots"] for r in rows], label="slots")
    axes[0, 0].plot(x, [r["bound"] for r in rows], color="r", ls="--", label="S0 + N_T + αM so far")
    axes[0, 0].set_ylabel("slots")
    axes[0, 0].legend(fontsize=8)
    for key in [k for k in rows[0] if k.startswith("bytes.")]:
        axes[0, 1].plot(x, [r[key] / 2**20 for r in rows], label=key[6:])
    axes[0, 1].set_ylabel("memory (MiB)")
    axes[0, 1].legend(fontsize=8)
    for key in [k for k in rows[0] if k.startswith("rss.")]:
        axes[1, 0].plot(x, [np.nan if r[key] is None else r[key] / 2**20 for r in rows], label=key[4:])
    axes[1, 0].plot(x, [r["object_store"] / 2**20 for r in rows], "k:", label="object store")
    axes[1, 0].set_ylabel("resident (MiB)")
    axes[1, 0].legend(fontsize=7, ncol=2)
    axes[1, 1].plot(x, [r["throughput"] for r in rows])
    axes[1, 1].set_ylabel("samples/s")
    for ax in axes[1]:
        ax.set_xlabel("samples streamed")
    fig.tight_layout()
    files.save_figure(fig, run_dir / "stress.png", dpi=110)
    plt.close(fig)


def stress(tasks: int = 1000, task_free: bool = False, overrides: dict[str, object] | None = None,
           actors: runner.ActorCache | None = None) -> dict:
    config = stress_config(tasks, task_free, overrides)
    spec = preflight.check_run(config)  # a bad config fails in a second, before Ray starts
    ensure_ray(config)
    from memcl_ops.data.sources import DriftStream

    drift = DriftStream(config.data.drift, task_free)
    info = drift.describe()
    rounds = plan_rounds(info, task_free, config.method.consolidate_every)
    per_visit = config.data.drift.train_per_visit
    event_starts = [v * per_visit for v in drift.novel_visits()]
    sampler = Sampler([sum(drift.batch_rows(i) for _, i in r) for r in rounds], config.method.router.initial_slots,
                      event_starts)
    signal = spec.resolve(config.method).sgse.signal
    # the drift stream's name ends in its own seed: the run's seed is named only where it differs
    run_dir = new_run_dir(config.runtime.out, f"{spec.name}-{signal}-{info.name}{'-taskfree' if task_free else ''}"
                          f"{'-chaos' if config.runtime.chaos_seconds else ''}"
                          f"{'' if config.seed == config.data.drift.seed else f'-seed{config.seed}'}")
    try:
        metrics = runner.run(config, run_dir=run_dir, actors=actors, on_round=sampler).metrics
    except (RunStopped, RunInterrupted) as stop:
        # a stress run keeps its resource samples in memory: `memcl run --resume` finishes the stream, not the checks
        next_step = (f"memcl stress does not resume a run; `memcl run --resume {run_dir}` finishes its stream without "
                     "the stress samples and checks, or run memcl stress again"
                     + (" with a longer --chaos interval or a larger runtime.max_recoveries"
                        if config.runtime.chaos_seconds and isinstance(stop, RunStopped) else ""))
        if isinstance(stop, RunStopped):
            raise RunStopped(stop.why, run_dir, next_step=next_step) from stop
        raise RunInterrupted(run_dir, next_step=next_step) from None
    except Exception:
        discard_unstarted(run_dir)
        raise
    expansion_steps = [e["test_step"] for e in metrics["slots"]["expansions"]]
    detection = novelty(event_starts, per_visit, sampler.test_steps, expansion_steps, config.method.sgse.block_size)
    result = {"tasks": tasks, "task_free": task_free, "distinct_tasks": config.data.drift.tasks,
              "method": config.method.name, "signal": signal,
              "seed": config.data.drift.seed,
              "samples": metrics["samples"], "wall_seconds": metrics["wall_seconds"]["total"],
              "kills": metrics.get("chaos", {}).get("kills", 0), "recoveries": metrics["recoveries"],
              **checks(sampler.rows, metrics, info.novel_shifts, config.method.router.initial_slots, detection,
                       budgets(config))}
    write(Path(metrics["run_dir"]), sampler.rows, result)
    result["run_dir"] = metrics["run_dir"]
    return result


def signals_to_compare(tasks: int, task_free: bool, overrides: dict[str, object] | None,
                       signals: list[str] | None) -> list[str]:
    """The SGSE signals a comparison runs: `signals` as given, or by default the method's own signal first and then
    the other one (only the own one where the method fixes its signal). ConfigError where a method without SGSE is
    asked for signals or a given signal contradicts the one the method fixes."""
    config = stress_config(tasks, task_free, overrides)
    spec = preflight.check_run(config)
    if not spec.sgse:
        raise ConfigError(f"method.name: {spec.name} expands no slots (no SGSE), so it has no signal to stress; "
                          "methods with SGSE: " + ", ".join(n for n, s in METHODS.items() if s.sgse))
    own = spec.resolve(config.method).sgse.signal
    fixed = spec.fixed.get("sgse", {}).get("signal")
    if signals is None:
        return [own] if fixed else [own, *(s for s in get_args(Signal) if s != own)]
    if fixed and set(signals) != {fixed}:
        raise ConfigError(f"--signals: method {spec.name} fixes method.sgse.signal = {fixed}; "
                          f"{','.join(signals)} would not be what runs")
    return signals


def compare(tasks: int, task_free: bool, overrides: dict[str, object] | None, signals: list[str] | None = None,
            chaos: float | None = None) -> list[dict]:
    """The same stream once per SGSE signal (`signals_to_compare`; every run's config checked before the first run
    starts). With `chaos` (seconds), each signal's stream runs fault-free and then in chaos mode, and the chaos run
    says whether it ended with the fault-free run's result (`same_as_fault_free`)."""
    runs = [{**(overrides or {}), "method.sgse.signal": signal}
            for signal in signals_to_compare(tasks, task_free, overrides, signals)]
    for run_overrides in runs:
        preflight.check_run(stress_config(tasks, task_free, {**run_overrides, "runtime.chaos_seconds": chaos or 0}))
    results = []
    for run_overrides in runs:
        results.append(stress(tasks, task_free, {**run_overrides, "runtime.chaos_seconds": 0} if chaos
                              else run_overrides))
        if chaos:
            fault_free = results[-1]
            results.append(stress(tasks, task_free, {**run_overrides, "runtime.chaos_seconds": chaos}))
            results[-1]["same_as_fault_free"] = same_result(Path(fault_free["run_dir"]), Path(results[-1]["run_dir"]))
    return results


def same_result(first: Path, second: Path) -> bool:
    """Whether two run folders hold the same result: accuracy matrix, slot history, memory bytes and samples."""
    a, b = (json.loads((folder / "metrics.json").read_text()) for folder in (first, second))
    return all(a[key] == b[key] for key in ("acc_matrix", "memory_bytes", "samples")) and (
        a["slots"]["history"] == b["slots"]["history"])


def table(results: list[dict]) -> str:
    """The checks of several stress runs side by side (markdown)."""
    def mark(ok: bool) -> str:
        return "yes" if ok else "NO"
    lines = ["| method | signal | seed | slots (bound) | revisit false expansions / tests | novel events detected "
             "(<= 3 blocks) | median delay (blocks) | monitor ms / batch | max RSS growth | throughput last / "
             "second tenth | stores within budget | kills / replays | fault-free result |", "|---" * 13 + "|"]
    for r in results:
        s, nv, tp = r["slots"], r["novelty"], r["throughput"]
        delay = "-" if nv["median_delay_blocks"] is None else f"{nv['median_delay_blocks']:.0f}"
        lines.append(
            f"| {r['method']} | {r['signal']} | {r['seed']} | {s['final']} ({s['bound']:.1f}) {mark(s['holds'])} | "
            f"{nv['false_expansions']} / {nv['revisit_tests']} = {figure_text(nv['false_rate'], '.4f', 1)} "
            f"{mark(nv['false_rate_holds'])} | "
            f"{nv['detected']} / {nv['events']} {mark(nv['detection_holds'])} | {delay} | "
            f"{figure_text(r['monitor_ms_per_batch'], '.2f', 1)} | "
            f"{figure_text(max(r['rss_growth_10_to_100pct'].values(), default=None), '+.1f')} % "
            f"{mark(r['rss_holds'])} | {figure_text(tp['ratio'], '.2f', 1)} {mark(tp['holds'])} | "
            f"{mark(r['stores_hold'])} | {r['kills']} / {r['recoveries']} | "
            f"{mark(r['same_as_fault_free']) if 'same_as_fault_free' in r else '-'} |")
    return "\n".join(lines)
