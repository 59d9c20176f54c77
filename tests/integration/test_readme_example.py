"""The README's own-data example runs as written: its Python block writes the folder, its `memcl run` line learns
from it."""

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from memcl.pipeline import cli

pytestmark = pytest.mark.ray

README = Path(__file__).resolve().parents[2] / "README.md"


def own_data_example() -> tuple[str, list[str]]:
    section = README.read_text().split("## Your own data", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    command = re.search(r"```bash\n(memcl run .*?)\n```", section, flags=re.S).group(1)
    return code, shlex.split(command)[1:]


def test_readme_own_data_example_runs(ray_session, tmp_path, monkeypatch, capsys):
    code, argv = own_data_example()
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    rc = cli.main([*argv, "--set", "runtime.progress=false", "--set", "runtime.actor_threads=1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.search(r"A_last (\d+\.\d+)", out) and float(re.search(r"A_last (\d+\.\d+)", out).group(1)) > 80
    assert "samples streamed 800, learned 800" in out
    assert "cat, dog" in out  # class names from mydata/classes.txt in the summary


def python_example() -> str:
    section = README.read_text().split("## From Python", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_readme_python_api_example_runs_both_executors(ray_session, tmp_path, monkeypatch):
    code, _ = own_data_example()
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    scope: dict = {}
    exec(compile(python_example(), "README.md", "exec"), scope)
    result, local = scope["result"], scope["local"]
    assert result.samples.learned == 800 and result.run_dir.is_dir()
    matrix = np.array(result.metrics["acc_matrix"], dtype=float)
    assert matrix.shape == local.matrix.shape == (2, 2)
    # the same flow in both executors: equal up to float rounding of their thread counts
    np.testing.assert_allclose(local.matrix, matrix, atol=0.02)
    assert result.summary.a_last > 0.8
