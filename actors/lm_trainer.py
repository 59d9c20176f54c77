"""The LMTrainer actor: the sequential LoRA (LM) role (memcl_ops/roles/lm_trainer.py) in a Ray process of its own;
several form a data-parallel group. A run held in this process runs the same role's code."""

from __future__ import annotations

import ray

from memcl.actors import hosting
from memcl.actors.group_worker import GroupWorker
from memcl_ops.roles import lm_trainer as role


class _Worker(role.LMTrainer, GroupWorker):
    pass


LMTrainer = hosting(role.LMTrainer, ray.remote(_Worker))
