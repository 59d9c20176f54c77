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
    metrics = {"method": "mars", "dataset": "fashion-mnist", "seed": 0, "acc_matrix": [[0.9, np.nan], [0.8, 0.7]],
               "visits": [0, 1], "task_classes": [[3, 0], [1, 2, 4, 5]],
               "class_names": ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal"],
               "samples": {"stream": 10, "learned": 10, "unique_learned": 10},
               "slots": {"history": [], "expansions": [], "monitor": {}}, "memory_bytes": {}, "wall_seconds": {}}
    table = report.summary_table(metrics)
    assert "task0: Dress, T-shirt" in table and "task1: Trouser, Pullover, Coat, Sandal" in table
    assert report.task_label(metrics, 1) == "task 1 (Trouser, Pullover, Coat, ...)"
    assert report.task_label({**metrics, "class_names": None}, 0) == "task 0"
