"""The NoveltyMonitor actor: the novelty monitor role
(memcl_ops/roles/novelty_monitor.py) in a Ray process of its own.
A run held in this process runs the same role's code."""

from __future__ import annotations

from memcl.actors import hosting
from memcl_ops.roles import novelty_monitor as role

NoveltyMonitor = hosting(role.NoveltyMonitor)
