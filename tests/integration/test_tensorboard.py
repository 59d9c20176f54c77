"""`runtime.tensorboard: true` writes TensorBoard event files into the run folder; TensorBoard's own reader reads
back the scalars the run's metrics hold."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memcl.pipeline import runner
from memcl.pipeline.config import load_config

pytestmark = pytest.mark.ray


def test_event_files_hold_the_runs_scalars(actors, tmp_path):
    epochs1, epochs2, tasks = 2, 3, 2
    config = load_config(overrides={
        "data.dataset": "synthetic", "data.synthetic.train_per_class": 40, "data.synthetic.test_per_class": 20,
        "stream.tasks": tasks, "runtime.tensorboard": True, "runtime.progress": False,
        "method.stage1.optim.epochs": epochs1, "method.stage2.optim.epochs": epochs2,
        "runtime.out": str(tmp_path), "runtime.actor_threads": 1})
    metrics = runner.run(config, actors=actors).metrics
    events = EventAccumulator(str(tmp_path / next(tmp_path.iterdir()).name / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"accuracy/task0", "accuracy/mean_evaluated", "loss/stage1", "loss/stage2", "slots",
            "memory_bytes/slots", "throughput/batches_per_second", "summary/a_last", "summary/a_mean"} <= tags

    def steps(tag):
        return [e.step for e in events.Scalars(tag)]

    def values(tag):
        return [e.value for e in events.Scalars(tag)]

    assert steps("accuracy/mean_evaluated") == [r["round"] + 1 for r in metrics["round_log"]]
    assert values("accuracy/mean_evaluated") == pytest.approx([r["mean_evaluated"] for r in metrics["round_log"]])
    assert values("accuracy/task0") == pytest.approx([row[0] for row in metrics["acc_matrix"]])
    assert steps("summary/a_last") == [tasks]
    assert values("summary/a_last") == pytest.approx([metrics["summary"]["a_last"]])
    assert steps("loss/stage1") == list(range(1, tasks * epochs1 + 1))  # every epoch, in order
    assert len(values("loss/stage2")) == tasks * epochs2 and all(v > 0 for v in values("loss/stage2"))
    assert values("slots") == [r["memory"]["num_slots"] for r in metrics["round_log"]]
    curve = metrics["prequential"]["curve"]
    assert values("prequential/accuracy") == pytest.approx([p["accuracy"] for p in curve])
    assert values("prequential/near_future") == pytest.approx([metrics["prequential"]["near_future_accuracy"]])
