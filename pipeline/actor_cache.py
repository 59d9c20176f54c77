"""Actors by role, kept alive across runs of one process tree and revived after faults."""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable

import ray
from ray import exceptions as rex

from memcl.pipeline.executors import ActorCalls

# How long a revival waits for Ray's restart of a killed actor before it starts a new one instead.
RESTART_WAIT_SECONDS = 60.0
# A token of this process: an actor Ray restarted runs in a new process and answers with a new one.
_PROCESS_TOKEN = uuid.uuid4().hex


class ActorRestarted(RuntimeError):
    """An actor was restarted (its state lost) between two of the runner's calls, with no call failing."""

    def __init__(self, role: str):
        super().__init__(f"the {role} actor was restarted since the last committed state")
        self.role = role


# Failures of the machinery (a worker or actor died or restarted, an object was lost, a compiled graph's channel
# broke with its actor) that a replay from the last good state repairs; anything else (a bug, bad code) is
# re-raised at once.
FAULTS = (rex.RayActorError, rex.ActorUnavailableError, rex.ObjectLostError, rex.OwnerDiedError,
          rex.WorkerCrashedError, rex.RayChannelError, ActorRestarted)


def is_fault(err: BaseException) -> bool:
    cause = err.cause if isinstance(err, rex.RayTaskError) else err
    if isinstance(cause, rex.RayChannelTimeoutError):  # a hung step: replaying it would hang again
        return False
    if failed_to_start(cause):  # its constructor raised: it would again
        return False
    return isinstance(err, FAULTS) or isinstance(cause, FAULTS)


def failed_to_start(err: BaseException) -> bool:
    """Whether `err` is an actor's constructor raising (Ray keeps only its traceback's text)."""
    return isinstance(err, rex.ActorDiedError) and err.actor_init_failed


class ActorCache:
    """The actors of a process tree by role. A later run resets them instead of paying an actor start-up again
    (~4 s each here: a fresh process importing torch); after a fault, `revive` brings a role back."""

    local = False

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
        handle = self._start_anew(role, actor_class, options, args)
        self._wait_ready([role])
        return handle

    def executor(self, handle: Callable[[str], ray.actor.ActorHandle | None]) -> ActorCalls:
        """Calls to the roles' actors, `handle` giving each role's current actor."""
        return ActorCalls(handle)

    def _start_anew(self, role: str, actor_class: type, options: dict, args: tuple) -> ray.actor.ActorHandle:
        known = self.handles.get(role)
        if known is not None:
            ray.kill(known[3])
        handle = actor_class.options(**options).remote(*args)
        self.handles[role] = (actor_class, options, args, handle)
        return handle

    def _wait_ready(self, roles: list[str]) -> None:
        # A learner actor reserves nothing, so it is scheduled at once: wait for its process start here (a run's
        # setup, a revival) rather than inside whichever timed phase first calls it. (Actors that reserve resources
        # may wait for a node and are not waited for.) A start that fails is reported by that first call.
        light = [self.handle(r) for r in roles if self.handles[r][1].get("num_cpus") == 0]
        with contextlib.suppress(FAULTS):
            ray.get([handle.__ray_ready__.remote() for handle in light])

    def revive(self, roles: list[str]) -> None:
        """Each role's actor alive and reset to its construction arguments, side by side: a restart Ray has under
        way is waited for (it started at the fault), an actor past its restarts or dead for good starts anew."""
        calls = {role: self.handle(role).reset.remote(*self.handles[role][2]) for role in roles}
        deadline = time.monotonic() + RESTART_WAIT_SECONDS
        started = []
        for role, call in calls.items():
            while True:
                try:
                    ray.get(call)
                    break
                except FAULTS as err:
                    if isinstance(err, rex.ActorUnavailableError) and time.monotonic() < deadline:
                        time.sleep(0.1)  # restarting: ask again once Ray has it back
                        call = self.handle(role).reset.remote(*self.handles[role][2])
                        continue
                    self._start_anew(role, *self.handles[role][:3])  # dead for good, or not back in time
                    started.append(role)
                    break
        self._wait_ready(started)

    def incarnations(self, roles: list[str]) -> dict[str, str]:
        """A token per role's actor process; it changes when Ray restarts the actor (losing its state)."""
        return dict(zip(roles, ray.get([self.handle(r).__ray_call__.remote(_process_token) for r in roles])))

    def handle(self, role: str) -> ray.actor.ActorHandle:
        return self.handles[role][3]

    def call(self, role: str, method: str, *args: object) -> object:
        """One call of a role's actor, waited for."""
        return ray.get(getattr(self.handle(role), method).remote(*args))

    def role_of(self, err: BaseException) -> str | None:
        """The role whose actor an actor fault names (None where it names none of this cache's)."""
        if isinstance(err, ActorRestarted):
            return err.role
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

    def placement(self, roles: list[str]) -> dict[str, dict]:
        """Per role: the node its actor runs on, the Ray resources and GPU ids assigned to it, and the device the role
        computes on."""
        return dict(zip(roles, ray.get([self.handle(r).__ray_call__.remote(_placement) for r in roles])))

    def keep_only(self, kind: str, roles: list[str]) -> None:
        """Free the cached actors of `kind` (a role name and its copies, "encoder" for encoder0, encoder1, ...) that
        `roles` does not name: a run with fewer replicas or workers than the one before leaves none holding what it
        reserved."""
        stale = [r for r in self.handles if re.fullmatch(rf"{re.escape(kind)}\d*", r) and r not in roles]
        for role in stale:
            ray.kill(self.handles.pop(role)[3])

    def close(self) -> None:
        for *_, handle in self.handles.values():
            ray.kill(handle)
        self.handles.clear()


def _process_token(actor) -> str:  # run in an actor by `__ray_call__`
    return _PROCESS_TOKEN


def _pid(actor) -> int:  # run in an actor by `__ray_call__`, which passes the actor instance first
    return os.getpid()


def _placement(actor) -> dict:  # run in an actor by `__ray_call__`
    """The device is the one the role resolved and computes on (a role with none, the stream source: the CPU)."""
    context = ray.get_runtime_context()
    return {"node": context.get_node_id(), "resources": context.get_assigned_resources(),
            "gpus": list(context.get_accelerator_ids().get("GPU", [])),
            "device": str(getattr(actor, "device", "cpu"))}
