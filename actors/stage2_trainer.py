"""The Stage2Trainer actor: the stage-2 (head) trainer role
(memcl_ops/roles/stage2_trainer.py) in a Ray process of its own. The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import stage2_trainer as role

Stage2Trainer = ray.remote(role.Stage2Trainer)
