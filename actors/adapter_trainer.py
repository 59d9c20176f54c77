"""The AdapterTrainer actor: the adapter trainer role (memcl_ops/roles/adapter_trainer.py) in a Ray process of its
own, given a GPU when the cluster has one; several form a data-parallel group. The in-process learner runs the same
role's code."""

from __future__ import annotations

import ray

from memcl.actors.group_worker import GroupWorker
from memcl_ops.roles import adapter_trainer as role


@ray.remote
class AdapterTrainer(role.AdapterTrainer, GroupWorker):
    pass
