"""NSR's learner on the real offline MiniLM and BBC News texts: the backbone never changes, a restored adapter
reproduces the stored one bit for bit, the arrival rules set up the active capacity as documented, every training
batch is predicted before it is learned."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import load_dataset
from memcl_ops.data_parallel import DataParallel
from memcl_ops.models.encoders import EncoderSpec, build_encoder
from memcl_ops.models.lora import backbone_parameters
from memcl_ops.nsr.adapter import (
    AdapterLearner,
    ArrivalPlan,
    NSRConfig,
    RecoveryTracker,
    _Student,
    plan_arrival,
)
from memcl_ops.nsr.task_bank import TaskKnowledgeBank
from memcl_ops.roles.adapter_trainer import AdapterTrainer

CONFIG = NSRConfig(lr=5e-3, batch_size=8, probe_size=16)
TASKS = {0: [0, 1], 1: [2, 3]}  # BBC topics: business vs entertainment, politics vs sport


@pytest.fixture(scope="module")
def encoder():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_encoder(EncoderSpec(name="minilm", max_length=24), "text")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bbc():
    return load_dataset("bbc-news")


def batch(bbc, task: int, n: int, offset: int = 0, split: str = "train"):
    x, y = bbc.split(split)
    rows = np.concatenate([np.flatnonzero(y == c)[offset:offset + n // 2] for c in TASKS[task]])
    rows = np.random.default_rng(task + offset).permutation(rows)
    return S.raw_batch(rows.astype(np.int64), "text", x[rows], y[rows], np.full(len(rows), task), stream="bbc")


def learner(encoder, config=CONFIG):
    return AdapterLearner(encoder, config, n_way=2, seed=0)


def test_training_moves_only_the_adapter_and_head_never_the_backbone(encoder, bbc):
    model = encoder.model
    nsr = learner(encoder)
    before = {k: v.detach().clone() for k, v in backbone_parameters(model).items()}
    assert not any(p.requires_grad for p in backbone_parameters(model).values())
    nsr.begin_task(TASKS[0], ArrivalPlan("fresh"))
    losses = nsr.train_batch(batch(bbc, 0, 16))
    assert len(losses) == 2 and nsr.steps == 2
    assert any(float(p.detach().abs().sum()) > 0 for p in nsr.adapters.parameters()[1::2])  # B left 0
    after = backbone_parameters(model)
    assert set(after) == set(before) and all(torch.equal(before[k], after[k]) for k in before)
    nsr.adapters.remove()


def test_a_restored_adapter_gives_bit_identical_outputs_to_the_stored_one(encoder, bbc):
    """Store task 0 (compressed, fp16), train task 1 on the same capacity, round-trip the bank through its numpy
    state, then restore task 0 at its next arrival: logits equal those of the stored adapter exactly."""
    nsr = learner(encoder)
    bank = TaskKnowledgeBank(CONFIG.bank)
    probe = batch(bbc, 0, 16)
    nsr.begin_task(TASKS[0], plan_arrival(bank, nsr.key([probe]), CONFIG.lora.rank))
    nsr.train_batch(probe)
    snapshot = nsr.snapshot()
    assert all(d.B.dtype == np.float16 for d in snapshot.deltas.values())
    bank.store(snapshot.entry(0, nsr.key([probe])))
    held_out = batch(bbc, 0, 8, offset=40)
    nsr.load_stored(snapshot)
    stored_logits = nsr.logits(held_out)

    other = batch(bbc, 1, 16)
    nsr.begin_task(TASKS[1], plan_arrival(bank, nsr.key([other]), CONFIG.lora.rank))
    nsr.train_batch(other)
    assert not torch.equal(nsr.logits(held_out), stored_logits)

    copy = TaskKnowledgeBank(CONFIG.bank)
    copy.restore({k: np.array(v) for k, v in bank.state().items()})
    plan = plan_arrival(copy, nsr.key([probe]), CONFIG.lora.rank)
    assert plan.kind == "restore" and plan.retrieval.tasks == [0]
    nsr.begin_task(TASKS[0], plan)
    assert torch.equal(nsr.logits(held_out), stored_logits)
    nsr.adapters.remove()


def test_keys_ignore_the_adapter_and_separate_tasks(encoder, bbc):
    nsr = learner(encoder)
    a, b = batch(bbc, 0, 16), batch(bbc, 1, 16)
    key_a = nsr.key([a])
    nsr.begin_task(TASKS[0], ArrivalPlan("fresh"))
    nsr.train_batch(a)
    np.testing.assert_array_equal(nsr.key([a]), key_a)  # LoRA off: the key does not drift with training
    assert float(np.linalg.norm(key_a)) == pytest.approx(1.0, abs=1e-5)
    same, other = float(key_a @ nsr.key([batch(bbc, 0, 16, offset=30)])), float(key_a @ nsr.key([b]))
    assert same > other
    nsr.adapters.remove()


def test_arrival_plans_set_up_the_active_capacity(encoder, bbc):
    nsr = learner(encoder)
    data = batch(bbc, 0, 8)
    nsr.begin_task(TASKS[0], ArrivalPlan("fresh"))
    nsr.train_batch(data)
    trained = nsr.state()
    nsr.begin_task(TASKS[1], ArrivalPlan("keep"))  # memoryless "keep": nothing changes
    kept = nsr.state()
    assert all(np.array_equal(kept[k], trained[k]) for k in trained if k.startswith(("lora.", "head.")))
    assert nsr.teacher is None
    nsr.begin_task(TASKS[1], ArrivalPlan("fresh"))  # memoryless "fresh": ΔW = 0 and a zero head
    assert all(float(nsr.adapters.delta(s).abs().max()) == 0.0 for s in nsr.adapters.sites)
    assert float(nsr.head.weight.detach().abs().sum()) == 0.0
    # a restore distils from the restored adapter: at the first step student and teacher coincide, KD = 0
    snap = nsr.snapshot()
    nsr.begin_task(TASKS[0], ArrivalPlan("restore", {s: d.factors() for s, d in snap.deltas.items()}, snap.head,
                                         [snap.head]))
    assert nsr.teacher is not None
    teacher = nsr._teacher_features(data)
    assert torch.equal(teacher, encoder.features(data).float().detach())
    nsr.adapters.remove()


def test_labels_outside_the_task_are_refused(encoder, bbc):
    nsr = learner(encoder)
    nsr.begin_task(TASKS[0], ArrivalPlan("fresh"))
    with pytest.raises(ValueError, match=r"labels \[2, 3\] are not classes of the task \[0, 1\]"):
        nsr.train_batch(batch(bbc, 1, 8))
    nsr.adapters.remove()


def test_recovery_tracker_counts_steps_until_within_tolerance():
    t = RecoveryTracker(previous_best=0.9, tolerance=0.01, max_steps=5)
    for step, acc in enumerate([0.5, 0.7, 0.88, 0.895, 0.95]):
        t.record(step, acc)
    assert t.recovered_at == 3 and t.report()["curve"][-1] == [3, 0.895]  # stops recording once back
    censored = RecoveryTracker(previous_best=0.9, tolerance=0.01, max_steps=2)
    for step in range(5):
        censored.record(step, 0.5)
    assert censored.recovered_at is None and censored.report()["censored"] and len(censored.curve) == 3
    instant = RecoveryTracker(previous_best=0.8, tolerance=0.01, max_steps=5)
    instant.record(0, 0.8)
    assert instant.recovered_at == 0


def test_data_parallel_shares_average_to_the_whole_steps_gradient(encoder, bbc):
    """What DDP averages over the workers (each worker's weighed share of a step's rows) is the gradient of the whole
    step's mean loss, KD term included, for shares of unequal size and with more workers than rows."""
    nsr = learner(encoder)
    nsr.begin_task(TASKS[0], ArrivalPlan("fresh"))
    nsr.train_batch(batch(bbc, 0, 16))
    snap = nsr.snapshot()
    nsr.begin_task(TASKS[0], ArrivalPlan("restore", {s: d.factors() for s, d in snap.deltas.items()}, snap.head,
                                         [snap.head]))
    nsr.train_batch(batch(bbc, 0, 8, offset=8))  # the student moves away from its teacher: the KD term is live
    assert nsr.teacher is not None and CONFIG.kd_weight > 0
    trainable = [*nsr.adapters.parameters(), *nsr.head.parameters()]

    def gradient() -> list[torch.Tensor]:
        for p in trainable:
            p.grad = None
        loss.backward()
        return [p.grad.clone() for p in trainable]

    step = batch(bbc, 0, 8, offset=16).slice(0, 7)
    loss, _ = nsr.loss(step)
    whole = gradient()
    for world in (2, 3, 9):  # shares of 4 and 3 rows; 3, 2, 2; seven of one row and two of none
        total = [torch.zeros_like(g) for g in whole]
        for rank in range(world):
            nsr.parallel = DataParallel(rank, world, _Student(encoder, nsr.head))
            loss, _ = nsr.loss(step)
            total = [t + g for t, g in zip(total, gradient(), strict=True)]
        nsr.parallel = None
        for averaged, expected in zip(total, whole, strict=True):
            torch.testing.assert_close(averaged / world, expected, rtol=1e-4, atol=1e-7)
    nsr.adapters.remove()


def test_every_training_batch_is_predicted_before_it_is_learned_and_as_of_k_batches_back(bbc):
    """Test-then-train in the adapter trainer (k = 2): batch t is predicted by the capacity that has learned the
    batches before t, and by the one that had learned only those before t - 1, read here from the capacity itself
    just before it learned batch t - 1; across a task's arrival too, and after a restore."""
    spec = EncoderSpec(name="minilm", max_length=24)
    trainer = AdapterTrainer(spec, "text", CONFIG, n_way=2, seed=0, threads=1, near_future=2)
    visits = [(0, [batch(bbc, 0, 8, offset=8 * i) for i in range(3)]), (1, [batch(bbc, 1, 8, offset=8 * i)
                                                                            for i in range(2)])]
    expected, near, tables = [], {}, []
    for v, (task, batches) in enumerate(visits):
        trainer.begin_task(TASKS[task], ArrivalPlan("fresh"), None)
        following = [*[b for _, later in visits[v:] for b in later][1:], None]
        for b, after in zip(batches, following):
            expected.append(trainer.learner.scored(b))
            if after is not None:  # the next batch as this capacity, about to learn b, predicts it
                near[len(expected)] = trainer.learner.scored(after)[0]
            trainer.train(b)
        tables.append(trainer.end_task(False)["prequential"])
        if v == 0:  # a checkpoint between the visits keeps the capacity the next batch is scored as of
            resumed = AdapterTrainer(spec, "text", CONFIG, n_way=2, seed=0, threads=1, near_future=2)
            resumed.restore(trainer.state())
            trainer = resumed
    table = pa.concat_tables(tables)
    rows = [len(b) for _, batches in visits for b in batches]
    np.testing.assert_array_equal(table.column("prediction").to_numpy(), np.concatenate([p for p, _ in expected]))
    np.testing.assert_allclose(table.column("score").to_numpy(), np.concatenate([s for _, s in expected]), rtol=1e-6)
    first_near = expected[0][0]  # no capacity before the first batch's: its own
    np.testing.assert_array_equal(table.column("near_future").to_numpy(),
                                  np.concatenate([first_near, *(near[t] for t in range(1, len(rows)))]))
    assert table.column("model_version").to_pylist() == [0] * sum(rows[:3]) + [1] * sum(rows[3:])
    # the predictions moved as the capacity learned: the test above compares what a stale model would not give
    assert any((near[t] != expected[t][0]).any() for t in range(1, len(rows)))


def test_a_batch_of_several_steps_is_predicted_step_by_step_as_the_same_rows_in_batches_of_one_step(bbc):
    """Each optimizer step's rows are predicted before that step learns them: a batch of two steps gives the
    predictions (and the weights) of its two halves streamed as batches of one step each."""
    spec = EncoderSpec(name="minilm", max_length=24)
    rows = batch(bbc, 0, 16, offset=4)
    whole, halves = (AdapterTrainer(spec, "text", CONFIG, n_way=2, seed=0, threads=1) for _ in range(2))
    for trainer, batches in ((whole, [rows]), (halves, [rows.slice(0, 8), rows.slice(8)])):
        trainer.begin_task(TASKS[0], ArrivalPlan("fresh"), None)
        for b in batches:
            trainer.train(b)
    one, two = (t.end_task(False)["prequential"] for t in (whole, halves))
    assert one.column("prediction").to_pylist() == two.column("prediction").to_pylist()
    np.testing.assert_allclose(one.column("score").to_numpy(), two.column("score").to_numpy(), rtol=1e-5)
    assert whole.learner.steps == halves.learner.steps == 2
    # the second step's rows were predicted after the first step had learned: not what the start of the batch gave
    fresh = AdapterTrainer(spec, "text", CONFIG, n_way=2, seed=0, threads=1)
    fresh.begin_task(TASKS[0], ArrivalPlan("fresh"), None)
    assert not np.allclose(fresh.learner.scored(rows.slice(8))[1], one.column("score").to_numpy()[8:])
