"""The lock of a run folder: held by the process running the run, refused to any other, and gone with that process
however it ends (a SIGKILLed run leaves no stale lock)."""

import signal
import subprocess
import sys

import pytest

from memcl.pipeline import run_folder

RUN = ("import sys, time; from pathlib import Path; from memcl.pipeline import run_folder; "
       "lock = run_folder.RunLock(Path(sys.argv[1])); print('running', flush=True); time.sleep(120)")


def test_the_lock_is_refused_while_held_and_free_once_its_process_is_killed(tmp_path):
    run_dir = run_folder.create(tmp_path / "run")
    assert run_folder.is_marked(run_dir) and run_folder.holder(run_dir) is None
    proc = subprocess.Popen([sys.executable, "-c", RUN, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        assert run_folder.holder(run_dir) == proc.pid
        with pytest.raises(run_folder.RunInUse, match=rf"in use by another memcl process \(pid {proc.pid}\)"):
            run_folder.RunLock(run_dir, wait=0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert run_folder.holder(run_dir) is None
    with run_folder.RunLock(run_dir, wait=0.0):
        assert run_folder.holder(run_dir) is not None  # this process holds it now
    assert run_folder.holder(run_dir) is None
    with pytest.raises(FileExistsError):
        run_folder.create(run_dir)  # an existing folder is never taken for a new run's
