"""Run by test_multinode.py in a fresh process (a multi-node Ray cluster cannot share the test session's Ray).

Starts a `ray.cluster_utils.Cluster` with a head and two worker nodes that each offer one `memcl_encoder`
(and a resource naming the node), runs the tiny digits stream with two encoder replicas spread over them,
then the same stream on a single-node Ray with one replica, and prints both results as JSON."""

import json
import sys

import ray
from ray.cluster_utils import Cluster

from memcl.pipeline import runner
from memcl.pipeline.config import load_config

OUT = sys.argv[1]
COMMON = {"data.dataset": "digits", "stream.tasks": 5, "stream.batch_size": 30, "stream.train_per_class": 30,
          "stream.test_per_class": 20, "encoder.spec.name": "tiny", "encoder.spec.dim": 32, "encoder.threads": 1,
          "encoder.num_cpus": 1, "method.router.initial_slots": 4, "method.stage1.optim.epochs": 2,
          "method.stage2.optim.epochs": 4, "runtime.cache_dir": "", "runtime.out": OUT, "runtime.progress": False,
          "runtime.actor_threads": 1, "runtime.checkpoint": False}

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head_node": 1}})
workers = {name: cluster.add_node(num_cpus=1, resources={"memcl_encoder": 1, name: 1}) for name in ("node_a", "node_b")}
ray.init(address=cluster.address, logging_level="ERROR")
multi = runner.run(load_config(overrides={**COMMON, "encoder.replicas": 2, "encoder.resources": {"memcl_encoder": 1},
                                          "encoder.placement": "spread"})).metrics
worker_nodes = {w.node_id for w in workers.values()}
ray.shutdown()
cluster.shutdown()

ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
single = runner.run(load_config(overrides={**COMMON, "encoder.replicas": 1})).metrics
ray.shutdown()
print(json.dumps({"multi": {k: multi[k] for k in ("acc_matrix", "encoders", "samples")},
                  "single": {k: single[k] for k in ("acc_matrix", "encoders", "samples")},
                  "worker_nodes": sorted(worker_nodes)}))
