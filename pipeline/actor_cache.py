"""Actors by role, kept alive across runs of one process tree and revived after faults."""

from __future__ import annotations

import contextlib
import os

import ray
from ray import exceptions as rex

# Failures of the machinery (a worker or actor died, an object was lost, a compiled graph's channel broke with
# its actor) that a replay from the last good state repairs; anything else (a bug, bad code) is re-raised at once.
FAULTS = (rex.RayActorError, rex.ActorUnavailableError, rex.ObjectLostError, rex.OwnerDiedError,
          rex.WorkerCrashedError, rex.RayChannelError)


def is_fault(err: BaseException) -> bool:
    cause = err.cause if isinstance(err, rex.RayTaskError) else err
    if isinstance(cause, rex.RayChannelTimeoutError):  # a hung step: replaying it would hang again
        return False
    return isinstance(err, FAULTS) or isinstance(cause, FAULTS)


class ActorCache:
    """The actors of a process tree by role. A later run resets them instead of paying an actor start-up again
    (~4 s each here: a fresh process importing torch); after a fault, `revive` brings a role back."""

    def __init__(self) -> None:
        self.handles: dict[str, tuple[type, dict, tuple, ray.actor.ActorHandle]] = {}

    def get(self, role: str, actor_class: type, options: dict, *args: object) -> ray.actor.ActorHandle:
        known = self.handles.get(role)
        if known is not None and known[1] == options:
            try:
                ray.get(known[3].reset.remote(*args))
                self.handles[role] = (actor_class, options, args, known[3])
                return known[3]
            except FAULTS:
                pass  # dead since its last use: start a new one
        if known is not None:
            ray.kill(known[3])
        handle = actor_class.options(**options).remote(*args)
        self.handles[role] = (actor_class, options, args, handle)
        if options.get("num_cpus") == 0:
            # A learner actor reserves nothing, so it is scheduled at once: wait for its process start here (a run's
            # setup) rather than inside whichever timed phase first calls it. (Actors that reserve resources may wait
            # for a node and are not waited for.) A start that fails is reported by that first call, as before.
            with contextlib.suppress(FAULTS):
                ray.get(handle.__ray_ready__.remote())
        return handle

    def revive(self, role: str) -> ray.actor.ActorHandle:
        """The role's actor, alive and reset to its construction arguments (restarted by Ray or started anew)."""
        actor_class, options, args, _ = self.handles[role]
        return self.get(role, actor_class, options, *args)

    def handle(self, role: str) -> ray.actor.ActorHandle:
        return self.handles[role][3]

    def role_of(self, err: BaseException) -> str | None:
        """The role whose actor an actor fault names (None where it names none of this cache's)."""
        cause = err.cause if isinstance(err, rex.RayTaskError) and err.cause is not None else err
        actor_id = getattr(cause, "actor_id", None)
        if isinstance(actor_id, bytes):
            actor_id = actor_id.hex()
        return next((role for role, (*_, handle) in self.handles.items() if handle._actor_id.hex() == actor_id),
                    None)

    def pids(self, roles: list[str]) -> dict[str, int]:
        """The process id of each role's actor; on a local cluster the driver can read those processes (memory, CPU
        time)."""
        return dict(zip(roles, ray.get([self.handle(r).__ray_call__.remote(_pid) for r in roles])))

    def close(self) -> None:
        for *_, handle in self.handles.values():
            ray.kill(handle)
        self.handles.clear()


def _pid(actor) -> int:  # run in an actor by `__ray_call__`, which passes the actor instance first
    return os.getpid()
