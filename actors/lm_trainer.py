"""The LMTrainer actor: the sequential LoRA (LM) role (memcl_ops/roles/lm_trainer.py) in a Ray process of its own.
The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import lm_trainer as role

LMTrainer = ray.remote(role.LMTrainer)
