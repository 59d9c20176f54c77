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


def test_only_the_clusters_owner_gets_in():
    cluster = load_cluster(ROOT / "cluster.yaml")
    config = load_config(ROOT / "pipeline" / "configs" / "cluster.yaml")
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cluster[key]
              if "ray start" in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token" in c for c in starts)
    assert cluster["file_mounts"] == {"~/.ray/auth_token": "~/.memcl/cluster_token"}  # Ray's own token path
    heads = cluster["head_start_ray_commands"]
    opened = {**cluster, "head_start_ray_commands": [
        c.replace("RAY_AUTH_MODE=token ", "").replace("127.0.0.1", "0.0.0.0") for c in heads]}
    problems = check_cluster(opened, config)
    assert any("without RAY_AUTH_MODE=token" in p for p in problems)
    assert any("dashboard listens on 0.0.0.0" in p for p in problems)
    leaked = {**cluster, "worker_start_ray_commands": ["RAY_AUTH_MODE=token RAY_AUTH_TOKEN=abc ray start --address=x"]}
    assert any("token is written into the config" in p for p in check_cluster(leaked, config))
