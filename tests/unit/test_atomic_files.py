"""Files a reader may see are replaced whole or not at all: a writer that dies partway (here a child process killed
by the kernel's file-size limit, SIGXFSZ, in the middle of writing) leaves the previous file as it was; JSON files
are strict JSON, null where a figure is undefined."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from memcl.pipeline import report
from memcl_ops import files
from memcl_ops.metrics import figure_text

WRITER = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from memcl.pipeline import report
    # past 4 KiB, a write kills this process (SIGXFSZ): a crash in the middle of writing metrics.json
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    report.write_run(Path(sys.argv[1]), {"method": "m", "dataset": "d", "seed": 0, "acc_matrix": [[0.5]],
                                         "visits": [0], "rows": [], "padding": ["x" * 100] * 1000})
""")


def test_a_writer_killed_mid_write_leaves_the_previous_metrics_json_readable(tmp_path):
    before = {"method": "m", "summary": {"a_last": 0.5}}
    files.write_json(tmp_path / "metrics.json", before)
    done = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode != 0  # the kernel stopped it partway
    assert json.loads((tmp_path / "metrics.json").read_text()) == before
    leftover = [p.name for p in tmp_path.iterdir() if p.name != "metrics.json"]
    assert all(name.startswith(".") and name.endswith(".tmp") for name in leftover), leftover  # no reader globs it


def test_an_error_while_writing_keeps_the_previous_file_and_no_temp_file(tmp_path):
    path = tmp_path / "acc_matrix.csv"
    files.write_text(path, "after_visit,task1\n1,0.5\n")
    with pytest.raises(RuntimeError, match="partway"), files.atomic_open(path, "w") as f:
        f.write("after_visit,task1\n")
        raise RuntimeError("the serializer failed partway")
    assert path.read_text() == "after_visit,task1\n1,0.5\n" and sorted(tmp_path.iterdir()) == [path]


def test_report_files_are_written_whole(tmp_path):
    metrics = {"method": "m", "dataset": "d", "seed": 0, "acc_matrix": [[0.5, 0.25]], "visits": [0], "rows": [],
               "task_classes": [[0], [1]]}
    report.write_run(tmp_path, metrics)
    assert json.loads((tmp_path / "metrics.json").read_text())["acc_matrix"] == [[0.5, 0.25]]
    assert (tmp_path / "acc_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the format from the suffix
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_json_files_hold_null_where_a_figure_is_undefined(tmp_path):
    value = {"bwt": float("nan"), "ratio": float("inf"), "acc": np.array([[0.5, np.nan]]), "n": np.int64(3),
             "ok": np.bool_(True), "x": np.float32(0.25), "rows": [(1, -float("inf"))]}
    files.write_json(tmp_path / "m.json", value)
    strict = json.loads((tmp_path / "m.json").read_text(), parse_constant=lambda token: pytest.fail(token))
    assert strict == {"bwt": None, "ratio": None, "acc": [[0.5, None]], "n": 3, "ok": True, "x": 0.25,
                      "rows": [[1, None]]}
    assert [figure_text(v) for v in (None, float("nan"), 0.1234, float("-inf"))] == ["-", "-", "12.34", "-"]


def test_metrics_read_back_hold_nan_in_their_matrices_and_keep_none_elsewhere(tmp_path):
    """A run read back from its folder (a finished run that `memcl lm --resume` does not run again) has the matrices
    the run computed, NaN where the file holds null, and its other nulls (a summary figure not defined) as None."""
    metrics = {"method": "m", "dataset": "d", "seed": 0, "visits": [0, 1], "rows": [], "task_classes": [[0], [1]],
               "acc_matrix": [[0.5, np.nan], [0.25, 0.75]], "summary": {"a_last": 0.5, "a_mean": None},
               "runs": {"x": {"nll_matrix": [[1.0, float("nan")]]}}}
    report.write_run(tmp_path, metrics)
    back = report.read_metrics(tmp_path / "metrics.json")
    np.testing.assert_array_equal(np.array(back["acc_matrix"]), np.array(metrics["acc_matrix"]))  # NaN == NaN here
    assert back["summary"] == {"a_last": 0.5, "a_mean": None} and np.isnan(back["runs"]["x"]["nll_matrix"][0][1])
