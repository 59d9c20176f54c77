"""The Stage2Trainer actor: the stage-2 (head) trainer role
(memcl_ops/roles/stage2_trainer.py) in a Ray process of its own.
A run held in this process runs the same role's code."""

from __future__ import annotations

from memcl.actors import hosting
from memcl_ops.roles import stage2_trainer as role

Stage2Trainer = hosting(role.Stage2Trainer)
