"""The LMTrainer actor: the sequential LoRA (LM) role (memcl_ops/roles/lm_trainer.py) in a Ray process of its own;
several form a data-parallel group. The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl.actors.group_worker import GroupWorker
from memcl_ops.roles import lm_trainer as role


@ray.remote
class LMTrainer(role.LMTrainer, GroupWorker):
    pass
