"""A live stream: a run follows an `arrow:` folder (`stream.follow`) while a writer renames files into its train/,
until `stream.idle_timeout_s` ends it: in this process, and as `memcl run` across a SIGKILLed driver, a Ctrl-C and
two `--resume`s. Every labelled row is learned once, every unlabelled row predicted once, and the run equals an
uninterrupted run over the whole folder."""

import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from memcl.pipeline import checkpoint, runner
from memcl.pipeline.config import dump_config
from tests.integration.test_predictions import ROWS, config, sink, write_folder
from tests.killing import kill_driver_at_checkpoint, killer, memcl

TASKS, IDLE_S = 4, 5.0


def land(staged: Path, train: Path, name: str) -> None:
    """A file copied in under a dot name and renamed into train/ once whole, as a writer must."""
    shutil.copy(staged / name, train / f".{name}")
    os.rename(train / f".{name}", train / name)


def wait_for(found, what: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not found():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(0.05)


def said(proc, words: str) -> str:
    """The driver's output up to the line that holds `words` (the driver goes on)."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if words in line:
            return "".join(seen)
    raise AssertionError(f"the driver ended without saying {words!r}: {''.join(seen)}")


def learned_ids(run_dir: Path) -> np.ndarray:
    """The sample ids the predictor consolidated, as the run's last checkpoint holds them."""
    _, parts, _ = checkpoint.latest_valid(run_dir / "checkpoints")
    return np.concatenate([np.arange(a, b) for a, b in parts["predictor"]["learned.ranges"]])


def task_free(cfg):
    """Rounds of two batches, whatever the visits (a task-free round is planned once a batch beyond it has come)."""
    return dataclasses.replace(cfg, stream=dataclasses.replace(cfg.stream, task_free=True),
                               method=dataclasses.replace(cfg.method, consolidate_every=2))


def followed(cfg, idle_s: float):
    return dataclasses.replace(cfg, stream=dataclasses.replace(cfg.stream, follow=True, idle_timeout_s=idle_s,
                                                                 poll_s=0.05))


def assert_same_run(run_dir: Path, metrics: dict, whole, hidden: np.ndarray, late: dict[int, int]) -> list[int]:
    """Each labelled row learned once and each unlabelled row predicted once, as the run over the whole folder did;
    returns the labelled sample ids."""
    samples = metrics["samples"]
    labelled = sorted(set(range(TASKS * ROWS)) - set(hidden.tolist()) | set(late))
    assert samples == whole.metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == len(labelled)
    predicted = sink(run_dir)
    assert sorted(predicted.column("sample_id").to_pylist()) == sorted(hidden.tolist())
    assert predicted.equals(sink(whole.run_dir))
    assert metrics["prequential"] == whole.metrics["prequential"]
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], float), whole.matrix)
    assert [r["batches"] for r in metrics["round_log"]] == [r["batches"] for r in whole.metrics["round_log"]]
    return labelled


@pytest.mark.parametrize("rounds", ["visits", "task-free"])
def test_a_folder_that_starts_empty_is_followed_in_this_process_until_its_idle_timeout(tmp_path, rounds):
    """Held in this process (no Ray): train/ starts empty and a writer thread renames the files in one by one."""
    staged = tmp_path / "staged"
    hidden, late, _ = write_folder(staged, tasks=TASKS)
    cut = task_free if rounds == "task-free" else lambda cfg: cfg
    whole = runner.run(cut(config(staged, tmp_path / "whole")), in_process=True, progress=False)
    # task-free: 14 batches (3 of each task's file, one of each label file), 2 a round
    assert len(whole.metrics["round_log"]) == (TASKS if rounds == "visits" else 7)
    live = tmp_path / "live"
    shutil.copytree(staged / "test", live / "test")
    (live / "train").mkdir()

    def writer() -> None:
        for path in sorted((staged / "train").iterdir()):
            time.sleep(0.2)
            land(staged / "train", live / "train", path.name)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    result = runner.run(followed(cut(config(live, tmp_path / "live-runs")), idle_s=2.0), in_process=True,
                        progress=False)
    thread.join(timeout=10)
    assert_same_run(result.run_dir, result.metrics, whole, hidden, late)


@pytest.mark.slow
@pytest.mark.ray
def test_the_source_killed_while_the_folder_grows_replays_its_round_over_the_same_files(actors, tmp_path):
    """The source actor dies in the second round, no restart: a new one reads the folder as it is now, is restored to
    the files the last commit had taken and given those the driver planned over since, and the round replays."""
    staged = tmp_path / "staged"
    hidden, late, _ = write_folder(staged, tasks=TASKS)
    whole = runner.run(config(staged, tmp_path / "whole"), actors=actors, progress=False)
    live = tmp_path / "live"
    shutil.copytree(staged / "test", live / "test")
    (live / "train").mkdir()
    names = sorted(p.name for p in (staged / "train").iterdir())
    for name in names[:3]:  # task 0's files and task 1's first: the first round is known at the start
        land(staged / "train", live / "train", name)

    def writer() -> None:
        for name in names[3:]:
            time.sleep(0.5)
            land(staged / "train", live / "train", name)

    hook, killed = killer(actors, "source", at=(1, 0), restart=False)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    result = runner.run(followed(config(live, tmp_path / "live-runs"), idle_s=3.0), actors=actors, on_batch=hook,
                        progress=False)
    thread.join(timeout=10)
    assert killed and result.recoveries >= 1
    assert_same_run(result.run_dir, result.metrics, whole, hidden, late)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)  # four drivers start Ray: minutes
def test_a_growing_folder_is_learned_once_across_a_kill_a_ctrl_c_and_resumes(actors, tmp_path):
    staged = tmp_path / "staged"
    hidden, late, _ = write_folder(staged, tasks=TASKS)
    reference = runner.run(config(staged, tmp_path / "ref"), actors=actors)  # the whole folder, read once

    live, out = tmp_path / "live", tmp_path / "live-runs"
    shutil.copytree(staged / "test", live / "test")
    (live / "train").mkdir()
    for name in ("0.parquet", "0z-labels.parquet"):
        land(staged / "train", live / "train", name)
    dump_config(followed(config(live, out), IDLE_S), tmp_path / "live.yaml")

    # the writer lands each file once its cue has come: while the first driver sets up, while no driver runs, and
    # while each resumed driver waits for the file that closes its next visit
    cues = {name: threading.Event() for name in ("killed", "resumed", "resumed again")}
    first_started = lambda: any(out.glob("*/config.yaml"))  # noqa: E731
    plan = [(first_started, "1.parquet"), (cues["killed"].is_set, "1z-labels.parquet"),
            (cues["resumed"].is_set, "2.parquet"), (cues["resumed again"].is_set, "3.parquet")]
    landed: list[str] = []

    def writer() -> None:
        for cue, name in plan:
            wait_for(cue, f"cue for {name}", timeout_s=600)
            land(staged / "train", live / "train", name)
            landed.append(name)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()

    run_dir = kill_driver_at_checkpoint(["run", "--config", str(tmp_path / "live.yaml"), "--set",
                                         "runtime.num_cpus=1"], out, "checkpoints/ckpt-000000.sha256")
    assert landed == ["1.parquet"]  # the visit the first round ended was closed by a file that landed mid-run
    cues["killed"].set()

    # Ctrl-C while the resumed driver waits for the next file: a clean stop at its last checkpoint
    second = memcl("run", "--resume", str(run_dir), start_new_session=True,
                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "after visit 1 of 2 (1 done, following the folder for more)" in said(second, "memcl: resuming")
    cues["resumed"].set()
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-000001.sha256").exists(), "checkpoint after visit 2")
    os.killpg(second.pid, signal.SIGINT)
    rest, _ = second.communicate(timeout=120)
    assert second.returncode == 130 and "Traceback" not in rest, rest
    assert re.search(rf"memcl: interrupted; continue the run with: memcl run --resume {re.escape(str(run_dir))}$",
                     rest.strip()), rest

    third = memcl("run", "--resume", str(run_dir))
    said(third, "memcl: resuming")
    cues["resumed again"].set()
    started = time.monotonic()
    rest, _ = third.communicate(timeout=300)
    assert third.returncode == 0, rest
    assert time.monotonic() - started >= IDLE_S  # it waited for more before the stream ended
    thread.join(timeout=10)
    assert landed == [name for _, name in plan]

    labelled = assert_same_run(run_dir, json.loads((run_dir / "metrics.json").read_text()), reference, hidden, late)
    np.testing.assert_array_equal(np.sort(learned_ids(run_dir)), labelled)  # the learner's own record: each once
    _, parts, _ = checkpoint.latest_valid(run_dir / "checkpoints")
    assert json.loads(parts["source"]["train_files"].item()) == sorted(p.name for p in (staged / "train").iterdir())
