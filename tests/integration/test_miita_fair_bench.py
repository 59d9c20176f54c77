"""benchmarks/miita_fair.py in its tiny mode: the knobs are chosen on the dev split before any test run, every
memory stays within its budget, and the query cost counts replay's demonstrations (the RESULTS.md table comes from
the full mode on SmolLM2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.miita_fair import CANDIDATES

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_benchmark_chooses_on_dev_and_reports_costs(tmp_path):
    subprocess.run([sys.executable, "-m", "benchmarks.miita_fair", "--tiny", "--seeds", "0", "--budgets", "512",
                    "--methods", "base", "replay", "nearest-answer", "miita", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    report = json.loads((tmp_path / "fair.json").read_text())["partly"]
    assert [{k: t[k] for k in CANDIDATES[0]} for t in report["dev"]] == CANDIDATES  # every candidate tried on dev
    best = max(report["dev"], key=lambda t: t["dev_a_last"])  # the first of the best
    assert report["knobs"] == {k: best[k] for k in CANDIDATES[0]}
    rows = report["rows"]
    assert set(rows) == {"base", "replay@512B", "nearest-answer@512B", "miita@512B"}
    for run, r in rows.items():
        assert 0 <= r["bytes"][0] <= 512, run
        assert 0.0 <= r["a_last"][0] <= 1.0 and r["ms_per_query"][0] > 0, run
    assert rows["replay@512B"]["prompt_tokens"][0] > rows["base"]["prompt_tokens"][0]  # demonstrations are read
    assert rows["miita@512B"]["prompt_tokens"][0] == rows["base"]["prompt_tokens"][0]  # MIITA adds no prompt
    # --summarise rebuilds the same table from the run folders, the dev runs left out
    table = subprocess.run([sys.executable, "-m", "benchmarks.miita_fair", "--summarise", "partly", "--out",
                            str(tmp_path)], cwd=ROOT, check=True, capture_output=True, text=True, timeout=300).stdout
    counts = table.split("seeds per run: ")[1].strip().split(", ")
    assert sorted(counts) == sorted(f"{run} 1" for run in rows)
    assert f"| miita@512B | {100 * rows['miita@512B']['a_last'][0]:.1f} ± 0.0 |" in table


def test_given_knobs_are_json_values_and_anything_else_is_refused_by_name():
    from benchmarks.miita_fair import given_knobs

    assert given_knobs(["memory.positions=2", "memory.centre_keys=false"]) == {"memory.positions": 2,
                                                                               "memory.centre_keys": False}
    with pytest.raises(SystemExit, match=r"centre_keys.*not JSON"):
        given_knobs(["memory.centre_keys=False"])  # Python's spelling would be the truthy string "False"
    with pytest.raises(SystemExit, match=r"SECTION\.KEY=VALUE"):
        given_knobs(["positions=2"])
