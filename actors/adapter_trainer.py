"""The AdapterTrainer actor: the adapter trainer role (memcl_ops/roles/adapter_trainer.py) in a Ray process of its
own, given a GPU when the cluster has one. The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import adapter_trainer as role


@ray.remote
class AdapterTrainer(role.AdapterTrainer):
    def rendezvous(self) -> str:
        """Where this trainer, as worker 0 of a data-parallel group, is reached by the others: its node's address."""
        return role.rendezvous_address(ray.util.get_node_ip_address())
