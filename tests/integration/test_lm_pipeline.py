"""`memcl lm` through real Ray actors (LMEncoder, MemoryManager, LMTrainer) and Arrow text-pair batches, on a
tiny random Llama (the SmolLM2 numbers come from the slow tier and benchmarks/miita_lm.py)."""

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import ray
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memcl.pipeline import checkpoint
from memcl.pipeline.config import RuntimeConfig, dump_config
from memcl.pipeline.lm import LMRunConfig, run_specs
from memcl.pipeline.runner import run
from memcl_ops.baselines.lm_finetune import FinetuneConfig
from memcl_ops.data.lm_tasks import LMStreamSpec
from memcl_ops.method_config import LMMethodConfig
from memcl_ops.miita.directions import AdaptConfig
from memcl_ops.models.causal_lm import LMSpec
from tests.killing import AIMS, kill_driver_at_checkpoint, killer, phase_killer

pytestmark = pytest.mark.ray

ALWAYS_ON = {"entropy_threshold": -1.0, "relevance_threshold": -1.0}  # gate fully open: any step shows


def config(step: float, methods=("base", "replay", "miita", "miita-paper", "miita-replay", "lora"), budgets=(256,),
           out="runs"):
    return LMRunConfig(
        model=LMSpec(name="tiny:llama", threads=1), methods=methods, budgets=budgets,
        stream=LMStreamSpec(tasks=("word-code", "made-up-base", "last-letter"), train_per_task=6, test_per_task=3,
                            batch_size=4),
        method=LMMethodConfig(adapt=AdaptConfig(step=step, **ALWAYS_ON)),
        runtime=RuntimeConfig(actor_threads=1, progress=False, out=str(out)))


@pytest.fixture(scope="module")
def zero_step(actors, tmp_path_factory):
    return run(config(0.0), run_dir=tmp_path_factory.mktemp("lm"), actors=actors).metrics


def predictions(metrics, split: str = "test") -> dict[str, dict]:
    """Per run, (after task, sample id) -> the answer, of the test pairs or (`split` "train") of the training pairs
    answered before they were learned."""
    rows = [json.loads(line) for line in Path(metrics["run_dir"], "predictions.jsonl").read_text().splitlines()]
    out: dict[str, dict] = {}
    for r in rows:
        if r["split"] == split:
            out.setdefault(r["run"], {})[(r["after_task"], r["sample_id"])] = r["prediction"]
    return out


def test_run_folder_holds_every_run_side_by_side(zero_step):
    runs = zero_step["runs"]
    assert list(runs) == ["base", "replay@256B", "miita@256B", "miita-paper@256B", "miita-replay@256B", "lora"]
    for name, r in runs.items():
        acc = np.array(r["acc_matrix"])
        assert acc.shape == (3, 3) and np.isnan(acc[np.triu_indices(3, 1)]).all(), name
        assert not np.isnan(acc[np.tril_indices(3)]).any(), name
        bwt = (acc[2, 0] - acc[0, 0] + acc[2, 1] - acc[1, 1]) / 2
        assert r["summary"]["a_last"] == pytest.approx(acc[-1].mean()) and r["summary"]["bwt"] == pytest.approx(bwt)
    folder = zero_step["run_dir"]
    for name in ("results.csv", "a_last_bwt.png", "miita_256B_acc_matrix.png", "lora_acc_matrix.csv", "config.yaml"):
        assert Path(folder, name).exists(), name


def _training_answers(metrics) -> list[dict]:
    """The training pairs' records in predictions.jsonl, in stream order: answered before they were learned."""
    rows = [json.loads(line) for line in Path(metrics["run_dir"], "predictions.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == "train"]


def test_prequential_accuracy_scores_every_training_pair_as_answered_before_it_was_learned(actors, tmp_path,
                                                                                          zero_step):
    answers = _training_answers(zero_step)
    for name, r in zero_step["runs"].items():
        mine = [a for a in answers if a["run"] == name]
        preq = r["prequential"]
        assert len(mine) == preq["rows"] == 18 and [p["rows"] for p in preq["curve"]] == [6, 12, 18], name
        assert preq["accuracy"] == pytest.approx(np.mean([a["exact"] for a in mine])), name
        for task, value in preq["per_task"].items():
            assert value == pytest.approx(np.mean([a["exact"] for a in mine if zero_step["tasks"][a["task"]] == task]))
    cfg = config(0.0, methods=("nearest-answer",), budgets=(4096,))  # a copier: some answers right, some wrong
    short = run(replace(cfg, runtime=replace(cfg.runtime, prequential=replace(cfg.runtime.prequential, window=4),
                                             tensorboard=True)),
                run_dir=tmp_path, actors=actors).metrics
    scores = [a["exact"] for a in _training_answers(short)]
    preq = short["runs"]["nearest-answer@4KiB"]["prequential"]
    assert 0 < np.mean(scores) < 1 and preq["window_accuracy"] == pytest.approx(np.mean(scores[-4:]))
    assert [p["window"] for p in preq["curve"]] == pytest.approx([np.mean(scores[:n][-4:]) for n in (6, 12, 18)])
    assert Path(short["run_dir"], "nearest-answer_4KiB_prequential.png").stat().st_size > 0
    events = EventAccumulator(str(next(Path(short["run_dir"]).rglob("tensorboard"))))  # TensorBoard's own reader
    events.Reload()
    for tag, key in (("prequential/accuracy", "accuracy"), ("prequential/window", "window")):
        assert [e.value for e in events.Scalars(tag)] == pytest.approx([p[key] for p in preq["curve"]]), tag


def test_runs_that_answer_only_the_test_pairs_learn_and_score_the_same(actors, tmp_path, zero_step):
    methods = ("base", "miita", "miita-replay", "lora")
    cfg = config(0.0, methods=methods)
    plain = run(replace(cfg, stream=replace(cfg.stream, answer_training_pairs=False)), run_dir=tmp_path,
                actors=actors).metrics
    assert not _training_answers(plain)
    for name, r in plain["runs"].items():
        np.testing.assert_array_equal(r["acc_matrix"], zero_step["runs"][name]["acc_matrix"], err_msg=name)
        assert r["prequential"]["rows"] == 0 and r["prequential"]["accuracy"] is None, name
    assert predictions(plain) == {name: answers for name, answers in predictions(zero_step).items()
                                  if name in plain["runs"]}


def test_memory_methods_stay_within_their_budget_after_every_task(zero_step):
    for name, r in zero_step["runs"].items():
        if r["budget_bytes"] is None:
            continue
        used = [sum(entry["memory_bytes"].values()) for entry in r["log"]]
        assert all(0 < u <= r["budget_bytes"] for u in used), (name, used)
    for run_name in ("miita@256B", "miita-paper@256B"):
        miita = zero_step["runs"][run_name]["log"]
        assert sum(entry["learned"]["new"] + entry["learned"]["merged"] for entry in miita) == 18  # every pair written
    # the MIITA paper's fp16 prototypes outgrow 256 bytes, so repair worked (position-aware repair: test_miita_answers)
    assert sum(entry["learned"]["repairs"] for entry in zero_step["runs"]["miita-paper@256B"]["log"]) > 0


def test_zero_step_paper_miita_answers_exactly_like_the_base_model(zero_step):
    preds = predictions(zero_step)
    base = {sample: text for (_, sample), text in preds["base"].items()}  # the frozen base answers each task once
    assert len(preds["miita-paper@256B"]) == 3 + 6 + 9  # after task i, the test pairs of tasks 0..i
    assert all(text == base[sample] for (_, sample), text in preds["miita-paper@256B"].items())
    runs = zero_step["runs"]
    assert runs["miita-paper@256B"]["final_answer_nll"] == runs["base"]["final_answer_nll"]  # the very same logits


def test_a_real_step_changes_the_answers(actors, tmp_path, zero_step):
    strong = run(config(3.0, methods=("miita-paper",)), run_dir=tmp_path, actors=actors).metrics
    assert predictions(strong)["miita-paper@256B"] != predictions(zero_step)["miita-paper@256B"]


def test_position_aware_miita_writes_the_nearest_stored_answer(actors, tmp_path):
    """Through the actors, the flip step makes the model write what its memory retrieved: ungated, MIITA's answers are
    the nearest-answer baseline's (same memory, same retrieval, answers copied without decoding)."""
    cfg = config(0.0, methods=("miita", "nearest-answer"), budgets=(4096,))
    cfg = replace(cfg, method=LMMethodConfig(adapt=AdaptConfig(max_step=100.0, flip_iterations=32, vote_gate=False)))
    preds = predictions(run(cfg, run_dir=tmp_path, actors=actors).metrics)
    same = [text == preds["nearest-answer@4KiB"][key] for key, text in preds["miita@4KiB"].items()]
    assert len(same) == 18 and np.mean(same) >= 0.8, same


def test_a_run_that_cannot_hold_its_budget_is_skipped_and_the_others_are_tabled(actors, tmp_path):
    """A budget too small for one memory entry is known only once the model is loaded: that (method, budget) is
    skipped with its reason, every other run still runs, and the table shows both."""
    from memcl.pipeline.lm import summary_table

    metrics = run(config(0.0, methods=("base", "miita"), budgets=(16, 4096)), run_dir=tmp_path, actors=actors).metrics
    assert list(metrics["runs"]) == ["base", "miita@4KiB"]
    assert list(metrics["skipped"]) == ["miita@16B"] and "cannot hold one prototype" in metrics["skipped"]["miita@16B"]
    assert not (tmp_path / "runs" / "miita_16B").exists()
    table = summary_table(metrics)
    assert re.search(r"miita@16B +skipped: .*budget_bytes 16 cannot hold", table) and "miita@4KiB" in table


def test_evaluating_only_the_new_task_gives_the_same_a_last_and_bwt(actors, tmp_path, zero_step):
    cfg = config(0.0, methods=("replay", "miita"))
    short = run(replace(cfg, runtime=replace(cfg.runtime, evaluate_window=1)), run_dir=tmp_path,
                actors=actors).metrics
    for name, r in short["runs"].items():
        acc, full = np.array(r["acc_matrix"]), np.array(zero_step["runs"][name]["acc_matrix"])
        assert np.isnan(acc[1, 0]) and r["summary"]["a_mean"] is None  # task 0 not answered again after task 1
        np.testing.assert_array_equal(acc[np.diag_indices(3)], full[np.diag_indices(3)])
        np.testing.assert_array_equal(acc[-1], full[-1])
        full_summary = zero_step["runs"][name]["summary"]
        assert (r["summary"]["a_last"], r["summary"]["bwt"]) == (full_summary["a_last"], full_summary["bwt"])


def test_lora_training_lowers_the_training_loss(zero_step):
    for entry in zero_step["runs"]["lora"]["log"]:
        losses = entry["learned"]["epoch_losses"]
        assert len(losses) == 3 and losses[-1] < losses[0], losses


def assert_same_runs(metrics: dict, reference: dict) -> None:
    """The same answers, scores and bytes after every task as `reference`, every training pair learned once."""
    preds, expected = predictions(metrics), predictions(reference)
    for name, r in metrics["runs"].items():
        ref = reference["runs"][name]
        np.testing.assert_array_equal(np.array(r["acc_matrix"]), np.array(ref["acc_matrix"]))
        assert r["final_answer_nll"] == ref["final_answer_nll"] and r["log"] == ref["log"], name
        assert preds[name] == expected[name], name
        assert r["prequential"] == ref["prequential"], name
        samples = r["samples"]
        learned = 0 if r["method"] == "base" else samples["stream"]  # the frozen base learns nothing
        assert samples["stream"] == 18 and samples["learned"] == samples["unique_learned"] == learned, (name, samples)


KILL_POINTS = np.random.default_rng(21).integers(0, [3, 2], size=(3, 2)).tolist()  # (task, batch)


@pytest.mark.parametrize("role, method, point", [("lm_encoder", "miita", 0), ("memory", "miita-paper", 1),
                                                 ("lm_trainer", "lora", 2)])
def test_actor_killed_mid_task_gives_the_uninterrupted_run(actors, tmp_path, zero_step, role, method, point):
    task, index = KILL_POINTS[point]
    hook, done = killer(actors, role, (task, 0 if method == "lora" else index), restart=point % 2 == 1)
    metrics = run(config(0.0, methods=(method,)), run_dir=tmp_path, actors=actors, on_batch=hook).metrics
    assert done and sum(r["recoveries"] for r in metrics["runs"].values()) >= 1
    assert_same_runs(metrics, zero_step)


@pytest.mark.parametrize("method, roles, seed", [("miita", ["lm_encoder", "memory"], 4),
                                                 ("lora", ["lm_encoder", "lm_trainer"], 5)])
def test_kills_aimed_at_every_step_of_the_run_give_the_uninterrupted_run(actors, tmp_path, zero_step, method, roles,
                                                                        seed):
    hook, done = phase_killer(actors, roles, seed)
    metrics = run(config(0.0, methods=(method,)), run_dir=tmp_path, actors=actors, on_phase=hook).metrics
    assert sorted(phase for phase, _ in done) == sorted(AIMS)
    assert sum(r["recoveries"] for r in metrics["runs"].values()) >= 3
    assert_same_runs(metrics, zero_step)


def _final_lora(metrics: dict) -> dict[str, np.ndarray]:
    """The LoRA factors after the last task, as checkpointed (worker 0's: a data-parallel worker's state is its)."""
    parts, _ = checkpoint.read(Path(metrics["run_dir"], "runs", "lora", "checkpoints", "ckpt-000002.npz"))
    assert "lm_trainer1" not in parts
    return {k: v for k, v in parts["lm_trainer"].items() if k.startswith("lora.")}


@pytest.fixture(scope="module")
def lora_two_workers(actors, tmp_path_factory):
    """The LoRA baseline's trainer as two data-parallel workers (DDP over gloo)."""
    cfg = config(0.0, methods=("lora",), out=tmp_path_factory.mktemp("dp"))
    return run(replace(cfg, runtime=replace(cfg.runtime, data_parallel=2)), actors=actors).metrics


def test_two_data_parallel_lora_workers_learn_what_one_learns(actors, zero_step, lora_two_workers):
    one, two = _final_lora(zero_step), _final_lora(lora_two_workers)
    assert one.keys() == two.keys() and len(one) >= 4
    # the same minibatches' mean gradients, summed in another order: the factors agree to a twentieth of one Adam
    # step (lr) but for the odd element whose gradient is near zero, where Adam's normalised step amplifies the
    # rounding (all within half a step), and the losses to float rounding
    step = FinetuneConfig().optim.lr
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=0, atol=step / 2, err_msg=key)
        assert np.mean(np.abs(two[key] - one[key]) > step / 20) <= 0.01, key
        assert np.abs(one[key]).max() > step, key  # the factors moved: a trained adapter is compared
    # and not bit for bit: each worker summed only its share of every minibatch (two workers each learning every pair
    # would repeat one worker's sums exactly)
    assert any(not np.array_equal(two[key], one[key]) for key in one)
    parts = ray.get([actors.handle(w).state.remote() for w in ("lm_trainer", "lm_trainer1")])
    for key in two:  # DDP keeps the workers identical
        np.testing.assert_array_equal(parts[1][key], parts[0][key], err_msg=key)
    single, double = zero_step["runs"]["lora"], lora_two_workers["runs"]["lora"]
    np.testing.assert_array_equal(np.array(double["acc_matrix"], float), np.array(single["acc_matrix"], float))
    for a, b in zip(double["log"], single["log"], strict=True):
        np.testing.assert_allclose(a["learned"]["epoch_losses"], b["learned"]["epoch_losses"], rtol=1e-4)
    assert predictions(lora_two_workers)["lora"] == predictions(zero_step)["lora"]
    samples = double["samples"]  # each pair learned once by the group (by one worker's share)
    assert samples["learned"] == samples["unique_learned"] == samples["stream"] == 18


def test_a_data_parallel_lora_worker_killed_mid_task_replays_to_the_uninterrupted_run(actors, tmp_path,
                                                                                     lora_two_workers):
    hook, done = killer(actors, "lm_trainer1", (1, 0), restart=True)
    cfg = config(0.0, methods=("lora",), out=tmp_path)
    metrics = run(replace(cfg, runtime=replace(cfg.runtime, data_parallel=2)), actors=actors, on_batch=hook).metrics
    assert done and metrics["runs"]["lora"]["recoveries"] >= 1
    assert_same_runs(metrics, lora_two_workers)
    for key, value in _final_lora(lora_two_workers).items():
        np.testing.assert_array_equal(_final_lora(metrics)[key], value, err_msg=key)


def test_killed_driver_resumes_to_the_uninterrupted_runs(actors, tmp_path, zero_step):
    dump_config(config(0.0, out=tmp_path), tmp_path / "lm.yaml")
    run_dir = kill_driver_at_checkpoint(["lm", "--config", str(tmp_path / "lm.yaml")], tmp_path,
                                        "runs/miita_256B/checkpoints/ckpt-000000.sha256")
    assert_same_runs(run(resume=run_dir, actors=actors).metrics, zero_step)


def test_a_resume_that_cannot_use_a_checkpoint_keeps_it_and_exits_non_zero(actors, tmp_path, capsys):
    """A checkpoint the resume cannot read (here one of a newer memcl, its run state holding a key this one does not
    know) is an error naming it, never a (method, budget) "skipped" with its folder removed."""
    from memcl.pipeline import cli

    done = run(config(0.0, methods=("miita",), out=tmp_path), actors=actors)
    folder = done.run_dir / "runs" / "miita_256B"
    for finished in (folder / "metrics.json", done.run_dir / "metrics.json"):  # as if stopped after its last round
        finished.unlink()
    path = sorted((folder / "checkpoints").glob("ckpt-*.npz"))[-1]
    parts, meta = checkpoint.read(path)
    checkpoint.write(path.parent, int(path.stem.split("-")[1]), parts, {**meta, "written_by_a_newer_memcl": 1})
    capsys.readouterr()
    assert cli.main(["lm", "--resume", str(done.run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"miita@256B: the run cannot go on from its checkpoint {path}" in err
    assert checkpoint.read(path)[1]["written_by_a_newer_memcl"] == 1  # still there, untouched


def test_bad_run_configs_are_refused():
    with pytest.raises(ValueError, match="unknown LM method 'rag'"):
        run_specs(LMRunConfig(methods=("base", "rag")))
    with pytest.raises(ValueError, match="positive byte budgets"):
        run_specs(LMRunConfig(methods=("miita",), budgets=()))


def test_two_lm_replicas_share_the_answering_and_give_the_same_answers(actors, tmp_path):
    methods = ("base", "replay", "miita")
    one = run(config(0.5, methods=methods, out=tmp_path / "one"), actors=actors).metrics
    cfg = config(0.5, methods=methods, out=tmp_path / "two")
    two = run(replace(cfg, runtime=replace(cfg.runtime, lm_replicas=2)), actors=actors).metrics
    assert predictions(two) == predictions(one)
    for name in one["runs"]:
        np.testing.assert_array_equal(np.array(two["runs"][name]["nll_matrix"], float),
                                      np.array(one["runs"][name]["nll_matrix"], float), err_msg=name)
    busy = two["actor_busy_seconds"]  # each copy of the LM extracted and answered its turn
    for replica in ("lm_encoder", "lm_encoder1"):
        assert busy[replica]["generate"]["seconds"] > 0 and busy[replica]["extract"]["seconds"] > 0, busy
