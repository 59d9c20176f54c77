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


def test_a_long_run_prints_its_last_rows_and_names_the_file_with_every_row(tmp_path):
    """A 300-visit run prints the last 10 rows of its accuracy matrix, says how many it left out and where all of
    them are; a short run prints every row."""
    visits = [v % 3 for v in range(300)]
    acc = np.tile([0.5, 0.6, 0.7], (300, 1))
    acc[np.arange(300), visits] = np.arange(300) / 1000  # each row tells itself apart
    metrics = {"method": "mars", "dataset": "d", "seed": 0, "acc_matrix": acc.tolist(), "visits": visits,
               "task_classes": [[0], [1], [2]], "samples": {"stream": 10, "learned": 10, "unique_learned": 10},
               "memory_bytes": {}, "wall_seconds": {}, "run_dir": str(tmp_path)}
    lines = report.summary_table(metrics).splitlines()
    rows = [line for line in lines if " | " in line][1:]  # the matrix rows, below the header
    assert [row.split()[0] for row in rows] == [str(i) for i in range(291, 301)]
    assert rows[-1].split("|")[1].split()[visits[-1]] == "29.9"
    assert f"(290 earlier rows left out; every row: {tmp_path / 'acc_matrix.csv'})" in lines
    short = report.summary_table({**metrics, "acc_matrix": acc[:3].tolist(), "visits": visits[:3]})
    assert len([line for line in short.splitlines() if " | " in line]) == 4 and "left out" not in short


def test_a_long_run_draws_its_accuracy_matrix_at_a_bounded_size(tmp_path):
    """A 10,000-visit run drew a heatmap 0.45 in per row (half a million pixels tall, tens of gigabytes with a
    label per cell): past 40 rows the picture keeps the height of 40 and every row of acc_matrix.csv."""
    from PIL import Image

    def drawn(rows: int) -> tuple[int, int]:
        visits = [v % 3 for v in range(rows)]
        metrics = {"method": "mars", "dataset": "d", "seed": 0, "acc_matrix": np.full((rows, 3), 0.5).tolist(),
                   "visits": visits, "task_classes": [[0], [1], [2]], "class_names": None}
        report.write_matrix(tmp_path, metrics)
        assert len((tmp_path / "acc_matrix.csv").read_text().splitlines()) == rows + 1
        return Image.open(tmp_path / "acc_matrix.png").size

    forty, long = drawn(40), drawn(400)
    assert long == forty and drawn(20)[1] < forty[1]
