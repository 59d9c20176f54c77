"""Run-folder plots and tables: integer visit ticks, an accuracy axis over the values reached, class names."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from memcl.pipeline import report


def test_accuracy_axis_spans_the_values_and_ticks_whole_visits():
    fig, ax = plt.subplots()
    values = np.array([0.71, 0.78, 0.83])
    ax.plot([1, 2, 3], values)
    report.accuracy_axis(ax, np.append(values, np.nan))
    low, high = ax.get_ylim()
    assert 0.6 < low < 0.71 and 0.83 < high < 0.95  # not 0-1: the differences stay visible
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    plt.close(fig)


def test_class_names_in_summary_and_labels():
    metrics = {"method": "mars-memcl", "dataset": "fashion-mnist", "seed": 0, "acc_matrix": [[0.9, np.nan], [0.8, 0.7]],
               "visits": [0, 1], "task_classes": [[3, 0], [1, 2, 4, 5]],
               "class_names": ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal"],
               "samples": {"stream": 10, "learned": 10, "unique_learned": 10},
               "slots": {"history": [], "expansions": [], "monitor": {}}, "memory_bytes": {}, "wall_seconds": {}}
    table = report.summary_table(metrics)
    assert "task 1: Dress, T-shirt" in table and "task 2: Trouser, Pullover, Coat, Sandal" in table
    assert report.task_label(metrics, 1) == "task 2 (Trouser, Pullover, Coat, ...)"
    assert report.task_label({**metrics, "class_names": None}, 0) == "task 1"


def test_tasks_and_visits_are_numbered_from_one_in_the_table_and_the_csv(tmp_path):
    """One numbering a person reads everywhere: the table, its rows, the CSV (metrics.json keeps indices)."""
    metrics = {"method": "mars-memcl", "dataset": "d", "seed": 0,
               "acc_matrix": [[0.9, np.nan], [0.8, 0.7], [0.85, 0.6]],
               "visits": [1, 0, 1], "task_classes": [[0], [1]], "class_names": None,
               "samples": {"stream": 10, "learned": 10, "unique_learned": 10}, "memory_bytes": {}, "wall_seconds": {}}
    lines = report.summary_table(metrics).splitlines()
    assert lines[2].split() == ["after", "visit", "|", "task1", "task2"]
    assert [line.split("|")[0].strip() for line in lines[4:7]] == ["1 (task 2)", "2 (task 1)", "3 (task 2)"]
    report.write_matrix(tmp_path, metrics)
    rows = (tmp_path / "acc_matrix.csv").read_text().splitlines()
    assert rows[0] == "after_visit,trained_task,task1,task2" and rows[1].startswith("1,2,0.9000,")
    assert [r.split(",")[:2] for r in rows[1:]] == [["1", "2"], ["2", "1"], ["3", "2"]]
