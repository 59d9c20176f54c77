"""A stream that does not wait (memcl_ops/realtime.py): which batches a learner of a given cost takes at a given
stream rate, the declared costs, and the in-process learner's accounting of what it skipped."""

import numpy as np
import pytest

from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import method_spec
from memcl_ops.realtime import RealtimeConfig, StreamClock, declared_cost, start_clock
from tests.unit.test_prequential import gaussian_rounds, learner


def taken(cost: float, rate: float, batches: int = 12) -> list[int]:
    clock = StreamClock(cost=cost)
    return [p for p in range(batches) if clock.admit(p, rate)]


def test_a_learner_twice_as_slow_as_the_stream_takes_every_other_batch():
    assert taken(1.0, 1.0) == list(range(12))  # keeps up exactly
    assert taken(2.0, 1.0) == list(range(0, 12, 2))
    assert taken(1.0, 2.0) == list(range(0, 12, 2))  # the same ratio, the stream twice as fast
    assert taken(3.0, 1.0) == list(range(0, 12, 3))
    assert taken(2.0, 0.5) == list(range(12))  # a stream half as fast: nothing skipped
    clock = StreamClock(cost=4.0)
    for p in range(12):
        clock.admit(p, 1.0)
    assert (clock.learned_batches, clock.skipped_batches) == (3, 9)


def test_wall_mode_costs_the_last_round_per_batch_learned():
    clock = start_clock(RealtimeConfig("wall", rate=10.0), method_spec("ncm"), MethodConfig(name="ncm"))
    assert clock.cost == 0.0  # nothing measured yet: the first round takes every batch
    clock.measured(2.0, 4)
    assert clock.cost == 0.5
    clock.measured(1.0, 0)  # a round that learned nothing measures nothing
    assert clock.cost == 0.5


def test_declared_costs_count_the_training_passes_over_a_batch():
    mars = MethodConfig(name="mars")
    assert declared_cost(method_spec("mars"), mars) == mars.stage1.optim.epochs + mars.stage2.optim.epochs
    assert declared_cost(method_spec("derpp"), MethodConfig(name="derpp")) == 2 * mars.stage2.optim.epochs
    for name in ("analytic", "slda", "ncm", "blind"):
        assert declared_cost(method_spec(name), MethodConfig(name=name)) == 1.0
    with pytest.raises(ValueError, match="rate"):
        RealtimeConfig("simulated", rate=0.0)


def test_the_in_process_learner_predicts_what_it_skips_and_learns_the_rest():
    rounds = gaussian_rounds(1, rounds=4, per_round=3)
    model = learner("ncm", 2)
    clock = StreamClock(cost=2.0)
    tables = []
    for r, batches in enumerate(rounds):
        model.begin_round(None)
        for j, batch in enumerate(batches):
            (model.observe if clock.admit(3 * r + j, 1.0) else model.watch)(batch)
        tables.append(model.consolidate()["prequential"])
    learned = np.concatenate([t.column("learned").to_numpy() for t in tables])
    ids = np.concatenate([t.column("sample_id").to_numpy() for t in tables])
    assert len(ids) == 12 * 8 and learned.sum() == 6 * 8  # every other batch taken, every batch predicted
    np.testing.assert_array_equal(np.sort(model.roles["stage2"].learned_ids()), np.sort(ids[learned]))
