"""The MemoryManager actor: the memory manager role
(memcl_ops/roles/memory_manager.py) in a Ray process of its own. The in-process learner runs the same role's code."""

from __future__ import annotations

import ray

from memcl_ops.roles import memory_manager as role

MemoryManager = ray.remote(role.MemoryManager)
