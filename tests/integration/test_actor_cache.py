"""The actor cache frees the replicas or workers a later run no longer has (what they reserved goes back to Ray)."""

import time

import pytest
import ray

from memcl.actors.novelty_monitor import NoveltyMonitor
from memcl.pipeline.actor_cache import ActorCache
from memcl_ops.mars.sgse import SGSEConfig

pytestmark = pytest.mark.ray


def test_a_run_with_fewer_replicas_frees_the_others(ray_session):
    cache = ActorCache()
    options = {"num_cpus": 0.25}
    try:
        for role in ("encoder0", "encoder1", "encoder2", "encoder_log"):  # any actor class serves
            cache.get(role, NoveltyMonitor, options, SGSEConfig())
        ray.get([cache.handle(r).__ray_ready__.remote() for r in cache.handles])
        gone = cache.handle("encoder2")
        held = ray.available_resources().get("CPU", 0)
        cache.keep_only("encoder", ["encoder0", "encoder1"])
        assert sorted(cache.handles) == ["encoder0", "encoder1", "encoder_log"]  # only the kind's numbered copies
        deadline = time.monotonic() + 30  # the kill is asynchronous: a call made just after it may still run
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(gone.__ray_ready__.remote(), timeout=30)
                time.sleep(0.2)
        deadline = time.monotonic() + 30  # Ray hands a dead actor's resources back shortly after
        while ray.available_resources().get("CPU", 0) - held < 0.25 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU", 0) - held == pytest.approx(0.25)
    finally:
        cache.close()
