"""Run folders: metrics.json, acc_matrix.csv, PNG plots and the printed summary table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from matplotlib.ticker import MaxNLocator, PercentFormatter

from memcl_ops import files
from memcl_ops.arrow.schema import REASONS
from memcl_ops.metrics import figure_text

RUN_FILES = ("config.yaml", "metrics.json", "acc_matrix.csv", "acc_matrix.png", "acc_over_time.png", "slots.png")


def write_run(run_dir: Path, metrics: dict) -> None:
    files.write_json(run_dir / "metrics.json", metrics)
    render(run_dir, metrics)


def read_metrics(path: Path) -> dict:
    """A metrics.json as the run held it: its matrices of figures (`acc_matrix`, `nll_matrix`, the anytime
    `matrix`) with NaN where the file, strict JSON, has null for an undefined figure."""
    def restore(value, key: str = ""):
        if isinstance(value, dict):
            return {k: restore(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [np.nan if v is None and key.endswith("matrix") else restore(v, key) for v in value]
        return value
    return restore(json.loads(Path(path).read_text()))


def render(run_dir: Path, metrics: dict) -> None:
    """(Re)write the CSV and the plots from a metrics dict."""
    write_matrix(run_dir, metrics)
    if "slots" in metrics:  # the "features" family's slot memory
        _slots(metrics, run_dir / "slots.png")
    if (metrics.get("prequential") or {}).get("rows"):
        prequential_chart(metrics, run_dir / "prequential.png")


def write_matrix(run_dir: Path, metrics: dict, prefix: str = "") -> None:
    """<prefix>acc_matrix.csv, <prefix>acc_matrix.png and <prefix>acc_over_time.png from the `acc_matrix`,
    `visits`, `method`, `dataset` and `seed` entries of a metrics dict."""
    acc = np.array(metrics["acc_matrix"], dtype=float)
    tasks = acc.shape[1] if acc.ndim == 2 else 0
    free = metrics.get("task_free")
    with files.atomic_open(run_dir / f"{prefix}acc_matrix.csv", "w", newline="") as f:
        writer = csv.writer(f)
        # numbered as people count (from 1), like every table and plot; metrics.json keeps 0-based indices
        writer.writerow([*(("after_round", "visits_ended") if free else ("after_visit", "trained_task")),
                         *[f"task{j + 1}" for j in range(tasks)]])
        for i, row in enumerate(acc):
            where = ((metrics["rows"][i]["round"] + 1, " ".join(str(v + 1) for v in metrics["rows"][i]["visits_ended"]))
                     if free else (i + 1, metrics["visits"][i] + 1))
            writer.writerow([*where, *["" if np.isnan(v) else f"{v:.4f}" for v in row]])
    if acc.size:  # a run that never evaluated (nothing streamed) has no matrix to plot
        _heatmap(acc, metrics, run_dir / f"{prefix}acc_matrix.png")
        _over_time(acc, metrics, run_dir / f"{prefix}acc_over_time.png")


def accuracy_axis(ax: plt.Axes, values: np.ndarray) -> None:
    """A y-axis over the accuracies actually reached (a 0-1 axis flattens the differences between curves that all
    sit at 0.7-0.9), in percent, and integer ticks on the x-axis (visits or tasks, never halves)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    pad = max(0.02, 0.08 * (high - low))
    ax.set_ylim(max(0.0, min(low - pad, high - 0.1)), min(1.0, high + pad) + 0.005)  # at least 10 points tall
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _title(metrics: dict) -> str:
    free = ", task-free" if metrics.get("task_free") else ""
    return f"{metrics['method']} on {metrics['dataset']} (seed {metrics['seed']}{free})"


def row_label(metrics: dict, i: int) -> str:
    """What row i of the accuracy matrix is: the visit it follows (and its task), or the round (task-free), counted
    from 1."""
    if metrics.get("task_free"):
        return f"round {metrics['rows'][i]['round'] + 1}"
    return f"{i + 1} (task {metrics['visits'][i] + 1})"


HEATMAP_LABELLED_ROWS = 40  # past this many rows the heatmap keeps a fixed height, without a figure in each cell


def _heatmap(acc: np.ndarray, metrics: dict, path: Path) -> None:
    labelled = acc.shape[0] <= HEATMAP_LABELLED_ROWS  # a long run's matrix at one row per 0.45 in: gigabytes
    rows = acc.shape[0] if labelled else HEATMAP_LABELLED_ROWS
    fig, ax = plt.subplots(figsize=(2.6 + 0.9 * acc.shape[1], 1.8 + 0.45 * rows))  # room for class names
    im = ax.imshow(np.ma.masked_invalid(acc), vmin=0, vmax=1, cmap="viridis", aspect="auto", interpolation="nearest")
    if labelled:
        for (i, j), v in np.ndenumerate(acc):
            if not np.isnan(v):
                ax.text(j, i, f"{100 * v:.0f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=8)
        ax.set_yticks(range(acc.shape[0]), [row_label(metrics, i) for i in range(acc.shape[0])])
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(lambda y, _: f"{int(y) + 1}")  # rows counted from 1, as in acc_matrix.csv
    ax.set_xticks(range(acc.shape[1]), [task_label(metrics, j, "\n") for j in range(acc.shape[1])], fontsize=7)
    ax.set_xlabel("evaluated on task")
    ax.set_ylabel("after round (task-free)" if metrics.get("task_free") else "after visit (task trained)")
    ax.set_title(_title(metrics), fontsize=9)
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    files.save_figure(fig, path, dpi=110)
    plt.close(fig)


def _over_time(acc: np.ndarray, metrics: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = (np.array([row["round"] + 1 for row in metrics["rows"]]) if metrics.get("task_free")
         else np.arange(1, acc.shape[0] + 1))
    for j in range(acc.shape[1]):
        ax.plot(x, acc[:, j], marker="o" if acc.shape[0] <= HEATMAP_LABELLED_ROWS else None, ms=3,
                label=task_label(metrics, j))
    evaluated = ~np.isnan(acc).all(axis=1)
    ax.plot(x[evaluated], np.nanmean(acc[evaluated], axis=1), "k--", lw=2, label="mean (evaluated)")
    ax.set_xlabel("rounds completed (task-free)" if metrics.get("task_free") else "visits completed")
    ax.set_ylabel("accuracy")
    accuracy_axis(ax, acc)
    ax.set_title(_title(metrics), fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    files.save_figure(fig, path, dpi=110)
    plt.close(fig)


def prequential_chart(metrics: dict, path: Path, rows: str = "labelled training rows") -> None:
    """Test-then-train accuracy over the stream: overall so far and over the last `window` rows, after each round
    (`metrics`: a run's, with its `prequential`; an LM run's has no near-future accuracy); `rows`: what was
    predicted (an LM run's training pairs)."""
    prequential = metrics["prequential"]
    curve = [p for p in prequential["curve"] if p["accuracy"] is not None]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    done = [p["rows"] for p in curve]
    overall, window = [p["accuracy"] for p in curve], [p["window"] for p in curve]
    ax.plot(done, overall, "k-", lw=2, label="prequential, so far")
    if prequential["window"] < done[-1]:  # else the window holds every row so far: the same line
        ax.plot(done, window, "-", lw=1.2, label=f"last {prequential['window']} {rows.split()[-1]}")
    ax.set_xlabel(f"{rows} predicted")
    ax.set_ylabel("test-then-train accuracy")
    accuracy_axis(ax, np.array(overall + window))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    near = prequential.get("near_future_accuracy")
    ax.set_title(_title(metrics) + ("" if near is None else f"; near-future (k={prequential['near_future']}) "
                                    f"{figure_text(near, '.1f')}"), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.save_figure(fig, path, dpi=110)
    plt.close(fig)


def _slots(metrics: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3))
    history = np.array(metrics["slots"]["history"], dtype=float).reshape(-1, 2)
    if len(history):
        end = metrics["samples"]["stream"]
        xs = np.append(history[:, 0], end)
        ys = np.append(history[:, 1], history[-1, 1])
        ax.step(xs, ys, where="post", label="slots")
        marks = [e["at_sample"] for e in metrics["slots"]["expansions"]]
        ax.plot(marks, [e["slots"] for e in metrics["slots"]["expansions"]], "rv", ms=5, label="expansion")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "method has no slot memory", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("samples streamed")
    ax.set_ylabel("slots")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # slots come in whole numbers
    ax.set_title(_title(metrics), fontsize=9)
    fig.tight_layout()
    files.save_figure(fig, path, dpi=110)
    plt.close(fig)


def class_name(metrics: dict, label: int) -> str:
    names = metrics.get("class_names") or []
    return names[label] if 0 <= label < len(names) else str(label)


def task_label(metrics: dict, task: int, sep: str = " ") -> str:
    """`task 2 (cat, dog)`: task index 1 with the names of its first classes, for legends and ticks."""
    classes = (metrics.get("task_classes") or [[]] * (task + 1))[task]
    if not metrics.get("class_names") or not classes:
        return f"task {task + 1}"
    names = [class_name(metrics, c) for c in classes[:3]] + (["..."] if len(classes) > 3 else [])
    return f"task {task + 1}{sep}({', '.join(names)})"


def _class_lines(metrics: dict) -> list[str]:
    """Which classes each task holds, by name when the dataset names them."""
    tasks = metrics.get("task_classes") or []
    if not any(tasks):
        return []
    return [""] + [f"task {t + 1}: " + (", ".join(class_name(metrics, c) for c in classes) or "(no row accepted)")
                   for t, classes in enumerate(tasks)]


def consolidation_line(done: dict, clock: dict | None) -> str:
    """How the learning kept up: the rows the per-batch step learned, those consolidated and let go, the versions
    published, how long rows waited for one, and the stream's clock."""
    staleness = ("" if done["staleness_mean"] is None else
                 f"; a consolidated row waited {done['staleness_mean']:.0f} rows on average "
                 f"(at most {done['staleness_max']})")
    stream = ("the stream waited for each" if not clock or clock["mode"] == "off" else
              f"the stream did not wait ({clock['mode']}, rate {clock['rate']:g}; trainers busy {clock['busy']:.0f})")
    overlap = (f"; encoders busy {done['encoder_busy_s']:.1f} s, {done['encoder_busy_consolidating_s']:.1f} s of it "
               "while a consolidation ran" if "encoder_busy_s" in done else "")
    return (f"rows observed {done['observed']}, consolidated {done['consolidated']}, let go {done['let_go']}; "
            f"{done['versions']} versions published, {stream}{staleness}{overlap}")


SUMMARY_ROWS = 10  # accuracy-matrix rows the printed summary shows (the last ones); acc_matrix.csv has them all


def summary_table(metrics: dict, run_dir: str | Path | None = None) -> str:
    """The run's summary as printed: the last `SUMMARY_ROWS` rows of the accuracy matrix (a line says how many are
    left out and names the CSV that holds them all: in `run_dir`, by default the metrics' own), the headline, samples,
    memory and time."""
    acc = np.array(metrics["acc_matrix"], dtype=float)
    lines = [f"{_title(metrics)}", ""]
    after = "after round" if metrics.get("task_free") else "after visit"
    header = f"{after:<12} | " + " ".join(f"task{j + 1:<3d}" for j in range(acc.shape[1]))
    lines += [header, "-" * len(header)]
    first = max(len(acc) - SUMMARY_ROWS, 0)
    if first:
        folder = run_dir or metrics.get("run_dir")
        where = Path(folder) / "acc_matrix.csv" if folder else "acc_matrix.csv in the run folder"
        lines.append(f"({first} earlier rows left out; every row: {where})")
    for i in range(first, len(acc)):
        cells = " ".join(f"{figure_text(v, '6.1f'):^7}" for v in acc[i])
        lines.append(f"{row_label(metrics, i):<12} | {cells}")
    lines += _class_lines(metrics)
    s = metrics.get("summary") or {}
    if s:
        mean = "Ā online (all seen, over points)" if metrics.get("task_free") else "Ā"
        pct = figure_text  # "-": not every entry evaluated
        lines += ["", f"A_last {pct(s['a_last'])}   {mean} {pct(s['a_mean'])}   forgetting {pct(s['forgetting'])}   "
                      f"BWT {pct(s['bwt'])}"]
    samples = metrics["samples"]
    refused = ", ".join(f"{reason} {n}" for reason, n in (samples.get("refused_by_reason") or {}).items())
    refused_test = ", ".join(f"{reason} {n}" for reason, n in (samples.get("refused_test_by_reason") or {}).items())
    lines.append(f"training samples streamed {samples['stream']}, learned {samples['learned']} "
                 f"({samples['unique_learned']} unique), refused {samples.get('refused', 0)}"
                 + (f" ({refused})" if refused else "")
                 + (f"; test rows refused {samples['refused_test']} ({refused_test})" if refused_test else "")
                 + (f"; unlabelled rows predicted {samples['predicted_unlabelled']} (predictions/)"
                    if samples.get("predicted_unlabelled") else ""))
    prequential = metrics.get("prequential")
    if prequential and prequential["rows"]:
        lines.append(f"test-then-train: prequential {figure_text(prequential['accuracy'])} (last "
                     f"{prequential['window']} rows {figure_text(prequential['window_accuracy'])})   near-future "
                     f"(k={prequential['near_future']}) {figure_text(prequential['near_future_accuracy'])}   over "
                     f"{prequential['rows']} training rows")
    done, clock = metrics.get("consolidation"), metrics.get("realtime")
    if done:
        lines.append(consolidation_line(done, clock))
    slots = metrics.get("slots")
    if slots and slots["history"]:
        lines.append(f"slots {slots['history'][0][1]} -> {slots['history'][-1][1]} "
                     f"({len(slots['expansions'])} expansions, {slots['monitor'].get('tests', 0)} SGSE tests)")
    recovery = metrics.get("recovery")  # NSR runs (pipeline/nsr.py)
    if recovery and recovery["returning_visits"]:
        visits = recovery["returning_visits"]
        lines.append(f"returning tasks ({metrics['allocation']} allocation): "
                     + ", ".join(f"task {r['task'] + 1} back in {'>=' if r['censored'] else ''}{r['steps']} steps"
                                 for r in visits) + f"; mean {figure_text(recovery['mean_steps'], '.2f', 1)}")
    mem = metrics["memory_bytes"]
    lines.append("memory bytes: " + ", ".join(f"{k} {v:,}" for k, v in mem.items()))
    wall = metrics["wall_seconds"]
    lines.append("wall seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in wall.items()))
    return "\n".join(lines)


def commonest_refusal(by_reason: dict[str, int], run_dir: Path, split: str = "train") -> str:
    """The reason most rows of `split` were refused for, in words, with one of its dead letters' messages (what the
    gate found in that row), e.g. "the commonest, feature_dim: the features do not have data.feature_dim values
    (column 'features': feature dim 16 != expected 15)"."""
    reason = max(by_reason, key=by_reason.__getitem__)
    folder, example = run_dir / "dead_letters", ""
    if folder.is_dir():
        dead = pq.read_table(folder, columns=["reason", "message", "split"])
        found = dead.filter(pc.and_(pc.equal(dead.column("reason"), reason),
                                    pc.equal(dead.column("split"), split))).column("message")
        if len(found):
            example = f" ({found[0].as_py().split('; sample_ids=')[0].removeprefix(f'[{reason}] ')})"
    return f"the commonest, {reason}: {REASONS.get(reason, reason)}{example}"
