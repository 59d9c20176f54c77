"""The AdapterTrainer actor: the adapter trainer role (memcl_ops/roles/adapter_trainer.py) in a Ray process of its
own, given a GPU when the cluster has one; several form a data-parallel group. A run held in this process runs the
same role's code."""

from __future__ import annotations

import ray

from memcl.actors import hosting
from memcl.actors.group_worker import GroupWorker
from memcl_ops.roles import adapter_trainer as role


class _Worker(role.AdapterTrainer, GroupWorker):
    pass


AdapterTrainer = hosting(role.AdapterTrainer, ray.remote(_Worker))
