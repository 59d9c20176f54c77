"""Trainer actors report each epoch of a long consolidation call while it runs, so the driver can show it."""

import numpy as np
import pytest
import ray
from ray.util.queue import Queue

from memcl.actors.stage1_trainer import Stage1Trainer
from memcl.actors.stage2_trainer import Stage2Trainer
from memcl.pipeline.progress import Progress, Reports
from memcl_ops.arrow import schema as S
from memcl_ops.head_training import Stage2Config
from memcl_ops.mars.dcda import Stage1Config
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.method_config import MethodConfig
from memcl_ops.training import OptimConfig

pytestmark = pytest.mark.ray


def test_stage1_and_stage2_report_every_epoch(ray_session):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 64)
    block = [ray.put(S.feature_batch(np.arange(64), rng.normal(size=(64, 8)) + labels[:, None], labels,
                                     np.zeros(64, int)))]
    queue = Queue(actor_options={"num_cpus": 0})
    router = RouterConfig(initial_slots=2)
    stage1 = Stage1Trainer.options(num_cpus=0).remote(8, router, Stage1Config(optim=OptimConfig(epochs=3)), 0, 1)
    ray.get(stage1.train.remote(SlotRouter(8, router).state(), *block, progress=queue))
    method = MethodConfig(name="finetune", stage2=Stage2Config(optim=OptimConfig(epochs=4)))
    stage2 = Stage2Trainer.options(num_cpus=0).remote(method, 8, 0, 1)
    ray.get(stage2.consolidate.remote(None, *block, progress=queue))
    reported = queue.get_nowait_batch(queue.qsize())
    assert [r[:3] for r in reported] == [("stage 1", e, 3) for e in (1, 2, 3)] + [
        ("stage 2", e, 4) for e in (1, 2, 3, 4)]
    assert all(np.isfinite(r[3]) and r[3] > 0 for r in reported)  # each epoch's mean loss
    ray.get(stage1.train.remote(SlotRouter(8, router).state(), *block))  # nobody listening: nothing is put
    assert queue.qsize() == 0
    ray.kill(stage1)
    ray.kill(stage2)


def test_reports_return_the_call_result_and_drain_the_queue(ray_session):
    reports = Reports(Progress(enabled=True))
    reports.queue.put_nowait(("stage 1", 1, 2, 0.5))
    assert reports.get(ray.put(41), "task 1/1") == 41
    assert reports.queue.qsize() == 0
    assert reports.take_losses() == {"stage 1": [0.5]} and reports.take_losses() == {}
    assert Reports(Progress(enabled=False)).queue is None
