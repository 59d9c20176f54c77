"""The TaskKnowledgeBank: top-K retention with LRU eviction, the restore / warm / fresh retrieval rule, bytes and
exact state round-trips."""

from functools import cache

import numpy as np
import pytest
import torch

from memcl_ops.models.lowrank import CompressionConfig, compress
from memcl_ops.nsr.task_bank import BankConfig, BankEntry, TaskKnowledgeBank, normalize

DIM = 16
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices (tests/conftest.py)


@cache
def deltas_of(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {f"site{i}": compress(torch.randn(12, 8, generator=gen), torch.randn(8, 10, generator=gen))
            for i in range(2)}


def entry(task: int, key: np.ndarray, seed: int = 0) -> BankEntry:
    deltas = deltas_of(seed)
    head = {"weight": np.ones((2, DIM), np.float32), "bias": np.zeros(2, np.float32)}
    return BankEntry(task, normalize(key), deltas, head, accuracy=0.5)


def unit(rng: np.random.Generator) -> np.ndarray:
    return normalize(rng.normal(size=DIM))


def with_cosine(key: np.ndarray, cos: float, rng: np.random.Generator) -> np.ndarray:
    """A unit vector at exactly cosine `cos` to unit vector `key`."""
    other = rng.normal(size=DIM)
    other -= (other @ key) * key
    other /= np.linalg.norm(other)
    return (cos * key + np.sqrt(1 - cos**2) * other).astype(np.float32)


def test_retention_never_exceeds_capacity_over_random_streams():
    for seed in range(50):
        rng = np.random.default_rng(seed)
        capacity = int(rng.integers(1, 6))
        bank = TaskKnowledgeBank(BankConfig(capacity=capacity, eviction=["lru", "least_used"][seed % 2]))
        keys = {t: unit(rng) for t in range(12)}
        for _ in range(40):
            task = int(rng.integers(0, 12))
            bank.retrieve(keys[task])
            evicted = bank.store(entry(task, keys[task]))
            assert len(bank) <= capacity
            assert task in bank.entries and task not in evicted


def test_lru_evicts_the_least_recently_used_entry():
    rng = np.random.default_rng(0)
    keys = [unit(rng) for _ in range(4)]
    bank = TaskKnowledgeBank(BankConfig(capacity=3, tau_related=0.99, tau_same=0.995))
    for t in range(3):
        bank.retrieve(keys[t])
        bank.store(entry(t, keys[t]))
    assert bank.retrieve(keys[0]).kind == "restore"  # task 0 used again: task 1 is now the oldest use
    bank.retrieve(keys[3])
    assert bank.store(entry(3, keys[3])) == [1]
    assert sorted(bank.entries) == [0, 2, 3]


def test_least_used_evicts_the_entry_retrieved_least_often():
    rng = np.random.default_rng(1)
    keys = [unit(rng) for _ in range(4)]
    bank = TaskKnowledgeBank(BankConfig(capacity=3, eviction="least_used", tau_related=0.99, tau_same=0.995))
    for t in range(3):
        bank.retrieve(keys[t])
        bank.store(entry(t, keys[t]))
    for t in (0, 0, 2, 1, 1):
        bank.retrieve(keys[t])
    bank.retrieve(keys[3])
    assert bank.store(entry(3, keys[3])) == [2]  # used once; 0 and 1 twice (most recent use does not save it)


def test_retrieval_rule_restore_warm_fresh():
    rng = np.random.default_rng(2)
    cfg = BankConfig(tau_same=0.95, tau_related=0.5, top_k=2, mix_temperature=0.1)
    bank = TaskKnowledgeBank(cfg)
    base = unit(rng)
    for t, cos in enumerate([0.97, 0.8, 0.6, 0.3]):
        bank.store(entry(t, with_cosine(base, cos, rng), seed=t))
    r = bank.retrieve(base)
    assert (r.kind, r.tasks, r.weights) == ("restore", [0], [1.0])
    assert r.similarities[0] == pytest.approx(0.97, abs=1e-5)

    del bank.entries[0]
    r = bank.retrieve(base)
    assert r.kind == "warm" and r.tasks == [1, 2]  # top-2 above τ_rel, best first
    w = np.exp(np.array([0.8, 0.6]) / 0.1)
    np.testing.assert_allclose(r.weights, w / w.sum(), rtol=1e-4)

    del bank.entries[1], bank.entries[2]
    r = bank.retrieve(base)
    assert r.kind == "fresh" and r.tasks == [] and r.similarities[3] == pytest.approx(0.3, abs=1e-5)
    assert TaskKnowledgeBank(cfg).retrieve(base).kind == "fresh"  # empty bank


def test_retrieval_counts_as_a_use_of_the_returned_entries():
    rng = np.random.default_rng(3)
    key = unit(rng)
    bank = TaskKnowledgeBank()
    bank.store(entry(7, key))
    bank.retrieve(with_cosine(key, 0.1, rng))  # fresh: no use
    assert bank.entries[7].use_count == 0
    bank.retrieve(key)
    assert bank.entries[7].use_count == 1 and bank.entries[7].last_used == bank.clock == 2


def test_warm_start_factors_are_the_weighted_mix():
    rng = np.random.default_rng(4)
    bank = TaskKnowledgeBank(BankConfig(top_k=3, tau_same=0.99))
    base = unit(rng)
    for t, cos in enumerate([0.9, 0.7]):
        bank.store(entry(t, with_cosine(base, cos, rng), seed=t))
    r = bank.retrieve(base)
    mix = bank.warm_start(r, rank=8)
    for site in ("site0", "site1"):
        expected = sum(w * bank.entries[t].deltas[site].dense() for t, w in zip(r.tasks, r.weights))
        b, a = mix[site]
        torch.testing.assert_close(torch.from_numpy(b @ a), expected, rtol=1e-4, atol=1e-5)


def test_bytes_count_key_factors_and_head_at_their_dtypes():
    e = entry(0, np.ones(DIM))
    k = e.deltas["site0"].rank
    assert k == 4  # random Gaussian factors spread energy: the cap binds
    assert e.nbytes == DIM * 4 + 2 * (12 + 10) * k * 2 + (2 * DIM + 2) * 4
    bank = TaskKnowledgeBank()
    bank.store(e)
    bank.store(entry(1, -np.ones(DIM)))
    assert bank.nbytes() == 2 * e.nbytes


def test_state_round_trips_exactly():
    rng = np.random.default_rng(5)
    bank = TaskKnowledgeBank(BankConfig(capacity=2, compression=CompressionConfig(max_rank=3)))
    keys = [unit(rng) for _ in range(3)]
    for t in range(3):
        bank.retrieve(keys[t])
        bank.store(entry(t, keys[t], seed=t))
    copy = TaskKnowledgeBank(bank.config)
    copy.restore({k: np.array(v) for k, v in bank.state().items()})
    assert copy.summary() == bank.summary() and copy.clock == bank.clock and copy.evicted == bank.evicted == [0]
    for t, e in bank.entries.items():
        c = copy.entries[t]
        np.testing.assert_array_equal(c.key, e.key)
        for site, d in e.deltas.items():
            assert c.deltas[site].B.dtype == np.float16
            np.testing.assert_array_equal(c.deltas[site].B, d.B)
            np.testing.assert_array_equal(c.deltas[site].A, d.A)
        np.testing.assert_array_equal(c.head["weight"], e.head["weight"])


def test_bad_config_and_keys_are_refused():
    with pytest.raises(ValueError, match="tau_related <= tau_same"):
        BankConfig(tau_same=0.4, tau_related=0.5)
    with pytest.raises(ValueError, match="capacity"):
        BankConfig(capacity=0)
    with pytest.raises(ValueError, match="non-finite"):
        TaskKnowledgeBank().retrieve(np.full(DIM, np.nan))
