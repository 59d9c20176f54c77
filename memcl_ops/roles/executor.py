"""How a method's flow reaches its roles. A flow (memcl_ops/roles/features.py) is written once against `Executor`:
`call(role, method, *args)` starts a role's method and returns its result or a handle on it, and `get` waits for
such handles. Handles may be passed on as arguments to the next call, so a flow never waits where it need not.

* `InProcess` (here): the roles are plain objects in this process; a call runs at once and its handle is the value.
* `memcl.pipeline.executors.ActorCalls`: each role is an actor; a call is `handle.method.remote(...)`, a handle an
  object reference, `get` is `ray.get`.
* `memcl.pipeline.executors.GraphBinding`: each role is an actor of a Ray Compiled Graph; a call is `.bind(...)`, which
  wires the flow once into the graph (pipeline/compiled_chain.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class Executor(Protocol):
    def has(self, role: str) -> bool: ...  # whether the run has this role (a method has only the roles it needs)

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def get(self, handle: Any) -> Any: ...  # a handle's value (a list of handles: their values)

    def ready(self, handle: Any) -> bool: ...  # whether `get` would return at once


class InProcess:
    """The roles as plain objects of this process, called directly: `roles` by name, or a lookup of the current
    object of a role (None where the run has no such role)."""

    def __init__(self, roles: Mapping[str, object] | Callable[[str], object | None]):
        self.handle = roles if callable(roles) else dict(roles).get

    def has(self, role: str) -> bool:
        return self.handle(role) is not None

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.handle(role), method)(*args, **kwargs)

    def get(self, handle: Any) -> Any:
        return handle

    def ready(self, handle: Any) -> bool:
        return True


def store_call(executor: Executor, store: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """`method` of one of the memory manager's stores (memcl_ops/roles/memory_manager.py)."""
    return executor.call("memory", "call", store, method, *args, **kwargs)
