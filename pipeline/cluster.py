"""Does a Ray cluster-launcher config give the pipeline what it asks for?"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import ray
import yaml

from memcl.pipeline.config import RunConfig


def launcher_schema() -> dict:
    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def check_cluster(cluster: dict, config: RunConfig) -> list[str]:
    """Problems that would keep `config`'s actors from being placed on `cluster` (empty: it fits)."""
    try:
        jsonschema.validate(cluster, launcher_schema())
    except jsonschema.ValidationError as err:
        return [f"not a valid Ray cluster-launcher config: {err.message}"]
    problems = open_doors(cluster)
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    if head["resources"].get("CPU", 0) < 1:
        problems.append("the head needs a CPU for the driver and the learner actors")
    enc = config.encoder
    want = {"CPU": enc.num_cpus, **enc.resources}
    if enc.num_gpus not in ("auto", 0, 0.0):
        want["GPU"] = enc.num_gpus
    fitting = {name: t for name, t in types.items() if all(t["resources"].get(k, 0) >= v for k, v in want.items())}
    if not fitting:
        problems.append(f"no node type offers what an encoder replica asks for: {want}")
    replicas_per_node = {name: min(int(t["resources"].get(k, 0) // v) for k, v in want.items() if v)
                         for name, t in fitting.items()}
    capacity = sum(replicas_per_node[n] * fitting[n].get("max_workers", 0) for n in fitting)
    capacity += replicas_per_node.get(cluster["head_node_type"], 0)
    if fitting and capacity < enc.replicas:
        problems.append(f"{enc.replicas} encoder replicas but the node types can hold at most {capacity}")
    if cluster.get("max_workers", 0) < enc.replicas - replicas_per_node.get(cluster["head_node_type"], 0):
        problems.append(f"max_workers {cluster.get('max_workers')} is below the {enc.replicas} replicas' need")
    return problems


def open_doors(cluster: dict) -> list[str]:
    """Ways in for someone other than the cluster's owner: a node started without token authentication, a token
    written into the config, a dashboard listening beyond the head's loopback."""
    problems = []
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for command in cluster.get(key, []):
            if "ray start" in command and "RAY_AUTH_MODE=token" not in command:
                problems.append(f"{key}: {command!r} starts Ray without RAY_AUTH_MODE=token")
            host = re.search(r"--dashboard-host[= ](\S+)", command)
            if host and host.group(1) not in ("127.0.0.1", "localhost", "::1"):
                problems.append(f"{key}: the dashboard listens on {host.group(1)}, beyond the head's loopback")
    if "RAY_AUTH_TOKEN=" in yaml.safe_dump(cluster):
        problems.append("a token is written into the config: mount it from a file (file_mounts) instead")
    return problems


def load_cluster(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())
