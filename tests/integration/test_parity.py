"""One implementation, two executors: every registered method run with its roles held in this process
(`runner.run(in_process=True)`, what `memcl.run_in_process` does: the same round loop and flows) and through the Ray
pipeline (actor calls, and the compiled graph) computes the same run, bit for bit at one torch thread: the
"features" family's accuracy matrix, test-then-train predictions (the sink's files included), memory bytes, sample
accounting and stream clock on an `arrow:` folder whose files end in short batches and hold rows the gate refuses,
on a task-free stream, and on a stream that does not wait for its trainers; NSR's matrix, adapter and bank on such a
text folder; the "lm" family's every answer."""

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from memcl.pipeline import checkpoint, runner
from memcl.pipeline.config import RuntimeConfig, load_config
from memcl.pipeline.lm import LMRunConfig, run_specs
from memcl_ops.arrow import schema as S
from memcl_ops.data.lm_tasks import LMStreamSpec
from memcl_ops.methods import family_methods
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.realtime import RealtimeConfig

pytestmark = pytest.mark.ray

DIM, ROWS_PER_FILE, BATCH = 8, 45, 20  # 45 = 20 + 20 + 5: every file ends in a short batch
REFUSED_PER_FILE = 2  # rows with a non-finite feature, refused at the gate
# what two executors of one run agree on, to the bit (wall seconds, busy seconds and placement are the machine's)
SAME = ("acc_matrix", "summary", "prequential", "memory_bytes", "samples", "realtime", "consolidation", "anytime",
        "class_confusion", "slots", "consolidations", "recoveries")


def write_stream(root):
    """Three tasks of two classes, two train files and one test file per task; each file holds two refused rows."""
    rng = np.random.default_rng(1)
    means = rng.normal(scale=2, size=(6, DIM))
    next_id = 0
    for split, files in (("train", 2), ("test", 1)):
        (root / split).mkdir(parents=True)
        for task in range(3):
            for f in range(files):
                labels = rng.choice([2 * task, 2 * task + 1], ROWS_PER_FILE)
                feats = means[labels] + rng.normal(size=(ROWS_PER_FILE, DIM))
                feats[rng.choice(ROWS_PER_FILE, REFUSED_PER_FILE, replace=False), 0] = np.nan
                batch = S.feature_batch(np.arange(next_id, next_id + ROWS_PER_FILE), feats, labels,
                                        np.full(ROWS_PER_FILE, task))
                next_id += ROWS_PER_FILE
                pq.write_table(pa.Table.from_batches([batch]), root / split / f"{task}-{f}.parquet")
    (root / "classes.txt").write_text("\n".join(f"c{i}" for i in range(6)) + "\n")


def config_for(stream: str, root, tmp_path, method: str, transport: str = "actors", **more):
    common = {"method.name": method, "method.router.initial_slots": 2, "method.stage1.optim.epochs": 1,
              "method.stage2.optim.epochs": 2, "method.derpp.buffer_size": 20, "method.analytic.expansion_dim": 32,
              "runtime.out": str(tmp_path / "runs"), "runtime.progress": False, "runtime.actor_threads": 1,
              "runtime.transport": transport, "runtime.checkpoint": False, **more}
    if stream == "short-and-refused":
        return load_config(overrides={"data.dataset": f"arrow:{root}", "data.payload": "features",
                                      "data.feature_dim": DIM, "stream.batch_size": BATCH, **common})
    return load_config(overrides={"data.dataset": "synthetic", "data.synthetic.classes": 6, "data.synthetic.dim": DIM,
                                  "data.synthetic.train_per_class": 30, "data.synthetic.test_per_class": 10,
                                  "stream.tasks": 3, "stream.batch_size": 15, "stream.task_free": True,
                                  "method.consolidate_every": 3, **common})


def assert_same_run(local, remote) -> None:
    """Two executors' runs of one config: the same figures, and the same files of predictions and dead letters."""
    for key in SAME:
        a, b = local.metrics.get(key), remote.metrics.get(key)
        if key == "acc_matrix":
            np.testing.assert_array_equal(np.array(a, dtype=float), np.array(b, dtype=float))
        else:
            assert a == b, key
    for folder in ("predictions", "dead_letters"):
        mine, theirs = (sorted((r.run_dir / folder).glob("*.parquet")) for r in (local, remote))
        assert [p.name for p in mine] == [p.name for p in theirs], folder
        for a, b in zip(mine, theirs, strict=True):
            assert pq.read_table(a).equals(pq.read_table(b)), a.name


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity") / "data"
    write_stream(root)
    return root


@pytest.mark.parametrize("stream", ["short-and-refused", "task-free"])
@pytest.mark.parametrize("name", family_methods("features"))
def test_in_process_and_actor_pipeline_compute_the_same_run(actors, one_torch_thread, folder, tmp_path, name,
                                                             stream):
    config = config_for(stream, folder, tmp_path, name)
    assert torch.get_num_threads() == 1
    local = runner.run(config, in_process=True)
    remote = runner.run(config, actors=actors)
    assert_same_run(local, remote)
    metrics = local.metrics
    # test-then-train: every training row predicted before it was learned; every row consolidated once
    learned = metrics["samples"]["learned"]
    assert metrics["prequential"]["rows"] == learned == metrics["consolidation"]["consolidated"]
    assert metrics["samples"]["unique_learned"] == learned and metrics["consolidation"]["let_go"] == 0
    if stream == "short-and-refused":  # the stream's own figures, so the comparison is not of two empty runs
        matrix = local.matrix
        assert learned == 3 * 2 * (ROWS_PER_FILE - REFUSED_PER_FILE) and matrix.shape == (3, 3)
        assert not np.isnan(matrix[np.tril_indices(3)]).any() and np.isnan(matrix[np.triu_indices(3, 1)]).all()
        dead = pq.read_table(local.run_dir / "dead_letters")
        assert dead.num_rows == local.samples.refused + local.samples.refused_test == 9 * REFUSED_PER_FILE


@pytest.mark.parametrize("name", ["mars-memcl", "mars-analytic"])
def test_the_compiled_graph_computes_what_the_in_process_run_does(actors, one_torch_thread, folder, tmp_path, name):
    local = runner.run(config_for("short-and-refused", folder, tmp_path, name), in_process=True)
    compiled = config_for("short-and-refused", folder, tmp_path, name, transport="compiled")
    assert_same_run(local, runner.run(compiled, actors=actors))


@pytest.mark.parametrize("name", ["mars-memcl", "derpp", "analytic", "mars-analytic"])
def test_a_stream_that_does_not_wait_publishes_the_same_versions_in_process_and_on_actors(
        actors, one_torch_thread, folder, tmp_path, name):
    """The simulated clock at one batch per pass: the trainers consolidate in the background while the stream goes
    on, and both executors publish each version before the same batch. Every labelled row is still consolidated
    once, and no consolidation takes more than one round's rows however far the trainers lag; rows predicted before
    the version that learned them wait longer than when the stream waits, and a trained head serves fewer
    versions."""
    config = config_for("task-free", folder, tmp_path, name, **{"stream.realtime.mode": "simulated"})
    local = runner.run(config, in_process=True)
    assert_same_run(local, runner.run(config, actors=actors))
    waits = runner.run(replace(config, stream=replace(config.stream, realtime=RealtimeConfig())), in_process=True)
    done, waited = local.metrics["consolidation"], waits.metrics["consolidation"]
    assert done["observed"] == done["consolidated"] == waited["consolidated"] == local.samples.learned
    clock = local.metrics["realtime"]
    assert clock["job"] is None and clock["published"] == done["versions"]
    taken = [c["rows"] for e in local.metrics["round_log"] for c in e["consolidations"] if "rows" in c]
    assert max(taken) <= max(e["batches"] for e in local.metrics["round_log"]) * config.stream.batch_size
    if clock["cost"]:  # trainers busy in the background: versions come later, and no more of them
        assert done["versions"] <= waited["versions"] and clock["busy"] > 0
    else:  # a head of sums keeps up: the same run as when the stream waits
        assert local.metrics["prequential"] == waits.metrics["prequential"]
    if name in ("mars-memcl", "derpp"):  # a trained head learns a row when its consolidation is published: later here
        assert done["staleness_mean"] > waited["staleness_mean"] > 0
    else:  # a head of sums learned each row as it came
        assert done["staleness_mean"] == waited["staleness_mean"] == 0


@pytest.mark.parametrize("name", ["mars-memcl", "slda"])
def test_anytime_evaluation_is_the_same_in_process_and_on_actors(actors, one_torch_thread, folder, tmp_path, name):
    """Three evaluations inside each visit, every task: the anytime matrix and the accuracy matrix are the same both
    ways; the accuracy matrix keeps only seen tasks while the anytime rows fill the tasks not seen yet; the class
    confusion of the end model counts every test row once."""
    config = config_for("short-and-refused", folder, tmp_path, name, **{"runtime.anytime": 3})
    local = runner.run(config, in_process=True)
    assert_same_run(local, runner.run(config, actors=actors))
    metrics = local.metrics
    anytime = np.array(metrics["anytime"]["matrix"])
    rounds = len(metrics["round_log"])
    assert rounds > 3 and anytime.shape == (rounds, 3) and not np.isnan(anytime).any()
    assert np.isnan(local.matrix[np.triu_indices(3, 1)]).all()
    assert metrics["anytime"]["row_visits"][-1] == 2  # the last of the three visits
    counts = np.array(metrics["class_confusion"]["counts"])
    classes = metrics["class_confusion"]["classes"]
    tested = 3 * (ROWS_PER_FILE - REFUSED_PER_FILE)
    assert counts.sum() == tested
    assert np.trace(counts) / tested == pytest.approx(np.mean(local.matrix[-1]))  # equal test rows per task
    assert -1 not in classes  # the end model knows every class


WORDS = [f"w{i}" for i in range(60)]


def write_text_stream(root):
    """Three tasks of two classes as files of 7 rows (batches of 5: every file ends in a batch of 2), task 0
    returning at the end; one row per file has no text (refused at the gate). Each class has its own words."""
    rng = np.random.default_rng(2)
    next_id = 0

    def table(task: int, rows: int) -> pa.Table:
        nonlocal next_id
        labels = rng.choice([2 * task, 2 * task + 1], rows)
        text = [" ".join(rng.choice(WORDS[10 * y:10 * y + 10], 6)) for y in labels]
        text[rng.integers(rows)] = None
        out = pa.table({S.SAMPLE_ID: pa.array(np.arange(next_id, next_id + rows), pa.int64()),
                        S.TASK_ID: pa.array(np.full(rows, task), pa.int32()),
                        S.LABEL: pa.array(labels, pa.int32()), S.TEXT: pa.array(text, pa.string())})
        next_id += rows
        return out

    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
    for i, task in enumerate([0, 0, 1, 1, 2, 2, 0]):
        pq.write_table(table(task, 7), root / "train" / f"{i:02d}.parquet")
    for task in range(3):
        pq.write_table(table(task, 6), root / "test" / f"{task}.parquet")


@pytest.mark.parametrize("name", family_methods("nsr"))
def test_nsr_in_process_and_actor_pipeline_compute_the_same_run(actors, one_torch_thread, tiny_bert, tmp_path, name):
    root = tmp_path / "text"
    write_text_stream(root)
    config = load_config(overrides={
        "data.dataset": f"arrow:{root}", "data.payload": "text", "stream.batch_size": 5,
        "encoder.spec.name": f"hf:{tiny_bert}", "encoder.spec.max_length": 16, "encoder.threads": 1,
        "method.name": name, "method.nsr.batch_size": 5, "method.nsr.lr": 5e-3, "method.nsr.probe_size": 8,
        "runtime.out": str(tmp_path / "runs"), "runtime.progress": False, "runtime.actor_threads": 1})
    local = runner.run(config, in_process=True)
    result = runner.run(config, actors=actors)
    assert_same_run(local, result)
    assert result.samples.learned == 7 * 6
    # test-then-train: every training row predicted before it was learned, alike in both
    assert result.metrics["prequential"]["rows"] == 7 * 6
    # the adapter trained bit for bit alike; the bank holds the same keys, compressed adapters and their scores
    (mine, _), (theirs, _) = (checkpoint.read(sorted(r.run_dir.glob("checkpoints/*.npz"))[-1])
                              for r in (local, result))
    assert mine.keys() == theirs.keys() and mine["adapter_trainer"]
    for role in mine:
        assert mine[role].keys() == theirs[role].keys(), role
        for key, value in mine[role].items():
            np.testing.assert_array_equal(value, theirs[role][key], err_msg=f"{role}.{key}")


def test_lm_in_process_and_actor_pipeline_give_the_same_answers(actors, one_torch_thread, tmp_path):
    """Every "lm" method, after every task, answers every test prompt it is asked the same in both executors, and
    every training pair answered before it is learned (test-then-train) too; each run's figures and bytes alike."""
    config = LMRunConfig(
        model=LMSpec(name="tiny:llama", threads=1), methods=tuple(family_methods("lm")), budgets=(256,),
        stream=LMStreamSpec(tasks=("word-code", "made-up-base", "last-letter"), train_per_task=6, test_per_task=3,
                            batch_size=4),
        runtime=RuntimeConfig(actor_threads=1, progress=False, out=str(tmp_path)))
    local = runner.run(config, run_dir=tmp_path / "local", in_process=True)
    remote = runner.run(config, run_dir=tmp_path / "lm", actors=actors)

    def answers(result) -> dict:
        rows = [json.loads(line) for line in (result.run_dir / "predictions.jsonl").read_text().splitlines()]
        return {(r["run"], r["split"], r["after_task"], r["sample_id"]): r["prediction"] for r in rows}

    mine = answers(local)
    assert mine == answers(remote)
    for spec in run_specs(config):
        assert sum(1 for key in mine if key[0] == spec.name and key[1] == "train") == 18, spec.name
        ours, theirs = local.runs[spec.name].metrics, remote.runs[spec.name].metrics
        np.testing.assert_array_equal(np.array(ours["acc_matrix"]), np.array(theirs["acc_matrix"]), spec.name)
        for key in ("prequential", "memory_bytes", "samples"):
            assert ours[key] == theirs[key], (spec.name, key)


def test_a_wall_clock_stream_publishes_each_version_once_its_trainers_are_done(actors, one_torch_thread, folder,
                                                                             tmp_path):
    """Wall mode on actors: versions are published when the trainers have finished (machine-dependent), never out of
    order, and every labelled row is still predicted before it is learned and consolidated once."""
    config = config_for("task-free", folder, tmp_path, "mars-memcl", **{"stream.realtime.mode": "wall"})
    result = runner.run(config, actors=actors)
    predictions = pq.read_table(result.run_dir / "predictions") if (result.run_dir / "predictions").exists() else None
    assert predictions is None  # a labelled stream: nothing goes to the sink
    done = result.metrics["consolidation"]
    assert done["observed"] == done["consolidated"] == result.samples.learned == result.samples.stream
    clock = result.metrics["realtime"]
    assert clock["published"] == done["versions"] >= 1 and clock["job"] is None


def test_memcls_in_process_entry_point_takes_the_stream_learning_settings(actors, one_torch_thread, tmp_path):
    """`memcl.run_in_process` with a stream that does not wait, anytime evaluation and another near-future k gives
    the runner's matrices and test-then-train figures."""
    import memcl

    settings = {"data.dataset": "synthetic", "data.synthetic.classes": 6, "data.synthetic.dim": DIM,
                "data.synthetic.train_per_class": 30, "data.synthetic.test_per_class": 10, "stream.tasks": 3,
                "stream.batch_size": 15, "method.stage2.optim.epochs": 2, "runtime.out": str(tmp_path),
                "runtime.progress": False, "runtime.actor_threads": 1, "runtime.checkpoint": False,
                "stream.realtime.mode": "simulated", "stream.realtime.rate": 1.0, "runtime.anytime": 2,
                "runtime.prequential.near_future": 3}
    local = memcl.run_in_process("finetune", settings)
    assert_same_run(local, memcl.run("finetune", settings))
    assert local.metrics["prequential"]["near_future"] == 3 and local.metrics["consolidation"]["versions"] > 1
