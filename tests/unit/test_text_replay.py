"""The byte-budgeted text replay buffer (the baseline beside MIITA, docs/methods.md)."""

import numpy as np
import pytest
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.baselines.text_replay import ReplayConfig, TextReplayBuffer, text_bytes
from memcl_ops.data.lm_tasks import LMStreamSpec, build_stream
from memcl_ops.learners import build_learner
from memcl_ops.method_config import LMMethodConfig
from memcl_ops.miita.store import HybridConfig
from memcl_ops.models.causal_lm import LMSpec


def examples(seed: int, tasks: int = 3, per_task: int = 40):
    rng = np.random.default_rng(seed)
    for t in range(tasks):
        for i in range(per_task):
            prompt = f"task {t} question {i} " + "x" * int(rng.integers(5, 60)) + " é"  # é: 2 UTF-8 bytes
            yield prompt, f"answer {i}", t, torch.from_numpy(rng.normal(size=8)).float()


@pytest.mark.parametrize("seed", range(5))
def test_budget_holds_after_every_add_and_tasks_stay_balanced(seed):
    budget = 1500 + 300 * seed
    buffer = TextReplayBuffer(8, ReplayConfig(budget_bytes=budget, seed=seed))
    for prompt, answer, task, key in examples(seed):
        buffer.add(prompt, answer, task, key)
        assert buffer.nbytes() <= budget
        assert buffer.nbytes() == sum(len(p.encode()) + len(a.encode()) for p, a in zip(buffer.prompts, buffer.answers))
    per_task = [sum(text_bytes(p, a) for p, a, t in zip(buffer.prompts, buffer.answers, buffer.tasks) if t == k)
                for k in range(3)]
    largest = max(text_bytes(p, a) for p, a, _, _ in examples(seed))
    assert max(per_task) - min(per_task) <= 2 * largest, per_task  # eviction takes from the fullest task
    assert buffer.seen == 120 and buffer.evicted == 120 - len(buffer)


def test_an_example_larger_than_the_budget_is_not_stored():
    buffer = TextReplayBuffer(2, ReplayConfig(budget_bytes=10))
    buffer.add("a long prompt", "yes", 0, torch.ones(2))
    assert len(buffer) == 0 and buffer.too_large == 1


def test_nearest_returns_the_most_similar_examples_nearest_last():
    buffer = TextReplayBuffer(2, ReplayConfig(budget_bytes=1000, demonstrations=2))
    for name, angle in (("a", 0.0), ("b", 0.5), ("c", 1.5), ("d", 3.0)):
        buffer.add(name, name.upper(), 0, torch.tensor([np.cos(angle), np.sin(angle)]))
    picked = buffer.nearest(torch.tensor([[1.0, 0.1], [-1.0, 0.0]]))
    assert picked == [[("b", "B"), ("a", "A")], [("c", "C"), ("d", "D")]]
    assert TextReplayBuffer(2).nearest(torch.ones(3, 2)) == [[], [], []]


def test_state_round_trip_continues_identically():
    config = ReplayConfig(budget_bytes=1200, seed=4)
    a = TextReplayBuffer(8, config)
    stream = list(examples(1))
    for item in stream[:60]:
        a.add(*item)
    b = TextReplayBuffer(8, config)
    b.restore(a.state())
    for item in stream[60:]:
        a.add(*item)
        b.add(*item)
    assert (a.prompts, a.tasks, a.evicted) == (b.prompts, b.tasks, b.evicted)
    assert torch.equal(a.keys, b.keys)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        ReplayConfig(budget_bytes=0)
    with pytest.raises(ValueError, match="key has 3 values"):
        TextReplayBuffer(2).add("p", "a", 0, torch.ones(3))


def test_limit_evicts_until_the_new_budget_holds_and_refuses_what_no_longer_fits():
    buffer = TextReplayBuffer(8, ReplayConfig(budget_bytes=2000, seed=1))
    for prompt, answer, task, key in examples(1):
        buffer.add(prompt, answer, task, key)
    assert buffer.nbytes() > 1000
    buffer.limit(1000)
    assert 0 < buffer.nbytes() <= 1000
    buffer.limit(5000)  # never above the configured budget
    assert buffer.budget == 2000
    buffer.limit(-3)
    assert len(buffer) == 0
    buffer.add("p", "a", 0, torch.ones(8))
    assert len(buffer) == 0 and buffer.too_large == 1
    restored = TextReplayBuffer(8, ReplayConfig(budget_bytes=2000, seed=1))
    restored.restore(buffer.state())
    assert restored.budget == 0


def _text_pairs(tasks: int, per_task: int):
    built = build_stream(LMStreamSpec(tasks=("word-code", "last-letter")[:tasks], train_per_task=per_task,
                                      test_per_task=1))
    ids = 0
    for t, task in enumerate(built):
        for start in range(0, per_task, 4):
            chunk = task.train[start:start + 4]
            yield S.text_pair_batch(np.arange(ids, ids + len(chunk)), [p.prompt for p in chunk],
                                    [p.answer for p in chunk], task_ids=np.full(len(chunk), t))
            ids += len(chunk)


@pytest.mark.parametrize("budget", [160, 700, 65536])
def test_miita_replay_demonstrations_hold_what_the_prototypes_leave(budget):
    """Prototypes first: the prototypes are exactly `miita`'s at the same budget, and after every write the
    demonstrations may hold what they leave, so the two stay within the budget together; a budget that holds
    everything keeps every example as a demonstration too."""
    def learner(name):
        return build_learner(name, LMMethodConfig(), lm=LMSpec(name="tiny:llama"), budget=budget, max_new_tokens=2)

    both, alone = learner("miita-replay"), learner("miita")
    seen = 0
    for batch in _text_pairs(2, 8):
        both.observe(batch)
        alone.observe(batch)
        seen += batch.num_rows
        used = both.memory_bytes()
        assert used["prototypes"] + used["replay_text"] <= budget, used
        assert both.roles["memory"].stores["text"].replay.budget == budget - used["prototypes"]
        for key, value in alone.roles["memory"].stores["text"].prototypes.state().items():
            np.testing.assert_array_equal(both.roles["memory"].stores["text"].prototypes.state()[key], value)
    shown = len(both.roles["memory"].stores["text"].replay)
    assert (shown == seen) == (budget == 65536), shown


def test_miita_replay_with_a_fixed_share_keeps_each_store_in_its_part():
    budget = 700
    config = LMMethodConfig(hybrid=HybridConfig(split="share", direction_share=0.25))
    learner = build_learner("miita-replay", config, lm=LMSpec(name="tiny:llama"), budget=budget, max_new_tokens=2)
    for batch in _text_pairs(2, 8):
        learner.observe(batch)
        used = learner.memory_bytes()
        assert used["prototypes"] <= 175 and used["replay_text"] <= 525, used
        assert learner.roles["memory"].stores["text"].replay.budget == 525  # the fixed part
    assert len(learner.roles["memory"].stores["text"].replay) > 0
