"""`.ci/run` executes the README's test command; both README set-up commands go through scripts/setup.sh."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_ci_runs_the_one_readme_test_line():
    readme = (ROOT / "README.md").read_text()
    # the same pattern .ci/run greps for: exactly one line, and it is the README's test command block
    lines = [ln for ln in readme.splitlines() if re.match(r"^scripts/setup\.sh --test( |$)", ln)]
    assert len(lines) == 1
    assert lines[0].endswith("python -m pytest -q")
    assert any(block.strip() == lines[0] for block in bash_blocks(readme))
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -E '^scripts/setup\\.sh --test( |$)' README.md" in ci


def test_readme_setup_commands_need_no_sudo():
    blocks = [b.strip() for b in bash_blocks((ROOT / "README.md").read_text())]
    setup = [b for b in blocks if b.startswith("scripts/setup.sh")]
    assert len(setup) == 2
    assert not any("sudo" in b for b in setup)


def test_setup_script_refuses_unknown_options():
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--nope"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage" in result.stderr
