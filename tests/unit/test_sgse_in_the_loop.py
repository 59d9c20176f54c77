"""SGSE's two guarantees with the router and DCDA stage 1 in the loop (docs/methods.md, "SGSE"): over 20 seeded
stationary streams, each run by the in-process learner of a MARS method whose stage 1 retrains the router after
every task, the false-expansion rate per test is at most α (+ 3 binomial standard errors) and the final slot count
is within S_0 + N_T + αM on average. The stream's start is its one novel event (N_T = 1: nothing covers it yet),
so every expansion after the first test is false. For the paper's signal (`mars`: stage 1 trains W_q, keys and
affines for its 20 epochs) and for memcl's default (`mars-memcl`: the reference signal)."""

import itertools

import numpy as np
import pytest
import torch

from memcl.pipeline.config import load_config
from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round
from memcl_ops.learners import build_learner
from memcl_ops.methods import method_spec

ALPHA, STREAMS, TASKS, ROWS, BATCH, DIM, CLASSES, SLOTS = 0.05, 20, 6, 200, 100, 16, 4, 8


@pytest.fixture
def one_thread():
    """One torch thread: the small minibatches gain nothing from more on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def stationary_stream(method: str, seed: int) -> tuple[int, int, int, bool]:
    """(tests, expansions, final slots, whether stage 1 moved the router) of one stream: TASKS visits of the same
    mixture of CLASSES classes, consolidated (stage 1, stage 2) after each."""
    config = load_config(overrides={"method.name": method, "method.router.initial_slots": SLOTS,
                                    "method.stage2.optim.epochs": 1}).method
    rng = np.random.default_rng([seed, 57])
    means = rng.normal(scale=3.0, size=(CLASSES, DIM))
    learner = build_learner(method, config, seed=seed, feature_dim=DIM)
    keys = []
    for task in range(TASKS):
        learner.begin_round(Round(task, 0, tuple(range(CLASSES))))
        labels = rng.integers(CLASSES, size=ROWS)
        rows = (means[labels] + rng.normal(size=(ROWS, DIM))).astype(np.float32)
        for a in range(0, ROWS, BATCH):
            ids = np.arange(task * ROWS + a, task * ROWS + a + BATCH)
            learner.observe(S.feature_batch(ids, rows[a:a + BATCH], labels[a:a + BATCH], np.zeros(BATCH, np.int64)))
        learner.consolidate()
        keys.append(learner.roles["memory"].state()["slots.router.keys"][:SLOTS].copy())
    counters = learner.roles["monitor"].counters()
    moved = all(not np.allclose(a, b) for a, b in itertools.pairwise(keys))
    return counters["tests"], counters["expansions"], learner.flow.memory_report()["num_slots"], moved


@pytest.mark.parametrize("method, signal", [("mars", "paper"), ("mars-memcl", "reference")])
def test_false_expansions_and_the_slot_bound_hold_with_stage1_retraining_the_router(one_thread, method, signal):
    assert method_spec(method).resolve(load_config(overrides={"method.name": method}).method).sgse.signal == signal
    runs = [stationary_stream(method, seed) for seed in range(STREAMS)]
    assert all(moved for *_, moved in runs)  # stage 1 changed the keys after every task: the router was in the loop
    tests = sum(t - 1 for t, *_ in runs)  # after each stream's first test
    false = sum(max(e - 1, 0) for _, e, *_ in runs)
    assert tests >= 1000
    assert false / tests <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / tests), (false, tests)
    excess = [slots - (SLOTS + 1 + ALPHA * t) for t, _, slots, _ in runs]  # S_T - (S_0 + N_T + αM), per stream
    assert np.mean(excess) <= 0, excess
