"""One implementation, two executors: every registered method run in-process (`build_learner` driven by
`memcl_ops.rounds.stream_in_process` or a plain loop) and through the Ray pipeline (`memcl run` / `memcl lm`'s runner,
actor calls, and the compiled graph) computes the same run, bit for bit at one torch thread: the "features" family's
accuracy matrix, memory bytes and sample accounting on an `arrow:` folder whose files end in short batches and hold
rows the gate refuses, and on a task-free stream; NSR's matrix, adapter and bank on such a text folder; the "lm"
family's every answer."""

import dataclasses
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
from memcl_ops.data.lm_tasks import LMStreamSpec, task_batches
from memcl_ops.data.lm_tasks import build_stream as build_lm_stream
from memcl_ops.learner import Round
from memcl_ops.learners import build_learner
from memcl_ops.methods import family_methods, method_spec
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.prequential import PrequentialConfig
from memcl_ops.realtime import RealtimeConfig, declared_cost, start_clock
from memcl_ops.roles.stream_source import StreamSource
from memcl_ops.rounds import Schedule, plan_rounds, stream_in_process

pytestmark = pytest.mark.ray

DIM, ROWS_PER_FILE, BATCH = 8, 45, 20  # 45 = 20 + 20 + 5: every file ends in a short batch
REFUSED_PER_FILE = 2  # rows with a non-finite feature, refused at the gate


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


def config_for(stream: str, root, tmp_path, method: str, transport: str = "actors"):
    common = {"method.name": method, "method.router.initial_slots": 2, "method.stage1.optim.epochs": 1,
              "method.stage2.optim.epochs": 2, "method.derpp.buffer_size": 20, "method.analytic.expansion_dim": 32,
              "runtime.out": str(tmp_path / "runs"), "runtime.progress": False, "runtime.actor_threads": 1,
              "runtime.transport": transport, "runtime.checkpoint": False}
    if stream == "short-and-refused":
        return load_config(overrides={"data.dataset": f"arrow:{root}", "data.payload": "features",
                                      "data.feature_dim": DIM, "stream.batch_size": BATCH, **common})
    return load_config(overrides={"data.dataset": "synthetic", "data.synthetic.classes": 6, "data.synthetic.dim": DIM,
                                  "data.synthetic.train_per_class": 30, "data.synthetic.test_per_class": 10,
                                  "stream.tasks": 3, "stream.batch_size": 15, "stream.task_free": True,
                                  "method.consolidate_every": 3, **common})


def in_process(config):
    """The run's matrix, memory report, learned sample ids and refused ids, without Ray."""
    source = StreamSource(config.data, config.stream, config.runtime.max_batch_rows)
    info = source.describe()
    learner = build_learner(config.method.name, config.method, seed=config.seed, feature_dim=info.feature_dim)
    every = config.method.consolidate_every
    rounds = len(plan_rounds(info, config.stream.task_free, every))
    schedule = Schedule(config.stream.task_free, rounds, config.runtime.evaluate_every, config.runtime.evaluate_window)
    run = stream_in_process(learner, source, schedule, every)
    report = {k: v for k, v in learner.flow.memory_report().items() if k != "num_slots"}
    report["prequential"] = run.prequential(config.runtime.prequential)
    return run.matrix, report, np.sort(learner.roles["stage2"].learned_ids()), run.refused_ids


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
    matrix, report, learned, refused = in_process(config)
    result = runner.run(config, actors=actors)
    metrics = result.metrics
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], dtype=float), matrix)
    # test-then-train: every training row predicted before it was learned, the same way in both
    assert metrics["prequential"] == report.pop("prequential")
    assert metrics["prequential"]["rows"] == len(learned)
    assert metrics["memory_bytes"] == report
    # every evaluation reads its test rows again: the run keeps and counts each refused row once
    distinct = np.unique(refused)
    assert result.samples.learned == len(learned)
    assert result.samples.refused + result.samples.refused_test == len(distinct)
    dead = sorted(result.run_dir.glob("dead_letters/*.parquet"))
    ids = np.sort(np.concatenate([pq.read_table(p).column(S.SAMPLE_ID).to_numpy() for p in dead])) if dead else []
    np.testing.assert_array_equal(ids, distinct)
    if stream == "short-and-refused":  # the stream's own figures, so the comparison is not of two empty runs
        assert len(learned) == 3 * 2 * (ROWS_PER_FILE - REFUSED_PER_FILE) and matrix.shape == (3, 3)
        assert not np.isnan(matrix[np.tril_indices(3)]).any() and np.isnan(matrix[np.triu_indices(3, 1)]).all()


@pytest.mark.parametrize("name", ["mars", "mars-analytic"])
def test_the_compiled_graph_computes_what_the_in_process_learner_does(actors, one_torch_thread, folder, tmp_path,
                                                                     name):
    config = config_for("short-and-refused", folder, tmp_path, name, transport="compiled")
    matrix, report, learned, _ = in_process(config)
    metrics = runner.run(config, actors=actors).metrics
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], dtype=float), matrix)
    # test-then-train: every training row predicted before it was learned, the same way in both
    assert metrics["prequential"] == report.pop("prequential")
    assert metrics["prequential"]["rows"] == len(learned)
    assert metrics["memory_bytes"] == report and metrics["samples"]["learned"] == len(learned)


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
    source = StreamSource(config.data, config.stream, config.runtime.max_batch_rows)
    info = source.describe()
    learner = build_learner(name, config.method, seed=config.seed, encoder=config.encoder.spec, payload=S.TEXT,
                            n_way=max(len(c) for c in info.task_classes))
    run = stream_in_process(learner, source, Schedule(False, len(info.visits)))
    result = runner.run(config, actors=actors)
    np.testing.assert_array_equal(np.array(result.metrics["acc_matrix"], dtype=float), run.matrix)
    assert result.samples.learned == len(learner.trainer.learned_ids()) == 7 * 6
    # test-then-train: every training row predicted before it was learned, alike in both
    assert result.metrics["prequential"] == run.prequential(config.runtime.prequential)
    assert result.metrics["prequential"]["rows"] == 7 * 6
    parts, _ = checkpoint.read(sorted(result.run_dir.glob("checkpoints/*.npz"))[-1])
    # the adapter trained bit for bit alike; the bank holds the same keys and compressed adapters (its entries'
    # metadata differ: the pipeline scores each stored adapter on the task's test rows, a learner has none)
    mine = learner.state()
    for key, value in parts["adapter_trainer"].items():
        np.testing.assert_array_equal(value, mine[f"adapter_trainer.{key}"], err_msg=key)
    if "memory" in parts:
        stored = {k: v for k, v in parts["memory"].items() if not k.endswith("meta")}
        assert stored and stored.keys() == {k[7:] for k in mine if k.startswith("memory.") and not k.endswith("meta")}
        for key, value in stored.items():
            np.testing.assert_array_equal(value, mine[f"memory.{key}"], err_msg=key)


def test_lm_in_process_and_actor_pipeline_give_the_same_answers(actors, one_torch_thread, tmp_path):
    """Every "lm" method, after every task, answers every test prompt it is asked the same in both executors; and
    test-then-train, each training batch answered before it is learned (in process: `answer`, then `observe`), gives
    the same answers to the training pairs too."""
    config = LMRunConfig(
        model=LMSpec(name="tiny:llama", threads=1), methods=tuple(family_methods("lm")), budgets=(256,),
        stream=LMStreamSpec(tasks=("word-code", "made-up-base", "last-letter"), train_per_task=6, test_per_task=3,
                            batch_size=4),
        runtime=RuntimeConfig(actor_threads=1, progress=False, out=str(tmp_path)))
    metrics = runner.run(config, run_dir=tmp_path / "lm", actors=actors).metrics
    asked: dict[str, dict] = {}
    before: dict[str, dict] = {}  # the training pairs, answered before they were learned
    for line in (tmp_path / "lm" / "predictions.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["split"] == "test":
            asked.setdefault(row["run"], {})[(row["after_task"], row["sample_id"])] = row["prediction"]
        else:
            before.setdefault(row["run"], {})[row["sample_id"]] = row["prediction"]
    tasks = build_lm_stream(config.stream)
    train, test = task_batches(tasks, config.stream.batch_size, config.stream.answer_batch_size)
    task_of = {sid: j for j, batches in enumerate(test) for b in batches for sid in b.column(S.SAMPLE_ID).to_pylist()}
    for spec in run_specs(config):
        learner = build_learner(spec.method, config.method, seed=config.seed, lm=config.model, budget=spec.budget)
        answered, answered_before = {}, {}
        for t in range(len(tasks)):
            learner.begin_round(Round(t, t, None))
            for batch in train[t]:
                out = learner.answer(batch, tasks[t].max_answer_tokens)
                answered_before.update(zip(out.column(S.SAMPLE_ID).to_pylist(), out.column(S.PREDICTION).to_pylist()))
                learner.observe(batch)
            learner.consolidate()
            for j in sorted({task_of[sid] for after, sid in asked[spec.name] if after == t}):
                for batch in test[j]:
                    out = learner.answer(batch, tasks[j].max_answer_tokens)
                    answered.update({(t, sid): p for sid, p in zip(out.column(S.SAMPLE_ID).to_pylist(),
                                                                    out.column(S.PREDICTION).to_pylist())})
        assert answered == asked[spec.name], spec.name
        assert answered_before == before[spec.name] and len(answered_before) == 18, spec.name
        assert metrics["runs"][spec.name]["memory_bytes"] == learner.flow.memory_report(), spec.name


@pytest.mark.parametrize("name", ["mars", "ncm"])
def test_a_stream_that_does_not_wait_skips_the_same_batches_in_process_and_on_actors(actors, one_torch_thread, folder,
                                                                                    tmp_path, name):
    """The simulated clock at a rate the method cannot keep up with: both executors skip the same batches (predicted,
    not learned), learn the rest, and count the skipped rows."""
    config = config_for("task-free", folder, tmp_path, name)
    rate = 1.5 / declared_cost(method_spec(name), config.method)  # busy 1.5 arrivals a batch: it takes every other
    config = replace(config, stream=replace(config.stream, realtime=RealtimeConfig("simulated", rate)))
    source = StreamSource(config.data, config.stream, config.runtime.max_batch_rows)
    info = source.describe()
    learner = build_learner(name, config.method, seed=config.seed, feature_dim=info.feature_dim)
    every = config.method.consolidate_every
    schedule = Schedule(True, len(plan_rounds(info, True, every)))
    clock = start_clock(config.stream.realtime, method_spec(name), config.method)
    run = stream_in_process(learner, source, schedule, every, clock, config.stream.realtime)
    result = runner.run(config, actors=actors)
    metrics = result.metrics
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], dtype=float), run.matrix)
    assert metrics["prequential"] == run.prequential(config.runtime.prequential)
    assert metrics["realtime"] == dataclasses.asdict(clock)
    total = sum(info.visit_batches)
    assert clock.learned_batches + clock.skipped_batches == total and clock.learned_batches == (total + 1) // 2
    learned = np.sort(learner.roles["stage2"].learned_ids())
    assert result.samples.learned == len(learned) == info.num_samples - result.samples.skipped


@pytest.mark.parametrize("name", ["mars", "slda"])
def test_anytime_evaluation_is_the_same_in_process_and_on_actors(actors, one_torch_thread, folder, tmp_path, name):
    """Three evaluations inside each visit, every task: the anytime matrix and the accuracy matrix are the same both
    ways; the accuracy matrix keeps only seen tasks while the anytime rows fill the tasks not seen yet; the class
    confusion of the end model counts every test row once."""
    config = config_for("short-and-refused", folder, tmp_path, name)
    config = replace(config, runtime=replace(config.runtime, anytime=3))
    source = StreamSource(config.data, config.stream, config.runtime.max_batch_rows)
    info = source.describe()
    learner = build_learner(name, config.method, seed=config.seed, feature_dim=info.feature_dim)
    rounds = len(plan_rounds(info, False, 0, steps=3))
    run = stream_in_process(learner, source, Schedule(False, rounds, anytime=3))
    metrics = runner.run(config, actors=actors).metrics
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], dtype=float), run.matrix)
    anytime = np.array(metrics["anytime"]["matrix"])
    np.testing.assert_array_equal(anytime, np.array(run.anytime))
    assert rounds > len(info.visits) and anytime.shape == (rounds, 3) and not np.isnan(anytime).any()
    assert np.isnan(run.matrix[np.triu_indices(3, 1)]).all()
    assert metrics["anytime"]["row_visits"][-1] == len(info.visits) - 1
    counts = np.array(metrics["class_confusion"]["counts"])
    classes = metrics["class_confusion"]["classes"]
    tested = 3 * (ROWS_PER_FILE - REFUSED_PER_FILE)
    assert counts.sum() == tested
    assert np.trace(counts) / tested == pytest.approx(np.mean(run.matrix[-1]))  # equal test rows per task
    assert -1 not in classes  # the end model knows every class


def test_a_wall_clock_stream_far_faster_than_its_learner_skips_all_it_cannot_take(actors, one_torch_thread, folder,
                                                                               tmp_path):
    """Wall mode at a million batches a second: the first round is learned (nothing measured yet), then the
    learner's measured seconds per batch let through at most the first batch of each later round; every batch is
    counted once, learned or skipped, and every skipped labelled row is predicted."""
    config = config_for("task-free", folder, tmp_path, "ncm")
    config = replace(config, stream=replace(config.stream, realtime=RealtimeConfig("wall", 1e6)))
    result = runner.run(config, actors=actors)
    clock, every = result.metrics["realtime"], config.method.consolidate_every
    rounds = result.metrics["round_log"]
    assert clock["cost"] > 0 and every <= clock["learned_batches"] <= every + len(rounds) - 1
    assert clock["learned_batches"] + clock["skipped_batches"] == sum(r["batches"] for r in rounds)
    assert result.samples.skipped > 0 and result.metrics["prequential"]["skipped"] == result.samples.skipped
    assert result.samples.learned + result.samples.skipped == result.samples.stream


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
    metrics = memcl.run("finetune", settings).metrics
    np.testing.assert_array_equal(np.array(metrics["acc_matrix"], dtype=float), local.matrix)
    np.testing.assert_array_equal(np.array(metrics["anytime"]["matrix"]), np.array(local.anytime))
    assert metrics["prequential"] == local.prequential(RuntimeConfig(prequential=PrequentialConfig(near_future=3))
                                                       .prequential)
    assert metrics["prequential"]["near_future"] == 3 and metrics["samples"]["skipped"] > 0
