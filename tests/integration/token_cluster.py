"""Run by test_authentication.py in a fresh process: a local Ray cluster (`ray.cluster_utils.Cluster`, a head of two
CPUs) with token authentication on, as `cluster.yaml` starts one (the environment this process is given:
RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH). Prints the cluster's address, then holds it until its standard input
closes."""

import sys

from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
