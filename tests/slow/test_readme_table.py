"""README's table of what the default run reaches is what the runs give today (run with `pytest -m slow`):
`scripts/readme_table.py --check` runs `memcl run` (mars-memcl), the paper's `mars` and finetune at seed 0 and
compares."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(3700)]  # the check's own limit is 3600 s

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_is_what_the_default_runs_give(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/readme_table.py", "--check", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-2000:]
