"""The Predictor actor: the predictor role (memcl_ops/roles/predictor.py), the model a run serves while it learns,
in a Ray process of its own. A run held in this process runs the same role's code."""

from __future__ import annotations

from memcl.actors import hosting
from memcl_ops.roles import predictor as role

Predictor = hosting(role.Predictor)
