"""Ctrl-C during `memcl run`: a clean stop (no traceback) that prints the resume command, and the resumed run
learns every sample exactly once."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memcl.pipeline import runner

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_stops_cleanly_and_prints_the_resume_command(actors, tmp_path, capsys):
    args = ["run", "--set", "data.dataset=synthetic", "--set", "stream.tasks=5", "--set", "runtime.progress=false",
            "--set", "data.synthetic.train_per_class=60", "--set", "method.stage1.optim.epochs=3",
            # enough epochs of both stages that the rounds after the first checkpoint outlast the signal's delivery
            "--set", "method.stage2.optim.epochs=20", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a new process group, signalled as a terminal signals the foreground group on Ctrl-C. SIGINT's default is
    # restored first: a shell without job control starts background jobs with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler, so a test suite run in the background would see the run finish instead.
    proc = subprocess.Popen([sys.executable, "-m", "memcl.pipeline.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    # a checkpoint is complete once its checksum is written, after the npz (pipeline/checkpoint.py)
    while not list(tmp_path.glob("*/checkpoints/ckpt-*.sha256")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    resume = re.search(r"memcl: interrupted; continue the run with: memcl run --resume (\S+)$", err.strip())
    assert resume, err
    run_dir = Path(resume.group(1))
    assert run_dir.parent == tmp_path and (run_dir / "config.yaml").is_file()

    metrics = runner.run(resume=run_dir, actors=actors, progress=False).metrics
    said = capsys.readouterr().err
    where = re.search(rf"memcl: resuming {re.escape(str(run_dir))} after visit (\d) of 5 \((\d) of 5 rounds done\), "
                      r"from ckpt-(\d+)\.npz", said)
    assert where and where.group(1) == where.group(2) == str(int(where.group(3)) + 1), said
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == 10 * 60  # 10 classes x 60
    assert len(metrics["acc_matrix"]) == 5
    wall = metrics["wall_seconds"]  # the total counts the first session too, as the phases do
    assert wall["total"] >= sum(v for k, v in wall.items() if k != "total")
