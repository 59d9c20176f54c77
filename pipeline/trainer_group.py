"""A trainer role as N data-parallel workers learning as one (memcl_ops/data_parallel.py), for every family that has
such a trainer (NSR's adapter trainer, the LM's LoRA trainer): worker 0 is the role's actor (`role`), the others
`role`1, `role`2, …; their states are worker 0's, so only worker 0 is checkpointed and the others restore from it."""

from __future__ import annotations

import ray

from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.executors import WorkerGroup


class TrainerGroup:
    """The workers of `role`, started (or reset) with `options` and `args` and joined in one process group; a call
    named in `replicated` (what changes what they learn) goes to every worker, any other to worker 0."""

    def __init__(self, actors: ActorCache, role: str, world: int, actor_class: type, options: dict, *args: object,
                 replicated: frozenset[str]):
        self.actors, self.role = actors, role
        self.workers = [role, *(f"{role}{r}" for r in range(1, world))]
        actors.keep_only(role, self.workers)
        for worker in self.workers:
            actors.get(worker, actor_class, options, *args)
        self.whole_gpus = options.get("num_gpus", 0) >= 1  # each worker a GPU of its own: NCCL can all-reduce
        self.calls = WorkerGroup(self.handles, replicated)
        self.join()

    @property
    def copies(self) -> dict[str, str]:
        """The workers whose state is worker 0's (`Roles`' copies)."""
        return {w: self.role for w in self.workers[1:]}

    def handles(self) -> list[ray.actor.ActorHandle]:
        return [self.actors.handle(w) for w in self.workers]

    def handle(self) -> ray.actor.ActorHandle | WorkerGroup:
        """What the flow calls the role through: the group, or the one worker."""
        return self.calls if len(self.workers) > 1 else self.actors.handle(self.role)

    def join(self) -> None:
        """The workers form one group (after their start or reset and after every revival)."""
        if len(self.workers) == 1:
            return
        handles = self.handles()
        address = ray.get(handles[0].rendezvous.remote())
        ray.get([h.join.remote(address, rank, len(handles), self.whole_gpus) for rank, h in enumerate(handles)])

    def drain(self) -> None:
        """Wait for the other workers' replicated calls (an error of theirs is raised here)."""
        self.calls.drain()

    def break_up(self) -> None:
        """Before the roles are revived after a fault: forget the workers' calls, and restart every worker, since a
        survivor may still wait inside a collective of the broken group."""
        self.calls.pending.clear()
        if len(self.workers) > 1:
            for handle in self.handles():
                ray.kill(handle, no_restart=False)
