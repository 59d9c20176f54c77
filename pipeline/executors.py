"""The Ray executors of a method's flow (memcl_ops/roles/executor.py): the same flow, its roles hosted in actors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

Handle = ray.actor.ActorHandle


class ActorCalls:
    """Classic actor calls: `call` submits `handle.method.remote(...)` and returns its object ref; Ray runs one
    caller's calls to one actor in submission order, and resolves refs passed as arguments, so a flow's calls
    chain without the driver waiting. `handle(role)` gives the role's current actor (it changes when a role is
    revived after a fault), None where the run has no such role."""

    def __init__(self, handle: Callable[[str], Handle | None]):
        self.handle = handle

    def has(self, role: str) -> bool:
        return self.handle(role) is not None

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return getattr(self.handle(role), method).remote(*args, **kwargs)

    def get(self, handle: Any) -> Any:
        """An object ref's value (a list: each element's), or the value itself where a flow computed it here."""
        if isinstance(handle, list):
            refs = [h for h in handle if isinstance(h, ray.ObjectRef)]
            values = iter(ray.get(refs))
            return [next(values) if isinstance(h, ray.ObjectRef) else h for h in handle]
        return ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle

    def ready(self, handle: Any) -> bool:
        return not isinstance(handle, ray.ObjectRef) or bool(ray.wait([handle], timeout=0)[0])


class WorkerGroup:
    """The data-parallel workers of one role, addressed as one actor handle: a call in `everyone` goes to every
    worker (worker 0's result is the call's; the others' are kept for `drain`), any other call to worker 0 alone.
    `handles()` gives the workers' current actors (they change when a worker is revived)."""

    def __init__(self, handles: Callable[[], list[Handle]], everyone: frozenset[str]):
        self.handles, self.everyone = handles, everyone
        self.pending: list[ray.ObjectRef] = []

    def __getattr__(self, method: str) -> Any:
        handles = self.handles()
        if method not in self.everyone:
            return getattr(handles[0], method)
        return _FanOut(handles, method, self.pending)

    def drain(self) -> None:
        """Wait for the other workers' calls (an error of theirs is raised here)."""
        pending, self.pending = self.pending, []
        if pending:
            ray.get(pending)


class ReplicaPool:
    """Stateless replicas of one role addressed as one actor handle: each call goes to the next replica in turn.
    `handles()` gives the replicas' current actors (they change when a replica is revived)."""

    def __init__(self, handles: Callable[[], list[Handle]]):
        self.handles, self.turn = handles, 0

    def __getattr__(self, method: str) -> Any:
        handles = self.handles()
        self.turn += 1
        return getattr(handles[(self.turn - 1) % len(handles)], method)


class _FanOut:
    def __init__(self, handles: list[Handle], method: str, pending: list[ray.ObjectRef]):
        self.handles, self.method, self.pending = handles, method, pending

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        first, *rest = (getattr(h, self.method).remote(*args, **kwargs) for h in self.handles)
        self.pending += rest
        return first


class GraphBinding:
    """Wiring into a Ray Compiled Graph: `call` binds the method (a DAG node); the graph is compiled once over the
    nodes a flow's calls produced and then executed many times. `get` has no meaning while wiring."""

    def __init__(self, handles: dict[str, Handle]):
        self.handles = handles

    def has(self, role: str) -> bool:
        return self.handles.get(role) is not None

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.handles[role], method).bind(*args, **kwargs)

    def get(self, handle: Any) -> Any:
        raise RuntimeError("a compiled graph is being wired: nothing can be waited for")

    def ready(self, handle: Any) -> bool:
        raise RuntimeError("a compiled graph is being wired: nothing can be waited for")
