"""The Stage1Trainer actor: the DCDA stage-1 trainer role
(memcl_ops/roles/stage1_trainer.py) in a Ray process of its own.
A run held in this process runs the same role's code."""

from __future__ import annotations

from memcl.actors import hosting
from memcl_ops.roles import stage1_trainer as role

Stage1Trainer = hosting(role.Stage1Trainer)
