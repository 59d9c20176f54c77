"""benchmarks/gpu_check.py in its tiny mode on the CPU: every path it times runs here first, so the first run on a
GPU measures instead of failing."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    # benchmarks/ is no package: load the script as the module it is
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_tiny_table_has_one_positive_cpu_row_per_case(gpu_check, ray_session, one_torch_thread, tmp_path):
    rows = gpu_check.run_cases(gpu_check.tiny_sizes(tmp_path), "cpu")

    assert len(rows) == gpu_check.expected_rows("cpu") == 24
    for row in rows:
        assert math.isfinite(row.per_s) and row.per_s > 0, row
        assert row.seconds > 0 and row.repeats >= 1, row
        assert row.device == "cpu", row  # the actors' own report of where their encoder runs, for the pool rows
    variants = [(r.case, r.variant) for r in rows if r.case.startswith("encoder")]
    assert len(set(variants)) == 6  # 2 encoders x (in-process, 1 actor, 2 replicas)
    assert {r.variant for r in rows if r.case == "MARS learner"} == {"observe", "consolidate"}
    nsr = [r.variant for r in rows if r.case.startswith("NSR LoRA")]
    assert nsr == ["train steps", "1 worker (actor)", "2 data-parallel workers, num_gpus 0.0 each"]
    heads = {r.variant: r.note for r in rows if r.case == "head"}
    assert list(heads) == [f"{m} consolidate" for m in ("derpp", "ewc", "joint", "analytic-rp")]
    # a learner apart on the CPU learns the same: the comparison a GPU run reports is between equals here
    assert all("100.0% of rows predicted as on the CPU" in note for note in heads.values()), heads
    assert "statistics bit for bit the CPU's" in heads["analytic-rp consolidate"]
    placed = [r for r in rows if r.case == "MARS pipeline"]  # each role's device as its own process resolved it
    assert [r.variant for r in placed] == [f"{role} (num_gpus 0.0)" for role in ("memory", "monitor", "stage1",
                                                                                 "stage2", "predictor")]

    one, two = (r for r in rows if r.case == "LM answers (memcl lm)")
    assert (one.variant, two.variant) == ("1 replica (num_gpus 0)", "2 replicas (num_gpus 0)")
    assert two.note.endswith("the same answers as 1 replica: yes")  # two replicas answer in turn, as one would
    plain, adapted = (r for r in rows if r.case == "LM decode")
    assert (plain.variant, adapted.variant) == ("plain", "MIITA adapted")
    assert math.isnan(plain.nll_shift)
    # the gated update reached the logits: the answers' NLL under it differs from the plain decode's
    assert math.isfinite(adapted.nll_shift) and adapted.nll_shift > 1e-6

    table = gpu_check.markdown(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert len({line.count("|") for line in table}) == 1  # no note breaks a column


def test_main_prints_the_table_of_the_groups_asked_for(gpu_check, ray_session, one_torch_thread, capsys):
    assert gpu_check.main(["--tiny", "--only", "mars"]) == 0

    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| MARS learner")]
    assert len(table) == gpu_check.expected_rows("cpu", ("mars",)) == 2
    assert "| cpu |" in table[0]
    assert ray_session.is_initialized()  # the session's Ray is not shut down by the script
