"""The LMEncoder actor: the frozen causal LM role (memcl_ops/roles/lm_encoder.py) in a Ray process of its own.
A run held in this process runs the same role's code."""

from __future__ import annotations

from memcl.actors import hosting
from memcl_ops.roles import lm_encoder as role

LMEncoder = hosting(role.LMEncoder)
