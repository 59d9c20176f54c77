"""The stream's clock (memcl_ops/realtime.py), the consolidation buffer (memcl_ops/buffer.py) and the declared
costs (memcl_ops/costs.py): when a consolidation starts and is published, which rows wait for it and which the
buffer lets go."""

import numpy as np
import pytest

from memcl_ops.buffer import BufferConfig, ConsolidationBuffer
from memcl_ops.costs import consolidation_cost
from memcl_ops.method_config import MethodConfig
from memcl_ops.methods import method_spec
from memcl_ops.realtime import RealtimeConfig, StreamClock


def test_a_consolidation_is_published_its_cost_after_it_starts_and_the_next_waits_for_the_trainers():
    clock = StreamClock.start(RealtimeConfig("simulated", rate=2.0), cost=3.0, batch_rows=10)
    assert clock.arrival(4) == 2.0  # two batches per pass
    clock.due += 1
    clock.begin(now=2.0, rows=20)  # two batches of rows at 3 passes each: busy 6 passes
    assert clock.due == 0 and clock.job["publish_at"] == 8.0
    assert not clock.publishes_by(7.5) and clock.publishes_by(8.0)
    clock.end(8.0)
    assert (clock.free_at, clock.busy, clock.published) == (8.0, 6.0, 1)
    clock.begin(now=5.0, rows=5)  # due since 5.0, but the trainers were free only at 8.0
    assert clock.job["started"] == 8.0 and clock.job["publish_at"] == 9.5


def test_a_stream_that_waits_publishes_each_consolidation_when_it_starts():
    clock = StreamClock.start(RealtimeConfig(), cost=11.0, batch_rows=256)
    assert clock.cost == 0.0 and clock.waits
    clock.begin(now=clock.arrival(7), rows=10_000)
    assert clock.publishes_by(clock.arrival(7))


def test_wall_mode_publishes_when_the_trainers_are_done_not_at_a_declared_time():
    clock = StreamClock.start(RealtimeConfig("wall", rate=5.0, cost=4.0), cost=1.0, batch_rows=8)
    clock.begin(now=3.0, rows=80)
    assert clock.job["publish_at"] is None and not clock.publishes_by(1e9)
    clock.end(now=7.0)
    assert clock.free_at == 7.0 and clock.busy == 4.0


def test_declared_costs_count_the_trainers_passes_over_a_consolidated_batch():
    mars = MethodConfig(name="mars-memcl")
    assert consolidation_cost(method_spec("mars-memcl"), mars) == mars.stage1.optim.epochs + mars.stage2.optim.epochs
    assert consolidation_cost(method_spec("derpp"), MethodConfig(name="derpp")) == 2 * mars.stage2.optim.epochs
    assert consolidation_cost(method_spec("mars-analytic"), MethodConfig(name="mars-analytic")) == \
        mars.stage1.optim.epochs  # the head settles in place; stage 1 trains in the background
    for name in ("analytic", "slda", "ncm", "blind"):  # each batch learned as it streams
        assert consolidation_cost(method_spec(name), MethodConfig(name=name)) == 0.0
    with pytest.raises(ValueError, match="rate"):
        RealtimeConfig("simulated", rate=0.0)


def _buffer(rows: int, policy: str = "class-balanced", dim: int = 4) -> ConsolidationBuffer:
    return ConsolidationBuffer(dim, BufferConfig(rows * (4 * dim + 32), policy), seed=3)


def _add(buffer: ConsolidationBuffer, labels: list[int], first: int, round_index: int = 0) -> None:
    n = len(labels)
    buffer.add(np.arange(first, first + n), np.full((n, buffer.feature_dim), float(first)), np.array(labels),
               np.zeros(n), first, round_index)


def test_past_its_budget_the_class_balanced_buffer_lets_the_fullest_classes_oldest_rows_go():
    buffer = _buffer(rows=6)
    _add(buffer, [0, 0, 0, 0, 1, 1], first=0)
    _add(buffer, [2, 2], first=6)  # two rows over: both from class 0, its oldest
    assert buffer.let_go == 2 and len(buffer) == 6
    assert sorted(buffer.ids[buffer.labels == 0].tolist()) == [2, 3]
    assert sorted(np.unique(buffer.labels, return_counts=True)[1].tolist()) == [2, 2, 2]


def test_the_reservoir_buffer_draws_what_goes_by_the_arrival_it_is_at():
    kept = []
    for _ in range(2):  # a replay lets the same rows go
        buffer = _buffer(rows=5, policy="reservoir")
        _add(buffer, [0] * 4, first=0)
        _add(buffer, [1] * 4, first=4)
        kept.append(buffer.ids.tolist())
        assert buffer.let_go == 3 and len(buffer) == 5
    assert kept[0] == kept[1]


def test_a_consolidation_takes_the_newest_ended_round_and_after_the_stream_the_oldest_left():
    """A lagging trainer learns the freshest rows at the cost of one round; the rounds it missed wait for the
    stream's end, then go oldest first; the open round is never taken."""
    buffer = _buffer(rows=100)
    _add(buffer, [0, 1], first=0, round_index=0)
    _add(buffer, [1, 0], first=2, round_index=1)
    _add(buffer, [2], first=4, round_index=2)
    assert buffer.due(open_round=2) == 4
    block = buffer.take(open_round=2)
    assert block.column("sample_id").to_pylist() == [2, 3]
    assert block.column("arrival").to_pylist() == [2, 3]
    assert buffer.due(open_round=2) == 2 and buffer.take(open_round=3).column("sample_id").to_pylist() == [4]
    state = buffer.state()
    again = _buffer(rows=100)
    again.restore(state)
    _add(again, [0], first=5, round_index=3)
    assert again.take(open_round=5, newest=False).column("sample_id").to_pylist() == [0, 1]
    assert again.take(open_round=5, newest=False).column("sample_id").to_pylist() == [5]
    assert again.take(open_round=5, newest=False) is None and len(again) == 0


def test_a_stream_set_to_off_in_yaml_waits():
    """YAML 1.1 reads `mode: off` (and `--set stream.realtime.mode=off`) as false: it still means the stream waits."""
    from memcl.pipeline.config import load_config

    assert load_config(overrides={"stream.realtime.mode": False}).stream.realtime.mode == "off"


def test_the_learned_sample_ids_keep_as_few_ranges_as_the_stream_has_runs():
    """Exactly-once accounting that does not grow with the stream: 10,000 batches of consecutive ids are one range;
    a repeated id counts in `added` and once in the set; ids out of order merge into the ranges they join."""
    from memcl_ops.tensors import SampleIds

    ids = SampleIds()
    for start in range(0, 2_560_000, 256):
        ids.add(np.arange(start, start + 256))
    assert ids.ranges.tolist() == [[0, 2_560_000]] and len(ids) == ids.added == 2_560_000
    ids.add(np.array([7, 7, 3_000_000]))
    assert ids.added == 2_560_003 and len(ids) == 2_560_001 and len(ids.ranges) == 2
    rng = np.random.default_rng(0)
    shuffled = SampleIds()
    for part in np.array_split(rng.permutation(1000), 37):
        shuffled.add(part)
    assert shuffled.ranges.tolist() == [[0, 1000]]
    again = SampleIds()
    again.restore(ids.state())
    assert again.ranges.tolist() == ids.ranges.tolist() and again.added == ids.added
