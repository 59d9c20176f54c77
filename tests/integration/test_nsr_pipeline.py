"""NSR through the real actor pipeline (StreamSource, AdapterTrainer, MemoryManager as Ray actors; raw Arrow text
batches of BBC News; checkpoints on disk) on a cyclic stream A B C A B C.

The backbone here is a small randomly initialised BertModel saved as a local transformers folder with MiniLM's real
tokenizer (`hf:<folder>`), so the plumbing test stays fast; the recovery claim on the pretrained MiniLM is the slow
test at the end and benchmarks/nsr_recovery.py."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from memcl.pipeline import checkpoint, runner
from memcl.pipeline.config import ConfigError, dump_config, load_config
from memcl_ops.arrow import schema as S
from tests.killing import AIMS, kill_driver_at_checkpoint, killer, phase_killer

pytestmark = pytest.mark.ray

VISITS = [0, 1, 2, 0, 1, 2]
TRAIN_PER_CLASS, TEST_PER_CLASS = 8, 5


def config(tmp_path, encoder: str, **extra):
    return load_config(overrides={
        "data.dataset": "bbc-news", "stream.tasks": 3, "stream.task_classes": [[0, 1], [2, 3], [4, 0]],
        "stream.visits": VISITS, "stream.train_per_class": TRAIN_PER_CLASS, "stream.test_per_class": TEST_PER_CLASS,
        "stream.batch_size": 8, "encoder.spec.name": encoder, "encoder.spec.max_length": 16, "encoder.threads": 1,
        "method.name": "nsr", "method.nsr.batch_size": 8, "method.nsr.lr": 5e-3,
        # the probe covers a whole visit, so a returning task's key is exactly its stored key
        "method.nsr.probe_size": 2 * TRAIN_PER_CLASS, "runtime.out": str(tmp_path), "runtime.progress": False,
        "runtime.actor_threads": 1, **extra})


@pytest.fixture(scope="module")
def bank_run(actors, tmp_path_factory, tiny_bert):
    """The uninterrupted run every fault below must reproduce."""
    return runner.run(config(tmp_path_factory.mktemp("bank"), f"hf:{tiny_bert}"), actors=actors).metrics


def assert_same_run(metrics: dict, reference: dict) -> None:
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], float), np.array(reference["acc_matrix"], float))
    assert metrics["bank"] == reference["bank"] and metrics["memory_bytes"] == reference["memory_bytes"]
    assert [e["arrival"] for e in metrics["round_log"]] == [e["arrival"] for e in reference["round_log"]]
    samples = metrics["samples"]  # exactly once: every training sample, no replayed batch counted twice
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == reference["samples"]["stream"]
    # every training row predicted once, before it was learned, by the same models (near-future ones included)
    assert metrics["prequential"] == reference["prequential"]


def test_bank_restores_returning_tasks_exactly_and_reports_its_bytes(actors, tmp_path, bank_run):
    metrics = bank_run
    log = metrics["round_log"]
    assert [e["arrival"] for e in log][3:] == ["restore"] * 3
    assert log[0]["arrival"] == "fresh"
    for first, again in zip(log[:3], log[3:]):
        # the restored adapter and head score exactly what the stored (compressed) ones scored
        assert again["recovery"]["curve"][0] == [0, first["acc_stored"]]
        assert again["retrieval"]["tasks"] == [first["task"]]
    bank = metrics["bank"]["entries"]
    assert [e["task"] for e in bank] == [0, 1, 2]
    assert metrics["memory_bytes"]["bank"] == sum(e["bytes"] for e in bank) > 0
    assert all(1 <= r <= 4 for e in bank for r in e["ranks"].values())  # default cap k_max = 4
    samples = metrics["samples"]
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == len(VISITS) * 2 * TRAIN_PER_CLASS
    acc = np.array(metrics["acc_matrix"], dtype=float)
    assert acc.shape == (6, 3) and not np.isnan(acc[2:]).any()
    # test-then-train: every training row predicted once, each task's rows counted under it
    prequential = metrics["prequential"]
    assert prequential["rows"] == samples["stream"] and sorted(prequential["per_task"]) == ["0", "1", "2"]

    # resume: drop the last checkpoint and the results; the run continues from visit 5 to the same matrix
    copy = tmp_path / "resumed"
    shutil.copytree(metrics["run_dir"], copy)
    for name in ("ckpt-000005.npz", "ckpt-000005.sha256"):
        (copy / "checkpoints" / name).unlink()
    (copy / "metrics.json").unlink()
    resumed = runner.run(resume=copy, actors=actors).metrics
    np.testing.assert_array_equal(np.array(resumed["acc_matrix"], dtype=float), acc)
    assert json.loads((copy / "metrics.json").read_text())["bank"] == metrics["bank"]


KILL_POINTS = np.random.default_rng(13).integers(0, [len(VISITS), 2], size=(3, 2)).tolist()  # (visit, batch)


@pytest.mark.parametrize("role, point", [("adapter_trainer", 0), ("memory", 1), ("source", 2)])
def test_actor_killed_mid_visit_gives_the_uninterrupted_run(actors, tmp_path, tiny_bert, bank_run, role, point):
    hook, done = killer(actors, role, tuple(KILL_POINTS[point]), restart=point % 2 == 1)
    metrics = runner.run(config(tmp_path, f"hf:{tiny_bert}"), actors=actors, on_batch=hook).metrics
    assert done and metrics["recoveries"] >= 1
    assert_same_run(metrics, bank_run)


def test_kills_aimed_at_every_step_of_the_run_give_the_uninterrupted_run(actors, tmp_path, tiny_bert, bank_run):
    hook, done = phase_killer(actors, ["source", "adapter_trainer", "memory"], seed=3)
    metrics = runner.run(config(tmp_path, f"hf:{tiny_bert}"), actors=actors, on_phase=hook).metrics
    assert sorted(phase for phase, _ in done) == sorted(AIMS) and metrics["recoveries"] >= 3
    assert_same_run(metrics, bank_run)


def test_killed_driver_resumes_to_the_uninterrupted_run(actors, tmp_path, tiny_bert, bank_run):
    dump_config(config(tmp_path, f"hf:{tiny_bert}"), tmp_path / "nsr.yaml")
    run_dir = kill_driver_at_checkpoint(["run", "--config", str(tmp_path / "nsr.yaml")], tmp_path,
                                        "checkpoints/ckpt-000002.sha256")
    assert_same_run(runner.run(resume=run_dir, actors=actors).metrics, bank_run)


def test_memoryless_fresh_rule_keeps_no_bank(actors, tmp_path, tiny_bert):
    fresh = runner.run(config(tmp_path, f"hf:{tiny_bert}", **{"method.nsr.allocation": "fresh"}), actors=actors).metrics
    assert fresh["memory_bytes"] == {} and fresh["bank"] is None
    assert {e["arrival"] for e in fresh["round_log"]} == {"fresh"}
    # a fresh start is a zero head: every test row gets the task's first class, half of a balanced test set
    assert all(e["recovery"]["curve"][0][1] == 0.5 for e in fresh["round_log"][3:])


def test_nsr_refuses_own_data_with_a_task_of_one_class_before_any_actor_trains(actors, tmp_path, tiny_bert):
    """Own data's classes per task are known only once it is read: one line naming stream.tasks, from the driver."""
    root = tmp_path / "texts"
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        for task in (0, 1):
            labels = np.full(6, task)
            batch = S.raw_batch(np.arange(6) + 100 * task, "text", [f"text {task} {i}" for i in range(6)], labels,
                                labels)
            pq.write_table(pa.Table.from_batches([batch]), root / split / f"{task}.parquet")
    cfg = load_config(overrides={"data.dataset": f"arrow:{root}", "data.payload": "text", "method.name": "nsr",
                                 "encoder.spec.name": f"hf:{tiny_bert}", "runtime.out": str(tmp_path / "runs"),
                                 "runtime.progress": False})
    with pytest.raises(ConfigError, match=r"stream.tasks: nsr .* two classes or more; .* \[1, 1\] classes"):
        runner.run(cfg, actors=actors)


@pytest.mark.slow
def test_pretrained_minilm_returning_tasks_are_back_at_once_with_the_bank(actors, tmp_path):
    """The recovery claim on the real MiniLM: every returning task restored, back within 1 point at step 0."""
    cfg = config(tmp_path, "minilm", **{"stream.train_per_class": 48, "stream.test_per_class": 25,
                                         "method.nsr.probe_size": 96, "encoder.spec.max_length": 32})
    metrics = runner.run(cfg, actors=actors).metrics
    rec = metrics["recovery"]["returning_visits"]
    assert [r["steps"] for r in rec] == [0, 0, 0] and not any(r["censored"] for r in rec), rec
    assert min(e["acc_live"] for e in metrics["round_log"]) > 0.8


def _final_adapter(metrics: dict) -> dict[str, np.ndarray]:
    parts, _ = checkpoint.read(Path(metrics["run_dir"]) / "checkpoints" / f"ckpt-{len(VISITS) - 1:06d}.npz")
    assert "adapter_trainer1" not in parts  # a data-parallel worker's state is worker 0's
    return {k: v for k, v in parts["adapter_trainer"].items() if k.startswith(("learner.lora.", "learner.head."))}


@pytest.fixture(scope="module")
def two_workers(actors, tmp_path_factory, tiny_bert):
    """The same run with NSR's adapter trainer as two data-parallel workers (DDP over gloo)."""
    cfg = config(tmp_path_factory.mktemp("dp"), f"hf:{tiny_bert}", **{"runtime.data_parallel": 2})
    return runner.run(cfg, actors=actors).metrics


def test_two_data_parallel_workers_learn_what_one_learns(actors, bank_run, two_workers):
    one, two = _final_adapter(bank_run), _final_adapter(two_workers)
    assert one.keys() == two.keys() and len(one) > 2
    # The same steps' mean gradients (tests/unit/test_nsr.py checks the shares' average exactly); the workers sum
    # floats in another order, and Adam scales a near-zero gradient's noise up to a sizeable part of a step: the
    # weights agree to a twentieth of one step (lr).
    step = 5e-3
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=0, atol=step / 20, err_msg=key)
    # DDP keeps the workers identical: worker 1 (not checkpointed: its state is worker 0's) holds the same weights
    parts = ray.get([actors.handle(w).state.remote() for w in ("adapter_trainer", "adapter_trainer1")])
    for key in two:
        np.testing.assert_array_equal(parts[1][key], parts[0][key], err_msg=key)
        np.testing.assert_array_equal(parts[0][key], two[key], err_msg=key)
    np.testing.assert_array_equal(np.array(two_workers["acc_matrix"], float), np.array(bank_run["acc_matrix"], float))
    assert [e["arrival"] for e in two_workers["round_log"]] == [e["arrival"] for e in bank_run["round_log"]]
    samples = two_workers["samples"]  # each row learned once by the group (by one worker's share)
    assert samples["learned"] == samples["unique_learned"] == samples["stream"]


def test_a_data_parallel_worker_killed_mid_visit_replays_to_the_uninterrupted_run(actors, tmp_path, tiny_bert,
                                                                                   two_workers):
    hook, done = killer(actors, "adapter_trainer1", (4, 1), restart=True)
    cfg = config(tmp_path, f"hf:{tiny_bert}", **{"runtime.data_parallel": 2})
    metrics = runner.run(cfg, actors=actors, on_batch=hook).metrics
    assert done and metrics["recoveries"] >= 1
    assert_same_run(metrics, two_workers)
    for key, value in _final_adapter(two_workers).items():
        np.testing.assert_array_equal(_final_adapter(metrics)[key], value, err_msg=key)
