"""Fault injection for the pipeline tests: kill one actor once, at a chosen batch; kill seeded actors as chosen steps
of the run begin (the commit, the evaluation, a checkpoint, a replay's restore, the run's report); or SIGKILL a
`memcl` driver process once a checkpoint is on disk."""

import os
import random
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


def restarted_quietly(handle) -> None:
    """Kill an actor for Ray to restart and wait until the restart is done, so that no call of the runner fails:
    the actor answers again, from its construction state."""
    ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(handle.__ray_ready__.remote())
            return
        except ray.exceptions.ActorUnavailableError:  # still restarting (the first calls may still reach the old one)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# the n-th time (1-based) each step begins: the kills a phase killer aims at every window of the run. Kills that
# land before one replay are one fault; those at the start, an evaluation and the report are three apart at least.
AIMS = {"start": 1, "evaluate": 2, "commit": 3, "checkpoint": 2, "restore": 1, "report": 1}


def phase_killer(actors, roles: list[str], seed: int, aims: dict[str, int] = AIMS):
    """An on_phase hook that kills a seeded choice of `roles` (restarted by Ray or not, also drawn) the n-th time
    each phase of `aims` begins; and the list of (phase, role) it appends to at each kill."""
    draw, seen, done = random.Random(seed), {}, []

    def hook(phase: str) -> None:
        seen[phase] = seen.get(phase, 0) + 1
        if aims.get(phase) == seen[phase]:
            role = draw.choice(roles)
            ray.kill(actors.handle(role), no_restart=draw.random() < 0.5)
            done.append((phase, role))
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
