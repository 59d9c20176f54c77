"""The MemoryManager actor: the memory manager role
(memcl_ops/roles/memory_manager.py) in a Ray process of its own.
A run held in this process runs the same role's code."""

from __future__ import annotations

from memcl.actors import hosting
from memcl_ops.roles import memory_manager as role

MemoryManager = hosting(role.MemoryManager)
