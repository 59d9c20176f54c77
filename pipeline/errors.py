"""How `memcl` reports what stops a command: a user error (a bad config, path or data source) or Ctrl-C is one
line; anything else is one line that points at `--debug`. Imports nothing heavy, so the CLI can use it at once."""

from __future__ import annotations

import sys
from pathlib import Path


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; `run_dir` is the folder `<command> --resume` continues from its last checkpoint.
    `next_step`: what to do instead, where that command is not the one that continues it."""

    def __init__(self, run_dir: Path, command: str = "memcl run", next_step: str | None = None):
        super().__init__(str(run_dir))
        self.run_dir, self.command = run_dir, command
        self.next_step = next_step or f"continue the run with: {command} --resume {run_dir}"


class RunStopped(RuntimeError):
    """A run that cannot go on (actor faults in a row past `runtime.max_recoveries`); `run_dir` keeps its last
    committed checkpoint, so `<command> --resume run_dir` continues it (or what `next_step` says; None: a run stopped
    before it had a folder to continue, in set-up)."""

    def __init__(self, why: str, run_dir: Path | None, command: str = "memcl run", next_step: str | None = None):
        super().__init__(why)
        self.why, self.run_dir, self.command = why, run_dir, command
        self.next_step = next_step or f"continue the run with: {command} --resume {run_dir}"


# the errors that are the user's to fix (a config, a path, something to install), by class name (an actor's
# constructor error arrives as text only, and naming them keeps this module free of heavy imports)
USER_ERRORS = ("ConfigError", "DatasetUnavailable", "FileNotFoundError", "LMUnavailable", "EncoderUnavailable")


def one_line(err: BaseException) -> tuple[str, bool]:
    """(the message of `err` on one line, whether it is the user's error rather than memcl's)."""
    if "ray" in sys.modules:  # an actor's error arrives wrapped; what matters is the cause
        from ray.exceptions import RayTaskError

        from memcl.pipeline.actor_cache import failed_to_start

        while isinstance(err, RayTaskError) and err.cause is not None:
            err = err.cause
        if failed_to_start(err):
            # the actor's constructor raised: Ray keeps only its traceback's text, whose last line is the error
            last = next((line for line in reversed(err.error_msg.splitlines()) if line.strip()), "")
            name, _, text = last.partition(": ")
            user = name.rsplit(".", 1)[-1] in USER_ERRORS
            return (" ".join(text.split()) if user else f"an actor could not start: {' '.join(last.split())}"), user
    user = any(cls.__name__ in USER_ERRORS for cls in type(err).__mro__)
    text = " ".join(str(err).split())
    return (text if user else f"{type(err).__name__}: {text}"), user
