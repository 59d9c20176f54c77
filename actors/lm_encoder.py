"""The LMEncoder actor: the frozen causal LM role (memcl_ops/roles/lm_encoder.py) in a Ray process of its own.
The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import lm_encoder as role

LMEncoder = ray.remote(role.LMEncoder)
