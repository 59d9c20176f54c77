"""`memcl bench SUITE`: every method side by side on one stream, in one process tree.

A suite (pipeline/suites.py) is a stream, as dotted overrides of the embedded default `RunConfig`, and
optionally the methods to compare; without a list it compares every method registered in
`memcl_ops.methods.METHODS` that learns on the frozen features and can run the stream, so methods added later
join the table on their own. All runs share one `ActorCache` (actors are reset between runs, not restarted)
and one feature cache (the stream is encoded once, by the first run).

Each seed changes the learners' initialisation and minibatch order (`RunConfig.seed`); the stream (class
order, samples) is the same for every method and seed. Outputs, in `<out>/<suite>/`: `results.md` and
`results.csv` (mean ± std over seeds), `runs.csv` (one row per run), `curves.png` (mean accuracy over the
tasks seen so far after each task, per method), and the run folders under `runs/`.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from memcl.pipeline import preflight, runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import ConfigError, RunConfig, load_config
from memcl.pipeline.features import encode_stream
from memcl.pipeline.report import accuracy_axis
from memcl.pipeline.suites import Suite, suite
from memcl_ops import files
from memcl_ops.methods import METHODS, family_methods, method_spec
from memcl_ops.metrics import figure_text

TRAIN_PHASES = ("stream", "consolidate")  # wall-clock phases that make up "train time"
METRICS = ("a_last", "a_mean", "forgetting", "bwt", "prequential", "near_future", "let_go")
HEADERS = {"a_last": "A_last", "a_mean": "Ā", "forgetting": "forgetting", "bwt": "BWT", "prequential": "preq.",
           "near_future": "near-future", "let_go": "let go"}


def suite_methods(chosen: Suite, config: RunConfig, methods: list[str] | None = None) -> list[str]:
    """The methods to compare: those asked for (checked), else the suite's, else every registered method that
    learns on the frozen features (registry order); of those, the ones that can run the stream (a task-free
    stream rules out methods that need task boundaries)."""
    names = methods or list(chosen.methods or family_methods("features"))
    for name in names:
        method_spec(name)  # unknown names fail here, naming the known ones
    return [n for n in names if METHODS[n].task_free or not config.stream.task_free]


@dataclass
class RunRow:
    method: str
    seed: int
    summary: dict[str, float]
    curve: list[float]  # mean accuracy over the tasks seen so far, after each visit
    train_seconds: float
    memory_bytes: int
    run_dir: str
    label: str = ""  # its name in the tables: the method, or "derpp@M" for DER++ at the bytes of method M

    def __post_init__(self) -> None:
        self.label = self.label or self.method

    @classmethod
    def of(cls, metrics: dict, label: str = "") -> RunRow:
        wall = metrics["wall_seconds"]
        prequential = metrics.get("prequential") or {}
        done = metrics.get("consolidation") or {}
        let_go = done["let_go"] / max(done["observed"], 1) if done else None
        online = {"prequential": prequential.get("accuracy"), "near_future": prequential.get("near_future_accuracy"),
                  "let_go": let_go}
        return cls(metrics["method"], metrics["seed"],
                   {k: v for k, v in {**metrics["summary"], **online}.items() if v is not None},
                   [float(np.nanmean(row)) if not np.isnan(row).all() else np.nan
                    for row in np.array(metrics["acc_matrix"], dtype=float)],
                   sum(wall.get(k, 0.0) for k in TRAIN_PHASES), int(sum(metrics["memory_bytes"].values())),
                   metrics["run_dir"], label)


def read_runs(folder: Path) -> list[RunRow]:
    """The rows a bench wrote to `<folder>/runs.csv` (to re-render its tables and plot without re-running)."""
    path = Path(folder) / "runs.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no bench results to render (run `memcl bench` first)")
    with open(path, newline="") as f:
        return [RunRow(r["method"], int(r["seed"]), {m: float(r[m]) for m in METRICS if r.get(m) not in (None, "nan")},
                       [float(v) for v in r["curve"].split()], float(r["train_seconds"]), int(r["memory_bytes"]),
                       r["run_dir"], r.get("label", "")) for r in csv.DictReader(f)]


def bench(name: str, *, seeds: int = 3, methods: list[str] | None = None, out: str | Path = "runs/bench",
          overrides: dict[str, object] | None = None, actors: ActorCache | None = None,
          progress: bool = False, fan_out: float = 0.0, equal_bytes: list[str] | None = None,
          log=print) -> list[RunRow]:
    """Run every method of suite `name` for seeds 0..seeds-1; rewrites the result files after each run so an
    interrupted bench keeps what it finished. Returns one row per run, in (method, seed) order, the rows at equal
    bytes (`equal_bytes`, module docstring) after them.

    `fan_out`: run the (method, seed) runs side by side over the cluster, on as many bench workers as its CPUs hold
    at this many CPUs each, every worker reusing its own actors from run to run (0: one after another in this
    process, sharing `actors`). Each run is seeded and deterministic, so both give the same rows."""
    chosen = suite(name)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    folder = Path(out) / chosen.name
    # One torch thread per learner actor unless asked otherwise: the runs go one at a time, and on a 2-core
    # machine shared with other work a second thread mostly waits for a core.
    config = load_config(overrides={"runtime.actor_threads": 1, **chosen.overrides, **(overrides or {}),
                                    "runtime.checkpoint": False, "runtime.progress": progress,
                                    "runtime.out": str(folder / "runs")})
    names = suite_methods(chosen, config, methods)
    equal_bytes = list(equal_bytes or [])
    buffered = check_equal_bytes(names, equal_bytes)
    # folders absolute: a run fanned out to a Ray worker does not share this process's working directory
    rt = config.runtime
    config = replace(config, runtime=replace(rt, out=str(Path(rt.out).resolve()),
                                             cache_dir=str(Path(rt.cache_dir).resolve()) if rt.cache_dir else ""))
    own = actors is None
    actors = actors or ActorCache()
    rows: list[RunRow] = []
    notes: list[str] = []
    (folder / "notes.md").unlink(missing_ok=True)  # an earlier bench's, in the same folder
    order = names + [f"{b}@{m}" for m in equal_bytes for b in buffered]
    try:
        encoding = encode_stream(config, actors)
        log(f"[{chosen.name}] stream encoded into the feature cache: {encoding:.0f} s, shared by every run "
            "(not in any method's time)")
        runs = [(method, replace(config, seed=seed, method=replace(config.method, name=method)))
                for method in names for seed in range(seeds)]
        total = len(runs) + len(order[len(names):]) * seeds
        started = time.perf_counter()
        if fan_out and own:
            actors.close()  # the encoders that filled the cache hold CPUs the bench workers' runs need
        # a run of raw rows starts its own encoder replicas beside its bench worker
        raw = preflight.payload_of(config) != "features"
        encoders = config.encoder.replicas * config.encoder.num_cpus if raw else 0.0
        probes: dict[str, tuple[RunConfig, dict]] = {}  # seed 0's run of each buffered method: its bytes per row

        def execute(batch: list[tuple[str, RunConfig]]) -> None:
            configs = dict(batch)
            for label, metrics in (_fanned_out(batch, fan_out, encoders) if fan_out else
                                   ((label, runner.run(run, actors=actors).metrics) for label, run in batch)):
                row = RunRow.of(metrics, label)
                rows.append(row)
                rows.sort(key=lambda r: (order.index(r.label), r.seed))
                if label in buffered and row.seed == 0:
                    probes[label] = (configs[label], metrics)
                log(f"[{chosen.name}] {row.label} seed {row.seed}: A_last "
                    f"{figure_text(row.summary.get('a_last'))} (train {row.train_seconds:.0f} s; "
                    f"{len(rows)} of {total} runs in {time.perf_counter() - started:.0f} s)")
                write_results(folder, chosen, rows, seeds, notes)

        execute(runs)
        if equal_bytes:
            extra = []
            for target in equal_bytes:
                held = float(np.mean([r.memory_bytes for r in rows if r.label == target]))
                for b in buffered:
                    probe_config, probe = probes[b]
                    size, expected = buffer_within(probe_config, probe, held)
                    notes.append(f"- {b}@{target}: {METHODS[b].buffer[0]} = {size:,} rows, {expected:,} bytes at "
                                 f"the end of the stream, within {target}'s {held:,.0f} (its mean over the seeds)")
                    log(f"[{chosen.name}] {notes[-1][2:]}")
                    sized = with_setting(probe_config.method, METHODS[b].buffer[0], size)
                    extra += [(f"{b}@{target}", replace(probe_config, seed=seed, method=sized))
                              for seed in range(seeds)]
            execute(extra)
    finally:
        if own:
            actors.close()
    return rows


def check_equal_bytes(names: list[str], equal_bytes: list[str]) -> list[str]:
    """The compared methods with a rehearsal buffer, after checking that `--equal-bytes` can be done."""
    for target in equal_bytes:
        if target not in names:
            raise ConfigError(f"--equal-bytes {target}: it is not among the methods compared ({', '.join(names)}); "
                              "its bytes are measured by its own runs")
    buffered = [n for n in names if METHODS[n].buffer]
    if equal_bytes and not buffered:
        raise ConfigError("--equal-bytes: none of the methods compared keeps a rehearsal buffer to size "
                          f"({', '.join(names)}); add one, e.g. derpp")
    return buffered


def buffer_within(config: RunConfig, metrics: dict, held: float) -> tuple[int, int]:
    """(rows, bytes): the largest buffer, in rows, whose method would end the stream holding at most `held` bytes,
    from a run of it (`config`, `metrics`): every row the buffer keeps costs the same bytes (its feature, label and
    logits at the last width), the rest of its memory does not depend on the buffer's size, and a buffer larger
    than the rows learned holds them all."""
    setting, entry = METHODS[config.method.name].buffer
    size = read_setting(config.method, setting)
    learned = metrics["samples"]["learned"]
    kept = min(size, learned)
    per_row = metrics["memory_bytes"][entry] / kept
    rest = sum(metrics["memory_bytes"].values()) - metrics["memory_bytes"][entry]
    rows = min(int((held - rest) // per_row), learned)
    if rows < 1:
        raise ConfigError(f"--equal-bytes: {held:,.0f} bytes do not hold {config.method.name}'s {rest:,} bytes "
                          "besides its buffer and one row")
    return rows, int(rest + rows * per_row)


def read_setting(section: object, dotted: str) -> object:
    for key in dotted.split("."):
        section = getattr(section, key)
    return section


def with_setting(section: object, dotted: str, value: object) -> object:
    """`section` (a frozen config) with the setting at `dotted` (relative to it) replaced."""
    key, _, rest = dotted.partition(".")
    return replace(section, **{key: with_setting(getattr(section, key), rest, value) if rest else value})


def _fanned_out(runs: list[tuple[str, RunConfig]], cpus: float, encoders: float):
    """(label, metrics) of each run as each finishes, the runs going side by side on bench workers: actors of `cpus`
    CPUs each, as many as the cluster's free CPUs hold beside the `encoders` CPUs each run's encoder replicas
    reserve (at most one per run), each taking the next run when it is done with one. A worker whose process or
    node is lost is restarted and its run retried by Ray (a run is deterministic, so the retry gives the same
    result)."""
    import ray
    from ray.util import ActorPool

    free = ray.available_resources().get("CPU", 0.0)
    if free < cpus + encoders:
        raise ConfigError(f"--fan-out {cpus}: a run needs {cpus + encoders:g} CPUs (its bench worker and its encoders) "
                          f"and the cluster has {free:g} free; run without --fan-out or add nodes")
    count = min(int(free // (cpus + encoders)), len(runs))
    worker = ray.remote(BenchWorker).options(num_cpus=cpus, max_restarts=1, max_task_retries=1)
    workers = [worker.remote() for _ in range(count)]
    try:
        yield from ActorPool(workers).map_unordered(lambda w, run: w.run.remote(*run), runs)
    finally:
        for w in workers:  # the actors each worker started go with it
            ray.kill(w)


class BenchWorker:
    """Runs bench runs one after another on actors of its own, reset between runs rather than started again."""

    def __init__(self):
        self.actors = ActorCache()

    def run(self, label: str, config: RunConfig) -> tuple[str, dict]:
        return label, runner.run(config, actors=self.actors).metrics


def _mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def aggregate(rows: list[RunRow]) -> dict[str, dict]:
    """Per row label (a method, or a method at another's bytes), in first-run order: mean and std over seeds of each
    metric, train time and memory, and the method that ran."""
    out: dict[str, dict] = {}
    for label in dict.fromkeys(r.label for r in rows):
        mine = [r for r in rows if r.label == label]
        out[label] = {
            **{m: _mean_std([r.summary.get(m, np.nan) for r in mine]) for m in METRICS},
            "train_seconds": _mean_std([r.train_seconds for r in mine]),
            "memory_bytes": _mean_std([r.memory_bytes for r in mine]),
            "seeds": len(mine),
            "method": mine[0].method,
            "curve": np.nanmean(np.array([r.curve for r in mine], dtype=np.float64), axis=0),
            "curve_std": np.nanstd(np.array([r.curve for r in mine], dtype=np.float64), axis=0),
        }
    return out


def role(table: dict[str, dict], label: str) -> str:
    return METHODS[table[label]["method"]].role


def verdict_lines(table: dict[str, dict]) -> list[str]:
    """Who won: the best method overall and per role by mean A_last, whether its lead over the runner-up is larger
    than the seeds' spread (with 2 seeds or more), where the paper's MARS and memcl's stand against the best
    baseline, and, with rows at equal bytes, whether memcl's best is at or above every baseline at its bytes."""
    if not table:
        return []
    ranked = sorted(table, key=lambda m: -table[m]["a_last"][0])
    pct = lambda m: figure_text(table[m]["a_last"][0])  # noqa: E731
    best = ranked[0]
    lines = [f"- best overall: {best} (A_last {pct(best)}, {role(table, best)})"]
    if len(ranked) > 1 and table[best]["seeds"] > 1:
        lead = table[best]["a_last"][0] - table[ranked[1]]["a_last"][0]
        spread = max(table[best]["a_last"][1], table[ranked[1]]["a_last"][1])
        lines[0] += (f", {100 * lead:.2f} points ahead of {ranked[1]}: "
                     + ("more than" if lead > spread else "within") + " one seed std")
    per_role = {}
    for m in ranked:
        per_role.setdefault(role(table, m), m)
    lines.append("- best per role: " + ", ".join(f"{r} {m} ({pct(m)})" for r, m in per_role.items()))
    baselines = [m for m in ranked if role(table, m) == "baseline" and "@" not in m]
    for mars in ("mars", "mars-memcl"):
        if mars in table and baselines:
            gap = 100 * (table[mars]["a_last"][0] - table[baselines[0]]["a_last"][0])
            lines.append(f"- {mars} is {ranked.index(mars) + 1} of {len(ranked)}; {gap:+.2f} points against the best "
                         f"baseline ({baselines[0]})")
    lines += equal_bytes_lines(table, ranked)
    online = [m for m in table if not np.isnan(table[m]["prequential"][0])]
    # with boundaries every class-incremental visit is predicted before it is learned: all 0, no winner to name
    if any(table[m]["prequential"][0] > 0 for m in online):
        by = lambda key: max(online, key=lambda m: table[m][key][0])  # noqa: E731
        lines.append(f"- test-then-train: best prequential {by('prequential')} "
                     f"({100 * table[by('prequential')]['prequential'][0]:.2f}), best near-future {by('near_future')} "
                     f"({100 * table[by('near_future')]['near_future'][0]:.2f})")
    lines.append("- every trained head starts a new class at its prototype (memcl's default); the literature's "
                 "versions start it at zero: --set method.stage2.new_class_init=zero")
    return lines


def equal_bytes_lines(table: dict[str, dict], ranked: list[str]) -> list[str]:
    """Where memcl's best method (by A_last) has rows at its bytes: is it at or above every baseline, each buffered
    one at its bytes, and by how much where not."""
    memcl = [m for m in ranked if role(table, m) == "memcl"]
    if not memcl or not any(m.endswith(f"@{memcl[0]}") for m in table):
        return []
    best = memcl[0]
    mine = table[best]["a_last"][0]
    rivals = [f"{b}@{best}" if f"{b}@{best}" in table else b for b in ranked
              if role(table, b) == "baseline" and "@" not in b]
    short = [(b, 100 * (table[b]["a_last"][0] - mine)) for b in rivals if table[b]["a_last"][0] > mine]
    verdict = "true" if not short else "false: " + ", ".join(f"{b} ahead by {gap:.2f}" for b, gap in short)
    return [f"- at equal bytes, memcl's best ({best}, {100 * mine:.2f} at {table[best]['memory_bytes'][0]:,.0f} bytes) "
            f">= every baseline: {verdict}"]


def markdown(chosen: Suite, table: dict[str, dict], seeds: int, notes: list[str] = ()) -> str:
    """The suite's table, best mean A_last first; ± std only where 2 seeds or more give one."""
    def cell(m: tuple[float, float]) -> str:
        if np.isnan(m[0]):
            return "-"
        return f"{100 * m[0]:.2f} ± {100 * m[1]:.2f}" if seeds > 1 else f"{100 * m[0]:.2f}"

    spread = f"Mean ± std over {seeds} seeds" if seeds > 1 else "One seed (no spread: --seeds 3 gives mean ± std)"
    spread += ("; preq. and near-future: test-then-train accuracy on the training stream, let go: the share of its "
               "labelled rows the consolidation buffer dropped past its budget (docs/methods.md, \"Prequential "
               "accuracy\")")
    lines = [f"### {chosen.name}", "", f"{chosen.summary}. {spread}; best A_last first.", "",
             "| method | role | " + " | ".join(HEADERS[m] for m in METRICS) + " | train s | memory bytes |",
             "|---|---|" + "---|" * (len(METRICS) + 2)]
    for label in sorted(table, key=lambda m: -table[m]["a_last"][0]):
        row = table[label]
        lines.append(f"| {label} | {role(table, label)} | " + " | ".join(cell(row[m]) for m in METRICS)
                     + f" | {row['train_seconds'][0]:.1f} | {row['memory_bytes'][0]:,.0f} |")
    lines += ["", *verdict_lines(table), *notes]
    return "\n".join(lines) + "\n"


def read_notes(folder: Path) -> list[str]:
    """The lines a bench at equal bytes wrote beside its rows (what each buffer held), for --render."""
    path = Path(folder) / "notes.md"
    return path.read_text().splitlines() if path.exists() else []


def write_results(folder: Path, chosen: Suite, rows: list[RunRow], seeds: int, notes: list[str] = ()
                  ) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    table = aggregate(rows)
    paths = {"markdown": folder / "results.md", "csv": folder / "results.csv", "runs": folder / "runs.csv",
             "curves": folder / "curves.png"}
    if notes:
        files.write_text(folder / "notes.md", "\n".join(notes) + "\n")
    files.write_text(paths["markdown"], markdown(chosen, table, seeds, notes))
    with files.atomic_open(paths["csv"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "role", "seeds", *[f"{m}_{s}" for m in METRICS for s in ("mean", "std")],
                         "train_seconds_mean", "memory_bytes_mean"])
        for label, row in table.items():
            writer.writerow([label, role(table, label), row["seeds"],
                             *[f"{v:.6f}" for m in METRICS for v in row[m]],
                             f"{row['train_seconds'][0]:.3f}", f"{row['memory_bytes'][0]:.0f}"])
    with files.atomic_open(paths["runs"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "seed", *METRICS, "train_seconds", "memory_bytes", "curve", "run_dir", "label"])
        for r in rows:
            writer.writerow([r.method, r.seed, *[f"{r.summary.get(m, np.nan):.6f}" for m in METRICS],
                             f"{r.train_seconds:.3f}", r.memory_bytes, " ".join(f"{v:.4f}" for v in r.curve),
                             r.run_dir, r.label])
    plot_curves(chosen, table, paths["curves"])
    return paths


_STYLE = {"memcl": "-", "paper": "-", "ablation": "--", "baseline": ":", "upper-bound": "-."}


def plot_curves(chosen: Suite, table: dict[str, dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, row) in enumerate(table.items()):
        x = np.arange(1, len(row["curve"]) + 1)
        colour = plt.cm.tab20(i % 20)  # more methods than the default cycle's 10 colours
        ax.plot(x, row["curve"], _STYLE.get(role(table, label), "-"), marker="o", ms=3, color=colour,
                lw=2.2 if label in ("mars", "mars-memcl") else 1.3, label=label)
        ax.fill_between(x, row["curve"] - row["curve_std"], row["curve"] + row["curve_std"], alpha=0.12,
                        color=colour, lw=0)
    ax.set_xlabel("tasks learned")
    ax.set_ylabel("mean accuracy on tasks seen")
    accuracy_axis(ax, np.concatenate([row["curve"] for row in table.values()]))
    ax.set_title(f"memcl bench {chosen.name}", fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    fig.tight_layout()
    files.save_figure(fig, path, dpi=110)
    plt.close(fig)
