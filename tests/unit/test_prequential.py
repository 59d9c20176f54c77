"""Test-then-train (memcl_ops/prequential.py): every training batch predicted before it is learned, near-future
accuracy from the model k batches back, the blind baseline, and the headline of a stream whose tasks return."""

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute  # pa.compute
import pytest
import torch

from memcl.pipeline import loop
from memcl_ops.analytic.ridge import FeatureMap
from memcl_ops.arrow import schema as S
from memcl_ops.arrow.schema import FeatureBound
from memcl_ops.baselines.heads import BlindConfig, NearestMeanHead
from memcl_ops.data.sources import StreamInfo
from memcl_ops.learner import Round
from memcl_ops.learners.features import FeatureLearner
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import method_spec
from memcl_ops.prequential import PREDICTIONS, NearFutureModels, PrequentialConfig, Tally
from memcl_ops.roles.predictor import INTERIM

DIM = 6


def learner(name: str, near_future: int, **method) -> FeatureLearner:
    return FeatureLearner(method_spec(name), MethodConfig(name=name, **method), DIM, near_future=near_future)


def stream_rounds(model: FeatureLearner, rounds: list[list[pa.RecordBatch]], first: int = 0) -> list[pa.Table]:
    """Each round's test-then-train predictions."""
    out = []
    for r, batches in enumerate(rounds[first:], start=first):
        model.begin_round(Round(r, None, None))
        for batch in batches:
            model.observe(batch)
        out.append(model.consolidate()["prequential"])
    return out


def gaussian_rounds(seed: int, rounds: int, per_round: int, rows: int = 8, classes: int = 4) -> list:
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=3.0, size=(classes, DIM))
    out, next_id = [], 0
    for _ in range(rounds):
        batches = []
        for _ in range(per_round):
            y = rng.integers(classes, size=rows)
            batches.append(S.feature_batch(np.arange(next_id, next_id + rows), means[y] + rng.normal(size=(rows, DIM)),
                                           y, np.zeros(rows, np.int64)))
            next_id += rows
        out.append(batches)
    return out


def test_every_batch_is_predicted_with_every_row_before_it_and_near_future_by_the_model_k_batches_back():
    """A head of sums learns each batch as it streams: batch j is predicted by a nearest-mean head refitted by hand
    on the j batches before it, its near-future prediction by the head of the j - k + 1 batches before that one
    (k = 3), and each row carries the number of consolidations published before it (rounds of 2 batches). A
    learner restored mid-stream continues with the same predictions."""
    rounds = gaussian_rounds(0, rounds=7, per_round=2)
    k, per_round = 3, 2
    tables = stream_rounds(learner("simplecil", k), rounds)
    batches = [b for r in rounds for b in r]

    def after(n: int) -> NearestMeanHead:  # the head that has learned the first n batches
        head = NearestMeanHead(DIM)
        for b in batches[:n]:
            head.fit(S.features_to_torch(b), torch.from_numpy(S.labels_to_numpy(b)), None)
        return head

    got = pa.concat_tables(tables)
    assert got.schema == PREDICTIONS and got.num_rows == sum(b.num_rows for b in batches)
    offset = 0
    for j, b in enumerate(batches):
        x = S.features_to_torch(b)
        rows = got.slice(offset, b.num_rows)
        offset += b.num_rows
        np.testing.assert_array_equal(rows.column("prediction").to_numpy(), after(j).predict(x, None))
        assert set(rows.column("model_version").to_pylist()) == {j // per_round}
        np.testing.assert_array_equal(rows.column("near_future").to_numpy(), after(max(j - k + 1, 0)).predict(x, None))
    assert (got.column("prediction").to_numpy() != got.column("near_future").to_numpy()).any()

    first = learner("simplecil", k)
    stream_rounds(first, rounds[:3])
    resumed = learner("simplecil", k)
    resumed.restore(first.state())
    for a, b in zip(stream_rounds(resumed, rounds, first=3), tables[3:], strict=True):
        assert a.equals(b)


@pytest.mark.parametrize("name", ["finetune", "mars-memcl", "derpp"])
def test_a_class_seen_once_is_predicted_from_its_next_batch_on_before_any_consolidation(name):
    """A trained head learns in consolidations; between them the predictor's class prototypes answer for the classes
    the published head cannot name. Over 20 seeded streams of well-separated classes, a class first streamed in a
    round's first batch is named right on most of its rows of the round's second batch, though the head published
    then has never seen it (before its first row nothing can name it)."""
    right = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        means = rng.normal(scale=6.0, size=(4, DIM))

        def batch(first: int, classes: list[int], means=means, rng=rng) -> pa.RecordBatch:
            y = np.repeat(classes, 8)
            return S.feature_batch(np.arange(first, first + len(y)), means[y] + rng.normal(size=(len(y), DIM)), y)

        model = learner(name, 1)
        rounds = stream_rounds(model, [[batch(0, [0, 1]), batch(16, [0, 1])],  # the head learns classes 0 and 1
                                       [batch(32, [2, 3]), batch(48, [0, 2])]])  # 2 and 3 come between versions
        second = rounds[1].slice(16)
        assert set(second.column("model_version").to_pylist()) == {1}
        new = second.filter(pa.compute.equal(second.column(S.LABEL), 2))
        right.append(np.mean(new.column("prediction").to_numpy() == 2))
        first = rounds[1].slice(0, 16)
        assert not np.isin(first.filter(pa.compute.equal(first.column(S.LABEL), 2)).column("prediction"), [2]).any()
    assert np.mean(right) > 0.9


@pytest.mark.parametrize("name", ["finetune", "mars-memcl"])
def test_before_its_first_consolidation_a_trained_head_answers_with_a_ridge_head_where_class_means_fail(name):
    """Until a trained head has learned a class, the predictor's interim head answers for it: by default a ridge
    head of the raw features, which weighs each direction by its spread. Two classes whose means differ along e1
    under noise that moves e1 and e2 together (spread 8 along e1 + e2, 0.3 across): across them the classes lie far
    apart, along e1 they overlap. Over 20 seeded streams, the first round's third batch (no version published yet)
    is predicted above 90 % right; with `method.interim=nearest-mean` it is predicted exactly as the Euclidean
    nearest class mean of the rows before it, right on at most 75 %."""
    ridge, nearest = [], []
    direction = np.zeros(DIM)
    direction[:2] = 1 / np.sqrt(2)
    for seed in range(20):
        rng = np.random.default_rng(seed)

        def batch(first: int, rng=rng) -> pa.RecordBatch:
            y = np.tile([0, 1], 16)
            x = (np.outer(y, np.eye(DIM)[0]) * 2.0 + np.outer(rng.normal(size=len(y)) * 8.0, direction)
                 + rng.normal(scale=0.3, size=(len(y), DIM)))
            return S.feature_batch(np.arange(first, first + len(y)), x, y)

        batches = [batch(0), batch(32), batch(64)]
        third = {interim: stream_rounds(learner(name, 1, interim=interim), [batches])[0].slice(64)
                 for interim in ("ridge", "nearest-mean")}
        assert {v for t in third.values() for v in t.column("model_version").to_pylist()} == {0}
        y = S.labels_to_numpy(batches[2])
        x, seen = np.concatenate([S.features_to_numpy(b) for b in batches[:2]]), np.tile([0, 1], 32)
        means = np.stack([x[seen == c].mean(0) for c in (0, 1)])
        by_hand = ((S.features_to_numpy(batches[2])[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
        np.testing.assert_array_equal(third["nearest-mean"].column("prediction").to_numpy(), by_hand)
        ridge.append(np.mean(third["ridge"].column("prediction").to_numpy() == y))
        nearest.append(np.mean(by_hand == y))
    assert np.mean(ridge) > 0.9 and np.mean(nearest) <= 0.75, (np.mean(ridge), np.mean(nearest))


def test_the_interim_head_takes_every_row_the_gate_lets_through():
    """The interim head sums in exact fixed point: the largest feature it squares exactly is every method's bound,
    so the gate's bound for a trained head (every method's) never lets through a row it cannot sum."""
    bound = FeatureMap(DIM, INTERIM, 0).input_bound()
    assert (bound.max_abs, bound.max_l1) == (FeatureBound().max_abs, FeatureBound().max_l1)


def labelled_in_runs(seed: int, batches: int, run: int, classes: int, rows: int = 10) -> list[pa.RecordBatch]:
    """Batches whose rows all carry one label, the same label for `run` batches in a row, each run's label drawn
    afresh; the features are noise (nothing to learn from the input)."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(batches):
        if j % run == 0:
            label = int(rng.integers(classes))
        out.append(S.feature_batch(np.arange(j * rows, (j + 1) * rows), rng.normal(size=(rows, DIM)),
                                   np.full(rows, label), np.zeros(rows, np.int64)))
    return out


def test_the_blind_baseline_scores_high_on_the_next_batch_and_at_chance_on_the_near_future():
    """Labels in runs of 3 batches over 5 classes: the blind classifier (the last batch's labels) is right on 2 of
    every 3 batches, and near-future accuracy (k = 4, past the runs) is at chance, 1/5, over 40 seeded streams."""
    classes, run = 5, 3
    next_batch, near = [], []
    for seed in range(40):
        batches = labelled_in_runs(seed, 150, run, classes)
        rounds = [batches[a:a + 4] for a in range(0, len(batches), 4)]
        tally = Tally()
        for table in stream_rounds(learner("blind", 4, blind=BlindConfig(window=10)), rounds):
            tally.add(table, window=100)
        report = tally.report(PrequentialConfig(window=100, near_future=4))
        next_batch.append(report["accuracy"])
        near.append(report["near_future_accuracy"])
    chance = 1 / classes
    expected = (run - 1) / run + chance / run  # a run's first batch is right only by chance
    assert np.mean(next_batch) == pytest.approx(expected, abs=0.03)
    assert np.mean(near) == pytest.approx(chance, abs=0.03)
    # the methods that read the input are not fooled: a nearest mean learns nothing from noise either way
    tally = Tally()
    for table in stream_rounds(learner("simplecil", 4), [labelled_in_runs(0, 150, run, classes)[a:a + 4]
                                                         for a in range(0, 150, 4)]):
        tally.add(table, window=100)
    assert tally.accuracy < 0.5 * expected


def test_the_tally_counts_by_hand():
    table = pa.Table.from_pydict({
        S.SAMPLE_ID: [1, 2, 3, 4, 5, 6], S.TASK_ID: [0, 0, 1, 1, None, 1], S.LABEL: [3, 4, None, 5, 6, None],
        "prediction": [3, 1, 2, 5, 6, 0], "score": [1.0] * 6, "near_future": [3, 4, 2, 0, 0, 0],
        "model_version": [0] * 6}, schema=PREDICTIONS)
    tally = Tally()
    tally.add(table, window=2)
    report = tally.report(PrequentialConfig(window=2, near_future=3))
    # labelled rows 1, 2, 4, 5: right 1, 4, 5; near-future right 1, 2
    assert (report["rows"], report["accuracy"], report["near_future_accuracy"]) == (4, 0.75, 0.5)
    assert report["window_accuracy"] == 1.0  # the last two labelled rows (4 and 5) were right
    assert report["per_task"] == {"0": 0.5, "1": 1.0}  # row 5 has no task: counted overall only
    assert report["predicted_unlabelled"] == 2
    tally.add(None, window=2)
    assert [p["rows"] for p in tally.report(PrequentialConfig())["curve"]] == [4, 4]


def info(visits: list[int], tasks: int) -> StreamInfo:
    return StreamInfo("s", "features", [[2 * t, 2 * t + 1] for t in range(tasks)], visits, [1] * len(visits),
                      [1] * tasks, len(visits), None, "f")


def test_the_headline_is_the_model_at_the_end_of_the_stream_when_a_task_returns():
    """Task 0 returns (its labels changed) and is relearned: the headline reads the last row, the first pass the
    row after task 1's first visit; with no return both are the same numbers."""
    acc = np.array([[0.9, np.nan], [0.8, 0.9], [0.95, 0.7]])
    pipe = SimpleNamespace(task_free=False, info=info([0, 1, 0], 2))
    headline = loop.summary(pipe, acc, [], [])
    first = loop.first_pass(pipe.info, acc)
    assert headline["a_last"] == pytest.approx((0.95 + 0.7) / 2) and first["a_last"] == pytest.approx(0.85)
    # from each task's row after its first visit to the end: task 0 0.9 -> 0.95, task 1 0.9 -> 0.7
    assert headline["bwt"] == pytest.approx((0.05 - 0.2) / 2) and first["bwt"] == pytest.approx(-0.1)
    assert headline["forgetting"] == pytest.approx((-0.05 + 0.2) / 2) and first["forgetting"] == pytest.approx(0.1)
    assert headline["a_mean"] == pytest.approx((0.9 + 0.85 + 0.825) / 3)
    once = SimpleNamespace(task_free=False, info=info([0, 1], 2))
    assert loop.summary(once, acc[:2], [], []) == loop.first_pass(once.info, acc[:2])


def test_anytime_cuts_each_visit_into_rounds_that_evaluate_every_task():
    from memcl_ops.rounds import Schedule, plan_rounds

    stream = info([0, 1, 0], 2)
    stream.visit_batches = [5, 2, 3]
    assert plan_rounds(stream, False, 0, steps=3) == [[(0, 0), (0, 1)], [(0, 2), (0, 3)], [(0, 4)], [(1, 0)],
                                                      [(1, 1)], [(2, 0)], [(2, 1)], [(2, 2)]]
    assert plan_rounds(stream, False, 0) == [[(0, i) for i in range(5)], [(1, 0), (1, 1)], [(2, i) for i in range(3)]]
    schedule = Schedule(False, 8, anytime=3)
    assert schedule.due(stream, 0, []) and schedule.tasks([0], 0, 2) == [0, 1]
    assert schedule.test_visit([(1, 0)], []) == 1 and Schedule(False, 3).test_visit([(1, 0)], []) == 0


@pytest.mark.parametrize("k, every", [(1, 1), (2, 1), (5, 1), (5, 3), (4, 7)])
def test_near_future_models_give_the_model_of_k_batches_back_and_keep_no_more_than_they_need(k, every):
    """A model that changes every `every` batches (online: 1): batch t is scored with the model that predicted batch
    t - k + 1 (before the stream's start, the first), across a checkpoint too, and no more than k models are kept."""
    models = NearFutureModels(k)
    current = 0  # the model: how many changes it has seen
    in_effect = []  # per batch, the model that predicted it
    for t in range(40):
        old = models.for_next()
        in_effect.append(current)
        assert (current if old is None else int(old["model"])) == in_effect[max(t - k + 1, 0)], t
        models.predicted()
        if (t + 1) % every == 0:
            models.changing(lambda now=current: {"model": np.array(now)})
            current += 1
        assert len(models.kept) <= k
        if t == 17:
            restored = NearFutureModels(k)
            restored.restore(models.state(lambda m: m), lambda arrays: arrays)
            models = restored
    assert k > 1 or not models.kept
