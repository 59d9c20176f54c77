"""`memcl runs` over real run folders: the list (method, data, status, A_last, size), two runs side by side, and
clean removing exactly the unfinished ones."""

import shutil

import pytest

from memcl.pipeline import cli, runner
from memcl.pipeline.config import load_config

pytestmark = pytest.mark.ray


def small(tmp_path, method):
    return load_config(overrides={"data.dataset": "synthetic", "stream.tasks": 2, "method.name": method,
                                  "data.synthetic.train_per_class": 20, "method.stage2.optim.epochs": 2,
                                  "runtime.out": str(tmp_path), "runtime.progress": False})


def test_list_compare_and_clean(actors, tmp_path, capsys):
    done = [runner.run(small(tmp_path, m), actors=actors) for m in ("finetune", "simplecil")]
    stopped = tmp_path / "stopped-run"  # a run killed before its first checkpoint: its config only
    stopped.mkdir()
    shutil.copy(done[0].run_dir / "config.yaml", stopped / "config.yaml")
    capsys.readouterr()

    assert cli.main(["runs", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    for result in done:
        row = rows[result.run_dir.name]
        assert row[1] == result.metrics["method"] and row[2] == "synthetic" and row[3] == "finished"
        assert row[4] == f"{100 * result.summary.a_last:.2f}"
    assert rows["stopped-run"][3] == "empty" and rows["stopped-run"][4] == "-"
    assert lines[6].startswith("3 runs, ")

    assert cli.main(["runs", "compare", *(str(r.run_dir) for r in done)]) == 0
    table = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert table["method"] == ["finetune", "simplecil"]
    assert table["A_last"] == [f"{100 * r.summary.a_last:.2f}" for r in done]

    assert cli.main(["runs", "clean", "--unfinished", "--out", str(tmp_path)]) == 0
    assert not stopped.exists() and all(r.run_dir.is_dir() for r in done)
    assert cli.main(["runs", "clean", "--out", str(tmp_path)]) == 2  # says what to remove, removes nothing
    assert all(r.run_dir.is_dir() for r in done)
