"""cluster.yaml is a valid launcher config and fits what the cluster run config asks for."""

from dataclasses import replace
from pathlib import Path

from memcl.pipeline.cluster import check_cluster, load_cluster
from memcl.pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_cluster_yaml_fits_the_cluster_run_config():
    cluster = load_cluster(ROOT / "cluster.yaml")
    config = load_config(ROOT / "pipeline" / "configs" / "cluster.yaml")
    assert check_cluster(cluster, config) == []
    types = cluster["available_node_types"]
    assert types[cluster["head_node_type"]]["resources"].get("GPU", 0) == 0  # a CPU head
    gpu = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu and all(t["resources"].get("memcl_encoder") == config.encoder.resources["memcl_encoder"] for t in gpu)
    assert config.encoder.num_gpus == 1 and config.runtime.address == "auto"


def test_check_names_what_does_not_fit():
    cluster = load_cluster(ROOT / "cluster.yaml")
    config = load_config(ROOT / "pipeline" / "configs" / "cluster.yaml")
    greedy = replace(config, encoder=replace(config.encoder, num_gpus=2))
    assert any("no node type offers" in p for p in check_cluster(cluster, greedy))
    many = replace(config, encoder=replace(config.encoder, replicas=50))
    assert any("at most 8" in p for p in check_cluster(cluster, many))
    broken = {**cluster, "provider": "aws"}
    assert check_cluster(broken, config)[0].startswith("not a valid Ray cluster-launcher config")
