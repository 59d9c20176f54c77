"""Fault injection for the pipeline tests: kill one actor once, at a chosen batch; or SIGKILL a `memcl` driver
process once a checkpoint is on disk."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ray


def killer(actors, role: str, at: tuple[int, int], restart: bool):
    """An on_batch hook that kills `role`'s actor once, when batch `at` = (visit, index) has been submitted; and the
    list it appends to when it did (Ray restarts the actor if `restart`, else the runner must start a new one)."""
    done = []

    def hook(visit, index):
        if (visit, index) == at and not done:
            done.append(True)
            ray.kill(actors.handle(role), no_restart=not restart)
    return hook, done


def memcl(*args, **kwargs) -> subprocess.Popen:
    """`memcl ARGS` in a new driver process, its output (stdout and stderr) on a pipe."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "memcl.pipeline.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def kill_driver_at_checkpoint(args: list[str], out: Path, checkpoint: str, timeout_s: float = 240) -> Path:
    """Start `memcl ARGS`, which writes its run folder under `out`; SIGKILL it as soon as the folder holds
    `checkpoint` (e.g. "checkpoints/ckpt-000001.sha256"), and return the folder. The run must not have finished."""
    proc = memcl(*args)
    deadline = time.time() + timeout_s
    found: list[Path] = []
    while time.time() < deadline and proc.poll() is None:
        found = list(out.glob(f"*/{checkpoint}"))
        if found:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(timeout=60)
    assert found, proc.stdout.read()
    run_dir = out / found[0].relative_to(out).parts[0]
    assert not (run_dir / "metrics.json").exists(), "the driver finished before it could be killed"
    return run_dir
