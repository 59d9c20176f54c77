"""A `memcl stress` run that stops (here chaos mode with no replay allowed) names the command that continues its
folder, and that command does; the folder's name carries one seed."""

from pathlib import Path

import pytest

from memcl.pipeline import cli

pytestmark = pytest.mark.ray


def test_a_stopped_stress_run_names_the_command_that_finishes_its_folder(ray_session, tmp_path, capsys):
    # chaos mode through --set: the chaos run alone (--chaos would run a fault-free twin first)
    args = ["stress", "--tasks", "2", "--signals", "reference", "--set", "runtime.chaos_seconds=0.2", "--set",
            "runtime.max_recoveries=0", "--out", str(tmp_path)]
    assert cli.main(args) == 1
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("memcl: error:"))
    (stopped,) = tmp_path.iterdir()
    assert stopped.name.endswith("-mars-memcl-reference-drift-v2-t20-d32-s0-chaos")  # one seed: the stream's
    assert "actor faults in a row" in line and f"`memcl run --resume {stopped}` finishes its stream" in line
    assert "memcl stress does not resume a run" in line and "a longer --chaos interval" in line
    assert cli.main(["run", "--resume", str(stopped)]) == 0
    assert Path(stopped, "metrics.json").is_file() and "run folder: " + str(stopped) in capsys.readouterr().out
