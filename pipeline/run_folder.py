"""What makes a folder a memcl run folder, and the lock a run holds while it runs, so that `memcl runs clean` removes
only what memcl wrote and never a run in progress.

* The marker, `.memcl-run`, is written as memcl creates a run folder (`create`; `memcl run`, `memcl lm`, `memcl bench`
  and `memcl stress` all create theirs through it). A folder without it (one memcl did not create, or one written
  before markers existed) is listed by `memcl runs` but never removed.
* The lock, `.memcl-lock`, is `flock`ed by the process that runs (or resumes) the run, for as long as it runs. The
  kernel drops it when that process ends, however it ends, so a crashed run leaves no stale lock behind; a second
  process that would run the same folder, or remove it, finds it taken.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from memcl.pipeline.config import ConfigError
from memcl_ops import files

MARKER = ".memcl-run"
LOCK = ".memcl-lock"


class RunInUse(ConfigError):
    """The run folder's lock is held: another process is running (or removing) it."""


def create(path: Path) -> Path:
    """Create the run folder `path` (FileExistsError if it exists: it would not be memcl's) with its marker."""
    path.mkdir(parents=True)
    files.write_json(path / MARKER, {"created": time.time(), "pid": os.getpid()})
    return path


def is_marked(path: Path) -> bool:
    """Whether memcl created the folder (`create`)."""
    return (path / MARKER).is_file()


class RunLock:
    """The lock on a run folder, taken at construction (RunInUse if another process holds it) and held until
    `release` or the end of the process. A probe that holds it for a moment (`holder`, `memcl runs`) does not make a
    starting run fail: taking it retries for `wait` seconds."""

    def __init__(self, run_dir: Path, wait: float = 2.0):
        self.path = run_dir / LOCK
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    pid = holder(run_dir)
                    raise RunInUse(f"{run_dir}: in use by another memcl process"
                                   + (f" (pid {pid})" if pid else "") + "; wait for it to end, or stop it") from None
                time.sleep(0.05)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)  # who holds it, for the message above

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(run_dir: Path) -> int | None:
    """The pid of the process holding the run folder's lock (0 if it cannot be read), or None where none holds it."""
    path = run_dir / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        return None
    finally:
        os.close(fd)
