"""A pool of Encoder replicas (the expensive stage), spread over GPUs and nodes.

Each call goes to the replica with the fewest calls in flight, at most `max_in_flight` per replica (the
driver waits for one to finish when all are full). The driver hands out batches in stream order and every
downstream call is chained on the returned references in that order, so the learner receives feature
batches in `sample_id` order whichever replica finishes first.
"""

from __future__ import annotations

import ray

from memcl.actors.encoder import Encoder
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import RunConfig


class EncoderPool:
    def __init__(self, config: RunConfig, payload: str, actors: ActorCache):
        enc = config.encoder
        gpus = enc.num_gpus
        if gpus == "auto":
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        options = {"num_cpus": enc.num_cpus, "num_gpus": gpus, "resources": dict(enc.resources),
                   "max_restarts": config.runtime.max_restarts,
                   "scheduling_strategy": "SPREAD" if enc.placement == "spread" else "DEFAULT"}
        self.roles = [f"encoder{i}" for i in range(enc.replicas)]
        actors.keep_only("encoder", self.roles)
        self.actors, self.max_in_flight = actors, enc.max_in_flight
        for role in self.roles:
            actors.get(role, Encoder, options, enc.spec, payload, enc.threads)
        self.info = ray.get([r.info.remote() for r in self.replicas])
        self.in_flight: dict[str, list[ray.ObjectRef]] = {role: [] for role in self.roles}
        self.calls = dict.fromkeys(self.roles, 0)

    @property
    def replicas(self) -> list[ray.actor.ActorHandle]:
        return [self.actors.handle(role) for role in self.roles]

    @property
    def id(self) -> str:
        return self.info[0]["id"]

    @property
    def fingerprint(self) -> str:
        """The digest of the encoder's weights and preprocessing (memcl_ops/models/encoders.py)."""
        return self.info[0]["fingerprint"]

    @property
    def dim(self) -> int:
        return self.info[0]["dim"]

    def _prune(self) -> None:
        for role, refs in self.in_flight.items():
            if refs:
                _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
                self.in_flight[role] = pending

    def _pick(self) -> str:
        self._prune()
        free = [r for r in self.roles if len(self.in_flight[r]) < self.max_in_flight]
        while not free:  # every replica is full: wait for any call to finish
            ray.wait([ref for refs in self.in_flight.values() for ref in refs], num_returns=1)
            self._prune()
            free = [r for r in self.roles if len(self.in_flight[r]) < self.max_in_flight]
        return min(free, key=lambda r: (len(self.in_flight[r]), self.calls[r]))

    def encode(self, batch_ref: ray.ObjectRef) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        """(feature batch, dead letters) refs for one raw batch ref, from the least busy replica."""
        role = self._pick()
        features, letters = self.actors.handle(role).encode.remote(batch_ref)
        self.in_flight[role].append(features)
        self.calls[role] += 1
        return features, letters

    def use_cache(self, root: str) -> None:
        ray.get([replica.use_cache.remote(root) for replica in self.replicas])

    def flush_cache(self) -> int:
        """Rows the replicas encoded since the last flush, written to the content cache."""
        return sum(ray.get([replica.flush_cache.remote() for replica in self.replicas]))

    def take_intervals(self) -> list[tuple[float, float]]:
        """Every replica's encode calls since the last take, as wall-clock (start, end)."""
        return [i for replica in ray.get([r.take_intervals.remote() for r in self.replicas]) for i in replica]

    def revive(self) -> None:
        self.actors.revive(self.roles)
        self.in_flight = {role: [] for role in self.roles}
