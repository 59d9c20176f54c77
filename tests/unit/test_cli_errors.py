"""Every user error of the command line is one line on stderr naming the problem, a non-zero exit, and no Ray:
the commands run in a fresh interpreter that reports whether Ray was ever started."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs each argv through `memcl`'s main in one interpreter (imports cost seconds; each error must not).
PROBE = """
import contextlib, io, json, sys, time
from memcl.pipeline import cli
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    ray = sys.modules.get("ray")
    out.append({"rc": rc, "stderr": err.getvalue(), "seconds": time.perf_counter() - t0,
                "ray": bool(ray is not None and ray.is_initialized())})
print(json.dumps(out))
"""

CASES = {  # argv -> words the one line must contain
    "run --set method.nmae=x": ["nmae", "method.name"],
    "run --set stream.tasks=0": ["tasks", "at least 1"],
    "run --set stream.tasks=11": ["stream.tasks", "11 tasks", "1, 2, 5, 10"],
    "run --set method.name=foo": ["method.name", "'foo'", "finetune"],
    "run --config /no/such.yaml": ["/no/such.yaml", "no such file"],
    "run --resume runs/nope": ["runs/nope", "no such folder"],
    "report runs/nope": ["runs/nope", "no such folder"],
    "run --set data.dataset=imagenet": ["data.dataset", "'imagenet'", "arrow:<folder>"],
    "run --set data.dataset=arrow:/no/such/folder": ["/no/such/folder", "no such folder", "<folder>/train/"],
    "run --set data.dataset=image-folder:/no/such/folder": ["/no/such/folder", "no such folder"],
    "run --set method.name=nsr": ["encoder.spec.name", "efficientnet-lite0", "minilm", "nsr-bbc-cyclic.yaml"],
    "run --set method.name=nsr --set encoder.spec.name=minilm --set data.dataset=bbc-news": [
        "stream.tasks", "bbc-news", "5 tasks", "two classes"],
    "run --set method.name=nsr --set encoder.spec.name=minilm --set data.dataset=synthetic": [
        "data.dataset", "raw text or image", "features"],
    "run --set encoder.spec.name=bert": ["encoder.spec.name", "minilm"],
    "run --set stream.task_free=true --set method.name=nsr": ["stream.task_free", "mars-memcl"],
    "bench fmnist-5x2 --methods mars,foo": ["method.name", "'foo'"],
    "lm --set budgetz=[1]": ["budgetz"],
    "lm --set model.name=nope": ["model.name", "'nope'", "tiny:<arch>"],
    "lm --set methods=[bogus]": ["bogus"],
    "lm --set methods=[mars]": ["unknown LM method", "'mars'", "miita"],
    "run --set method.name=miita": ["method.name", "miita", "memcl lm"],
    "lm --resume runs/nope": ["runs/nope", "no such folder"],
    "run --set stream.tasks": ["key=value"],
    "stress --tasks 10 --set method.nmae=x": ["nmae", "method.name"],
    "stress --tasks 10 --signals reference,bogus": ["signal", "'bogus'"],
    "run --set runtime.data_parallel=2": ["runtime.data_parallel", "mars-memcl", "nsr-fresh"],
    "run --set runtime.data_parallel=0": ["runtime.data_parallel", "1 or more"],
    "run --set runtime.placement.encoder.num_gpus=1": ["runtime.placement", "'encoder'", "stage1"],
    "run --config pipeline/configs/nsr-bbc-cyclic.yaml --set runtime.data_parallel=64 "
    "--set runtime.placement.adapter_trainer.num_gpus=1": ["runtime.placement", "64 GPUs", "adapter_trainer 1 x 64",
                                                            "runtime.data_parallel"],
    "run --set encoder.num_gpus=1 --set encoder.replicas=64": ["runtime.placement", "64 GPUs", "encoder 1 x 64"],
    "lm --set runtime.lm_replicas=0": ["runtime.lm_replicas", "1 or more"],
    "lm --set model.name=tiny:llama --methods base,miita --set runtime.data_parallel=2": [
        "runtime.data_parallel", "base, miita", "lora"],
    "lm --set model.name=tiny:llama --set runtime.data_parallel=8 --set runtime.placement.lm_trainer.num_gpus=1": [
        "runtime.placement", "8 GPUs", "lm_trainer 1 x 8", "runtime.data_parallel"],
    "lm --set model.name=tiny:llama --set runtime.lm_replicas=64 --set runtime.placement.lm_encoder.num_gpus=1": [
        "runtime.placement", "64 GPUs", "lm_encoder 1 x 64", "runtime.lm_replicas"],
    "run --set stream.realtime.mode=simulated --set runtime.transport=compiled": [
        "stream.realtime", "runtime.transport=actors"],
    "run --set stream.realtime.mode=later": ["stream.realtime.mode", "'later'", "simulated"],
    "run --set stream.realtime.mode=simulated --set method.name=nsr-fresh": ["stream.realtime", "nsr-fresh"],
    "run --set runtime.prequential.near_future=0": ["near_future", ">= 1"],
    "run --set stream.follow=true": ["stream.follow", "fashion-mnist", "arrow:<folder>"],
    "run --set stream.idle_timeout_s=30": ["stream.idle_timeout_s", "stream.follow=true"],
    "run --set stream.follow=true --set stream.idle_timeout_s=0": ["idle_timeout_s", "above 0"],
    "run --set stream.follow=true --set data.dataset=arrow:/no/such/folder": ["/no/such/folder", "no such folder"],
    "run --set stream.follow=true --set data.dataset=arrow:/data --set method.name=nsr": [
        "stream.follow", "nsr", "features methods"],
    "run --set stream.follow=true --set data.dataset=arrow:/data --set runtime.anytime=2": [
        "runtime.anytime", "stream.follow"],
    "run --set stream.follow=true --set data.dataset=arrow:/data --set stream.realtime.mode=simulated": [
        "stream.realtime", "stream.follow"],
    "run --set stream.follow=true --set data.dataset=arrow:/data --set runtime.transport=compiled": [
        "runtime.transport=compiled", "stream.follow"],
}


@pytest.fixture(scope="module")
def results():
    argvs = [case.split() for case in CASES]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return dict(zip(CASES, json.loads(proc.stdout.splitlines()[-1])))


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_and_no_ray(results, case):
    result = results[case]
    assert result["rc"] == 2
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1, result["stderr"]
    assert lines[0].startswith("memcl: error: ") and "Traceback" not in result["stderr"]
    for word in CASES[case]:
        assert word in lines[0]
    assert not result["ray"]  # refused before Ray started
    assert result["seconds"] < 20


def test_every_command_an_error_suggests_works_as_written(results):
    """The `memcl ...` commands the refusals suggest, run as written (`run` and `lm` with --check: they would start)."""
    suggested = sorted({command for r in results.values() for command in re.findall(r"`memcl ([^`]+)`", r["stderr"])})
    assert len(suggested) >= 3, suggested  # the NSR config, `memcl lm --methods`, `memcl list methods` at least
    argvs = [shlex.split(c) + (["--check"] if c.split()[0] in ("run", "lm") else []) for c in suggested]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for command, result in zip(suggested, json.loads(proc.stdout.splitlines()[-1])):
        assert result["rc"] == 0 and not result["ray"], (command, result["stderr"])


def test_debug_shows_the_traceback():
    proc = subprocess.run([sys.executable, "-m", "memcl.pipeline.cli", "run", "--debug", "--set", "method.name=foo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr


def test_help_is_complete():
    from memcl.pipeline.cli import build_parser

    parser = build_parser()
    top = parser.format_help()
    commands = ["run", "stress", "lm", "runs", "report", "bench", "list", "config"]
    for name in commands:
        assert name in top
    sub = next(a for a in parser._actions if a.dest == "command").choices
    assert sorted(sub) == sorted(commands)
    for name, command in sub.items():
        for action in command._actions:
            assert action.help, f"memcl {name} {action.option_strings or action.dest} has no help"


def test_config_show_loads_back_to_the_default_and_documents_keys(capsys):
    import yaml

    from memcl.pipeline.cli import main
    from memcl.pipeline.config import RunConfig, to_dict

    assert main(["config", "--show", "--set", "stream.tasks=2"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == {**to_dict(RunConfig()), "stream": {**to_dict(RunConfig())["stream"], "tasks": 2}}
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()}
    assert "Parquet feature cache" in lines["cache_dir"]  # the field's comment in pipeline/config.py
    assert all("  # " in line for line in text.splitlines())  # every key has at least its type


@pytest.mark.parametrize("what, expected", [("methods", ["mars-memcl", "nsr", "finetune"]),
                                            ("datasets", ["fashion-mnist", "arrow:<folder>", "bbc-news"]),
                                            ("suites", ["fmnist-5x2", "bbc-text"])])
def test_list(capsys, what, expected):
    from memcl.pipeline.cli import main
    from memcl_ops.methods import METHODS

    assert main(["list", what]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert set(expected) <= set(names)
    if what == "methods":
        assert names == list(METHODS)


def test_check_reads_the_first_files_of_an_arrow_folder(tmp_path, capsys):
    """A data.feature_dim or data.payload that the folder's first data files contradict is one line naming the first
    such file and the value to set, before Ray starts; a file no reader opens is passed over (the gate refuses it), and
    a file with rows of the configured width, or a later one, lets the run start (the gate judges the other rows one
    by one); a stream of features names no encoder, since none runs."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memcl.pipeline import cli

    def rows(widths):
        n = len(widths)
        return pa.table({"sample_id": np.arange(n), "task_id": pa.array([0] * n, pa.int32()),
                         "label": pa.array([0, 1] * (n // 2), pa.int32()), "features": [[0.5] * w for w in widths]})

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "0-garbage.parquet").write_bytes(b"\x00" * 64)
    pq.write_table(rows([15, 16, 16, 16]), tmp_path / "train" / "1.parquet")
    pq.write_table(rows([17, 17]), tmp_path / "train" / "2.parquet")

    def check(*settings):
        rc = cli.main(["run", "--check", "--set", f"data.dataset=arrow:{tmp_path}",
                       *[a for s in settings for a in ("--set", s)]])
        captured = capsys.readouterr()
        return rc, (captured.out + captured.err).strip()

    assert check("data.feature_dim=14") == (2, "memcl: error: data.feature_dim: 14, but the features of "
                                               "train/1.parquet have 16 values: set data.feature_dim=16")
    assert check("data.payload=text") == (2, "memcl: error: data.payload: text, but train/1.parquet has no text "
                                             "column; it carries features: set data.payload=features")
    for dim in (15, 16, 17):
        assert check(f"data.feature_dim={dim}") == (0, f"memcl: the run can start: mars-memcl (features) on "
                                                       f"arrow:{tmp_path}, features as given (no encoder)")
