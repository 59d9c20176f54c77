"""Run by test_multinode.py in a fresh process (a multi-node Ray cluster cannot share the test session's Ray).

A `ray.cluster_utils.Cluster`: a head for the driver, a node for the learner roles (each pinned there by
`runtime.placement`) and two nodes offering one `memcl_encoder` each. The tiny digits stream runs twice over the
same actors: once undisturbed, once with the node hosting the encoder replica removed while the third visit
streams. Prints both results and where the roles ran as JSON."""

import json
import sys

import ray
from ray.cluster_utils import Cluster

from memcl.pipeline import runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import load_config

OUT = sys.argv[1]
LEARNERS = ("source", "memory", "monitor", "stage1", "stage2")
CONFIG = {"data.dataset": "digits", "stream.tasks": 5, "stream.batch_size": 30, "stream.train_per_class": 30,
          "stream.test_per_class": 20, "encoder.spec.name": "tiny", "encoder.spec.dim": 32, "encoder.threads": 1,
          "encoder.num_cpus": 1, "encoder.resources": {"memcl_encoder": 1}, "method.router.initial_slots": 4,
          "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 4, "runtime.cache_dir": "",
          "runtime.out": OUT, "runtime.progress": False, "runtime.actor_threads": 1,
          "runtime.placement": {role: {"resources": {"learners": 0.1}} for role in LEARNERS}}

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
learner_node = cluster.add_node(num_cpus=1, resources={"learners": 1})
encoder_nodes = [cluster.add_node(num_cpus=1, resources={"memcl_encoder": 1}) for _ in range(2)]
ray.init(address=cluster.address, logging_level="ERROR")
actors = ActorCache()
config = load_config(overrides=CONFIG)
undisturbed = runner.run(config, actors=actors).metrics
removed = []


def remove_encoder_node(visit: int, index: int) -> None:
    if visit == 2 and index == 1 and not removed:
        node = ray.get(actors.handle("encoder0").info.remote())["node"]
        victim = next(n for n in encoder_nodes if n.node_id == node)
        cluster.remove_node(victim)
        removed.append(node)


disturbed = runner.run(config, actors=actors, on_batch=remove_encoder_node).metrics
actors.close()
ray.shutdown()
cluster.shutdown()
keys = ("acc_matrix", "samples", "recoveries", "placement", "slots")
print(json.dumps({"undisturbed": {k: undisturbed[k] for k in keys}, "disturbed": {k: disturbed[k] for k in keys},
                  "removed": removed, "learner_node": learner_node.node_id,
                  "encoder_nodes": [n.node_id for n in encoder_nodes]}))
