"""The Stage1Trainer actor: the DCDA stage-1 trainer role
(memcl_ops/roles/stage1_trainer.py) in a Ray process of its own. The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import stage1_trainer as role

Stage1Trainer = ray.remote(role.Stage1Trainer)
