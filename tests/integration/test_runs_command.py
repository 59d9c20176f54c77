"""`memcl runs` over real run folders: the list (method, data, status, A_last, size), two runs side by side, and
clean removing only the unfinished folders memcl wrote: never a folder of the user's, a run in progress or a
resumable run (unless named), and only after asking."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memcl.pipeline import cli, run_folder, runner
from memcl.pipeline.config import load_config

pytestmark = pytest.mark.ray

HOLD = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, " \
       "fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"


def small(tmp_path, method):
    return load_config(overrides={"data.dataset": "synthetic", "stream.tasks": 2, "method.name": method,
                                  "data.synthetic.train_per_class": 20, "method.stage2.optim.epochs": 2,
                                  "runtime.out": str(tmp_path), "runtime.progress": False})


def test_list_compare_and_clean(actors, tmp_path, capsys):
    done = [runner.run(small(tmp_path, m), actors=actors) for m in ("finetune", "simplecil")]
    config = done[0].run_dir / "config.yaml"
    empty = run_folder.create(tmp_path / "empty-run")  # memcl's run, killed before its first checkpoint
    shutil.copy(config, empty / "config.yaml")
    mine = tmp_path / "my-own-folder"  # the user's: it looks like an unfinished run, memcl never wrote it
    mine.mkdir()
    shutil.copy(config, mine / "config.yaml")
    resumable = tmp_path / "resumable-run"  # stopped after a checkpoint: `memcl run --resume` continues it
    shutil.copytree(done[0].run_dir, resumable)
    (resumable / "metrics.json").unlink()
    running = run_folder.create(tmp_path / "running-run")  # another process is running it, before any checkpoint
    shutil.copy(config, running / "config.yaml")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(running / run_folder.LOCK)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()

        assert cli.main(["runs", "--out", str(tmp_path)]) == 0
        lines = capsys.readouterr().out.splitlines()
        rows = {line.split()[0]: line.split() for line in lines[2:8]}
        for result in done:
            row = rows[result.run_dir.name]
            assert row[1] == result.metrics["method"] and row[2] == "synthetic" and row[3] == "finished"
            assert row[4] == f"{100 * result.summary.a_last:.2f}"
        assert [rows[f.name][3] for f in (empty, mine, resumable, running)] == ["empty", "empty", "stopped", "running"]
        assert rows["empty-run"][4] == "-" and lines[9].startswith("6 runs, ")

        assert cli.main(["runs", "compare", *(str(r.run_dir) for r in done)]) == 0
        table = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
        assert table["method"] == ["finetune", "simplecil"]
        assert table["A_last"] == [f"{100 * r.summary.a_last:.2f}" for r in done]

        # stdin is no terminal here: without --yes it lists what it would remove and refuses in one line
        assert cli.main(["runs", "clean", "--unfinished", "--out", str(tmp_path)]) == 2
        out, err = capsys.readouterr()
        assert f"to remove: {empty} (empty" in out and err.count("\n") == 1 and "pass --yes" in err
        assert empty.is_dir()

        assert cli.main(["runs", "clean", "--unfinished", "--yes", "--out", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert not empty.exists() and all(p.is_dir() for p in (mine, resumable, running))
        assert all(r.run_dir.is_dir() for r in done)
        assert f"keeping {mine}: not created by memcl" in out and f"keeping {running}: in progress" in out \
            and f"keeping {resumable}: resumable (memcl run --resume {resumable})" in out
    finally:
        holder.kill()
        holder.wait()

    assert cli.main(["runs", "clean", "--out", str(tmp_path)]) == 2  # says what to remove, removes nothing
    assert cli.main(["runs", "clean", "--yes", str(mine)]) == 0  # named, still not memcl's: kept
    assert mine.is_dir()
    assert cli.main(["runs", "clean", "--yes", "--unfinished", "--out", str(tmp_path)]) == 0
    assert running.exists() is False  # its process is gone, and the lock went with it
    assert cli.main(["runs", "clean", "--yes", str(resumable)]) == 0  # a resumable run goes when named
    assert not resumable.exists() and all(r.run_dir.is_dir() for r in done) and mine.is_dir()


def test_a_run_holds_its_lock_while_it_runs_and_clean_leaves_it(actors, tmp_path, capsys):
    seen = []

    def clean_meanwhile(r, state, pipe):
        (run_dir,) = [p.parent for p in tmp_path.glob("*/config.yaml")]
        seen.append(run_folder.holder(run_dir))
        assert cli.main(["runs", "clean", "--unfinished", "--yes", "--out", str(tmp_path)]) == 0
        assert run_dir.is_dir()

    result = runner.run(small(tmp_path, "finetune"), actors=actors, on_round=clean_meanwhile)
    assert seen == [os.getpid(), os.getpid()] and "in progress" in capsys.readouterr().out
    assert run_folder.holder(result.run_dir) is None and run_folder.is_marked(result.run_dir)
    assert Path(result.run_dir, "metrics.json").is_file()
