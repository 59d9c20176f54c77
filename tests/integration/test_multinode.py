"""On a real multi-node Ray cluster: encoder replicas spread over the nodes give the single-node result, and a node
lost mid-run is replayed on the nodes left to the undisturbed result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # several Ray nodes and runs: minutes on 2 cores


def cluster_script(name: str, tmp_path: Path) -> dict:
    """Run tests/integration/`name` in a fresh process (a multi-node cluster cannot share the test session's Ray)
    and return the JSON it prints last."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name(name)), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_replicas_on_different_nodes_match_the_single_node_run(tmp_path):
    result = cluster_script("multinode.py", tmp_path)
    nodes = [e["node"] for e in result["multi"]["encoders"]]
    assert len(nodes) == 2 and len(set(nodes)) == 2  # one replica per node
    assert set(nodes) <= set(result["worker_nodes"])  # on the nodes that offer memcl_encoder, not the head
    np.testing.assert_array_equal(np.array(result["multi"]["acc_matrix"], float),
                                  np.array(result["single"]["acc_matrix"], float))
    assert result["multi"]["samples"] == result["single"]["samples"]


def test_a_worker_node_lost_mid_run_is_replayed_on_the_nodes_left(tmp_path):
    result = cluster_script("node_loss.py", tmp_path)
    before, after = result["undisturbed"], result["disturbed"]
    for role in ("source", "memory", "monitor", "stage1", "stage2"):  # the learners ran where they were placed
        assert after["placement"][role]["node"] == result["learner_node"], role
    assert len(result["removed"]) == 1 and result["removed"][0] in result["encoder_nodes"]
    survivor = (set(result["encoder_nodes"]) - set(result["removed"])).pop()
    assert after["placement"]["encoder0"]["node"] == survivor  # the replica came back on the node left
    assert before["recoveries"] == 0 and after["recoveries"] >= 1
    np.testing.assert_array_equal(np.array(after["acc_matrix"], float), np.array(before["acc_matrix"], float))
    assert after["samples"] == before["samples"]
    assert after["samples"]["learned"] == after["samples"]["unique_learned"] == after["samples"]["stream"]
    assert after["slots"] == before["slots"]
