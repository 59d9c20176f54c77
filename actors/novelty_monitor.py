"""The NoveltyMonitor actor: the novelty monitor role
(memcl_ops/roles/novelty_monitor.py) in a Ray process of its own. The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import novelty_monitor as role

NoveltyMonitor = ray.remote(role.NoveltyMonitor)
