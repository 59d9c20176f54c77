"""Ray's token authentication stays on: a cluster started with it refuses a client without its token (a plain Ray
client, and `memcl run` with one line from memcl at once, before Ray's own retries), `memcl run --address` with the
token runs, and an in-process Ray that memcl starts makes a token readable by its owner only. (The rest of the suite
runs with RAY_AUTH_MODE=disabled, set by tests/conftest.py and .ci/run, never by memcl.)"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "data.dataset=synthetic", "--set", "stream.tasks=2", "--set", "data.synthetic.train_per_class=20",
        "--set", "data.synthetic.test_per_class=10", "--set", "method.stage1.optim.epochs=1",
        "--set", "method.stage2.optim.epochs=1", "--set", "runtime.progress=false"]


def _env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any Ray authentication setting, a home of its own (no ~/.ray/auth_token), and
    `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # a refused client stops retrying after a second (Ray's own default retries for 20 s)
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT), "RAY_gcs_server_port_wait_time_s": "1", **extra}


def _memcl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memcl.pipeline.cli", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


def test_a_token_cluster_refuses_clients_without_its_token_and_runs_memcl_with_it(tmp_path):
    token = tmp_path / "token"
    token.write_text("a" * 64)
    token.chmod(0o600)
    cluster_env = {**_env(tmp_path / "head"), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    head = subprocess.Popen([sys.executable, str(Path(__file__).with_name("token_cluster.py"))], env=cluster_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = head.stdout.readline().strip()
        assert address, "the token cluster did not start"
        # a plain Ray client that sends no token: the cluster's GCS refuses it
        plain = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={address!r})"],
                               env=_env(tmp_path / "plain", RAY_AUTH_MODE="disabled"), capture_output=True,
                               text=True, timeout=120)
        assert plain.returncode != 0 and "Failed to connect" in plain.stderr, plain.stderr[-2000:]

        out = str(tmp_path / "runs")
        for home, extra, said in ((tmp_path / "none", {}, "needs its token, and none was found"),
                                  (tmp_path / "wrong", {"RAY_AUTH_TOKEN": "b" * 64}, "refused the token from")):
            env = _env(home, **extra)
            del env["RAY_gcs_server_port_wait_time_s"]  # Ray's own retries as a user meets them: memcl asks first
            refused = _memcl(env, "run", "--address", address, "--out", out, *TINY)
            lines = refused.stderr.strip().splitlines()
            assert refused.returncode == 2 and len(lines) == 1 and said in lines[0], refused.stderr[-2000:]
        assert not Path(out).exists() or not any(Path(out).iterdir())  # refused before any run folder

        joined = _memcl(_env(tmp_path / "owner", RAY_AUTH_TOKEN_PATH=str(token)), "run", "--address", address,
                        "--out", out, *TINY)
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert "A_last" in joined.stdout

        # without --address memcl starts a Ray of its own: it never joins the cluster started last on the machine
        # (a plain ray.init would join this one, named in /tmp/ray/ray_current_cluster, and be refused)
        own = _memcl(_env(tmp_path / "own"), "run", "--out", str(tmp_path / "own-runs"), *TINY)
        assert own.returncode == 0 and "A_last" in own.stdout, own.stderr[-3000:]
    finally:
        head.communicate(input="", timeout=120)


def test_memcl_starts_its_own_ray_with_a_token_only_its_owner_can_read(tmp_path):
    home = tmp_path / "home"
    done = _memcl(_env(home), "run", "--out", str(tmp_path / "runs"), *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    token = home / ".ray" / "auth_token"
    assert len(token.read_text()) == 64
    assert stat.S_IMODE(token.stat().st_mode) == 0o600  # Ray itself would have written it with the umask's 0o644
    assert "Token authentication" not in done.stderr  # Ray's notice that it chose the mode itself: memcl chose it


def test_a_token_path_that_names_no_file_is_one_line(tmp_path):
    missing = tmp_path / "no-token"
    done = _memcl(_env(tmp_path / "home", RAY_AUTH_TOKEN_PATH=str(missing)), "run", "--out", str(tmp_path), *TINY)
    assert done.returncode == 2 and f"RAY_AUTH_TOKEN_PATH={missing}: no such file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "home" / ".ray").exists()
