"""The roles of a run held in this process: what `ActorCache` (pipeline/actor_cache.py) is to actors, for a run
without Ray (`memcl.run_in_process`). The pipelines and the round loop are the same; only where the roles live
differs: a call runs at once (memcl_ops/roles/executor.py `InProcess`), nothing can fail as an actor does, and
nothing needs reviving."""

from __future__ import annotations

from collections.abc import Callable

from memcl.actors import role_class
from memcl_ops.roles.executor import InProcess


class LocalActors:
    """Roles by name, each the plain object its actor class hosts (memcl.actors.hosting)."""

    local = True

    def __init__(self) -> None:
        self.objects: dict[str, object] = {}
        self.args: dict[str, tuple] = {}

    def get(self, role: str, actor_class: object, options: dict, *args: object) -> object:
        del options  # resources and placement are Ray's: this process runs every role
        self.objects[role] = role_class(actor_class)(*args)
        self.args[role] = args
        return self.objects[role]

    def executor(self, handle: Callable[[str], object | None]) -> InProcess:
        return InProcess(handle)

    def handle(self, role: str) -> object:
        return self.objects[role]

    def call(self, role: str, method: str, *args: object) -> object:
        return getattr(self.objects[role], method)(*args)

    def revive(self, roles: list[str]) -> None:
        """Each role reset to its construction arguments (a step that failed with an error of its own is not
        replayed in this process; this serves a restore from a checkpoint)."""
        for role in roles:
            self.objects[role].reset(*self.args[role])

    def incarnations(self, roles: list[str]) -> dict[str, str]:
        return dict.fromkeys(roles, "this process")

    def role_of(self, err: BaseException) -> str | None:
        return None

    def placement(self, roles: list[str]) -> dict[str, dict]:
        return {role: {"node": "this process", "resources": {}, "gpus": [],
                       "device": str(getattr(self.objects[role], "device", "cpu"))} for role in roles}

    def keep_only(self, kind: str, roles: list[str]) -> None:
        for role in [r for r in self.objects if r.startswith(kind) and r not in roles]:
            del self.objects[role]

    def close(self) -> None:
        self.objects.clear()
