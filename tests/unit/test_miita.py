"""MIITA's direction memory (write, merge, repair, bytes) and its read side (uncertainty direction, retrieval,
aggregation, gate), on plain tensors."""

import math

import numpy as np
import pytest
import torch

from memcl_ops.miita.directions import (
    Adaptation,
    AdaptConfig,
    DirectionMemory,
    MemoryConfig,
    prototype_bytes,
    uncertainty_direction,
)
from memcl_ops.tensors import normalize

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def unit(v) -> torch.Tensor:
    return normalize(torch.as_tensor(v, dtype=torch.float32))


@pytest.mark.parametrize("seed", range(5))
def test_uncertainty_direction_is_the_normalised_negative_entropy_gradient(seed):
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(16, 50, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=gen))
        head.bias.copy_(torch.randn(50, generator=gen))
    h = torch.randn(4, 16, generator=gen, requires_grad=True)
    log_p = torch.log_softmax(head(h), dim=-1)
    entropy = -(log_p.exp() * log_p).sum()
    (grad,) = torch.autograd.grad(entropy, h)
    expected = normalize(-grad)
    u = uncertainty_direction(head(h).detach(), head.weight.detach())
    assert torch.allclose(u, expected, atol=1e-5)
    # stepping along u lowers the entropy of every row (it is a descent direction)
    with torch.no_grad():
        after = torch.log_softmax(head(h + 1e-3 * u), dim=-1)
        before = torch.log_softmax(head(h), dim=-1)
        assert ((after.exp() * after).sum(-1) > (before.exp() * before).sum(-1)).all()


def random_stream(seed: int, hidden: int, n: int):
    """Writes drawn around a few direction and key clusters, so merges, anchor adds and new prototypes all occur."""
    gen = torch.Generator().manual_seed(seed)
    d_centres = torch.randn(6, hidden, generator=gen)
    k_centres = torch.randn(5, hidden, generator=gen)
    for _ in range(n):
        d = d_centres[torch.randint(6, (1,), generator=gen)] + 0.6 * torch.randn(hidden, generator=gen)
        k = k_centres[torch.randint(5, (1,), generator=gen)] + 0.4 * torch.randn(hidden, generator=gen)
        yield k.squeeze(0), d.squeeze(0) * float(torch.rand(1, generator=gen) * 3)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_budget_holds_after_every_write_and_repair_keeps_a_prototype(dtype):
    hidden, writes = 24, 200
    per = prototype_bytes(hidden, hidden, 1, dtype)
    repaired = 0
    for seed in range(10):
        budget = per + int(np.random.default_rng(seed).integers(0, 12 * per))  # from one prototype to ~13
        memory = DirectionMemory(hidden, hidden, MemoryConfig(budget_bytes=budget, storage_dtype=dtype))
        for i, (k, r) in enumerate(random_stream(seed, hidden, writes)):
            memory.write(k, r)
            assert memory.nbytes() <= budget, (seed, i)
            assert len(memory) >= 1 and all(len(a) >= 1 for a in memory.anchors)
            # the byte count is the [R] formula at the storage dtype
            assert memory.nbytes() == sum(prototype_bytes(hidden, hidden, len(a), dtype) for a in memory.anchors)
            # merges keep every experience counted: Σ n_j is the number of writes so far
            assert sum(memory.counts) == i + 1
        repaired += memory.repairs
        assert all(d.dtype == memory.dtype for d in memory.directions)
    assert repaired > 50  # the budgets were tight enough for repair to do the work


def test_smallest_budget_keeps_exactly_one_prototype_with_one_anchor():
    hidden = 8
    memory = DirectionMemory(hidden, hidden, MemoryConfig(budget_bytes=prototype_bytes(hidden, hidden, 1)))
    for k, r in random_stream(3, hidden, 50):
        memory.write(k, r)
        assert len(memory) == 1 and memory.num_anchors == 1
    assert memory.counts == [50]


def test_write_merges_by_direction_not_by_key():
    memory = DirectionMemory(4, 4, MemoryConfig(budget_bytes=10_000))
    d, key_a, key_b = [1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]
    assert memory.write(torch.tensor(key_a), torch.tensor(d)).action == "new"
    # another context with the same correction: merged, and its key becomes a second anchor
    result = memory.write(torch.tensor(key_b), 5 * torch.tensor(d))
    assert (result.action, result.anchor_added, len(memory), memory.num_anchors) == ("merged", True, 1, 2)
    # a near-identical key is absorbed into its anchor instead of added
    result = memory.write(torch.tensor([0, 1.0, 0.05, 0]), torch.tensor(d))
    assert (result.anchor_added, memory.num_anchors, memory.counts) == (False, 2, [3])
    # the same context with a different correction: a new prototype
    assert memory.write(torch.tensor(key_a), torch.tensor([0, 0, 0, 1.0])).action == "new"
    assert len(memory) == 2


def test_direction_merge_is_the_count_weighted_spherical_mean():
    memory = DirectionMemory(2, 2, MemoryConfig(budget_bytes=10_000, storage_dtype="float32", direction_merge=0.0))
    key = torch.tensor([1.0, 0.0])
    for _ in range(3):
        memory.write(key, torch.tensor([1.0, 0.0]))
    memory.write(key, torch.tensor([0.0, 1.0]))
    assert torch.allclose(memory.directions[0], unit([3.0, 1.0]), atol=1e-6)
    assert memory.counts == [4]


def test_skips_corrections_below_the_minimum_norm():
    memory = DirectionMemory(2, 2, MemoryConfig(budget_bytes=10_000, min_correction_norm=0.5))
    assert memory.write(torch.tensor([1.0, 0]), torch.tensor([0.1, 0.1])).action == "skipped"
    assert len(memory) == 0 and memory.writes == 1


def two_prototype_memory(anchor_cos: float, direction_cos: float) -> DirectionMemory:
    """Prototype 0 holds two anchors at cosine `anchor_cos`; prototypes 0 and 1 are at `direction_cos`; the budget
    is one prototype-anchor short, so exactly one repair runs."""
    hidden = 3
    budget = 2 * prototype_bytes(hidden, hidden, 1) + hidden * 2 - 1  # 3 anchors do not fit
    memory = DirectionMemory(hidden, hidden, MemoryConfig(budget_bytes=budget, direction_merge=0.99, new_anchor=0.99))
    angle = math.acos(anchor_cos)
    memory.write(torch.tensor([1.0, 0, 0]), torch.tensor([1.0, 0, 0]))
    d_angle = math.acos(direction_cos)
    memory.write(torch.tensor([0, 0, 1.0]), torch.tensor([math.cos(d_angle), math.sin(d_angle), 0]))
    memory.write(torch.tensor([math.cos(angle), math.sin(angle), 0]), torch.tensor([1.0, 0, 0]))
    return memory


def test_repair_takes_the_cheapest_merge():
    # anchor merge costs 1 − 0.2 = 0.8 < prototype merge 2·(1 − 0.5) = 1.0: the anchors merge
    memory = two_prototype_memory(anchor_cos=0.2, direction_cos=0.5)
    assert (len(memory), memory.num_anchors, memory.repairs) == (2, 2, 1)
    assert torch.allclose(memory.anchors[0][0].float(), unit([1 + 0.2, math.sin(math.acos(0.2)), 0]), atol=1e-3)
    # anchor merge costs 1 − (−0.5) = 1.5 > 1.0: the prototypes merge (count-weighted, anchors unioned)
    memory = two_prototype_memory(anchor_cos=-0.5, direction_cos=0.5)
    assert (len(memory), memory.num_anchors, memory.counts, memory.repairs) == (1, 3, [3], 1)
    expected = unit(2 * torch.tensor([1.0, 0, 0]) + torch.tensor([0.5, math.sin(math.acos(0.5)), 0]))
    assert torch.allclose(memory.directions[0].float(), expected, atol=1e-3)


def test_state_round_trips_and_the_restored_memory_continues_identically():
    config = MemoryConfig(budget_bytes=6 * prototype_bytes(16, 16, 1))
    a, b = DirectionMemory(16, 16, config), None
    stream = list(random_stream(7, 16, 120))
    for k, r in stream[:60]:
        a.write(k, r)
    b = DirectionMemory.from_state(a.state(), config)
    assert b.nbytes() == a.nbytes() and b.counts == a.counts
    for k, r in stream[60:]:
        a.write(k, r)
        b.write(k, r)
    for x, y in zip(a.state().values(), b.state().values()):
        np.testing.assert_array_equal(x, y)


def test_bad_configs_and_inputs_are_refused():
    with pytest.raises(ValueError, match="cannot hold one prototype"):
        DirectionMemory(576, 576, MemoryConfig(budget_bytes=1000))
    with pytest.raises(ValueError, match="storage_dtype"):
        MemoryConfig(storage_dtype="int8")
    with pytest.raises(ValueError, match="cosine threshold"):
        MemoryConfig(direction_merge=1.5)
    memory = DirectionMemory(4, 4)
    with pytest.raises(ValueError, match="key has 3 values"):
        memory.write(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="correction contains NaN"):
        memory.write(torch.ones(4), torch.tensor([1.0, float("nan"), 0, 0]))


def orthogonal_memory(hidden: int = 8) -> DirectionMemory:
    """Prototype j: direction e_j, anchors e_{4+j} and a second, unrelated anchor."""
    memory = DirectionMemory(hidden, hidden, MemoryConfig(budget_bytes=10_000, storage_dtype="float32"))
    eye = torch.eye(hidden)
    for j in range(3):
        memory.write(eye[4 + j], eye[j])
        memory.write(-eye[4 + j], eye[j])
    return memory


def test_relevance_is_the_best_anchor_per_prototype():
    memory = orthogonal_memory()
    eye = torch.eye(8)
    adaptation = Adaptation(memory, torch.randn(20, 8))
    r = adaptation.relevance(torch.stack([eye[5], -eye[6], eye[0]]))
    assert torch.allclose(r, torch.tensor([[0.0, 1, 0], [0, 0, 1], [0, 0, 0]]), atol=1e-6)


def test_step_moves_along_the_relevant_prototype_when_uncertain_and_relevant():
    memory = orthogonal_memory()
    eye = torch.eye(8)
    weight = torch.randn(20, 8, generator=torch.Generator().manual_seed(0))
    config = AdaptConfig(uncertainty_weight=0.0, step=0.1)
    step = Adaptation(memory, weight, config)(eye[5].unsqueeze(0))  # relevant to prototype 1 only
    h = torch.randn(1, 8)
    flat_logits = torch.zeros(1, 20)  # maximal entropy: the entropy gate is open
    edited = step(h, flat_logits, 0)
    delta = (edited - h) / (config.step * h.norm())
    gate = float(step.last_gate)
    assert gate > 0.99
    # the top-1 relevance wins the softmax at τ_w = 0.05 (weights e^20 : 1 : 1)
    assert torch.allclose(delta[0], gate * eye[1], atol=1e-6)
    # a confident prediction closes the entropy gate, an irrelevant query closes the relevance gate
    peaked = torch.zeros(1, 20)
    peaked[0, 3] = 30.0
    step(h, peaked, 0)  # entropy ≈ 0: the entropy factor bottoms out at σ(−κ_H·θ_H) = σ(−1.5)
    assert float(step.last_gate) == pytest.approx(float(torch.sigmoid(torch.tensor(-1.5)) * torch.sigmoid(
        torch.tensor(20 * (1 - 0.5)))), rel=1e-5)
    far = Adaptation(memory, weight, config)(eye[3].unsqueeze(0))  # no anchor near: r = 0 < θ_r
    far(h, flat_logits, 0)
    assert float(far.last_gate) < 1e-4


def test_disagreeing_neighbours_shrink_the_correction():
    memory = DirectionMemory(4, 4, MemoryConfig(budget_bytes=10_000, storage_dtype="float32"))
    key = torch.tensor([1.0, 0, 0, 0])
    memory.write(key, torch.tensor([0, 1.0, 0, 0]))
    memory.write(key, torch.tensor([0, -1.0, 0, 0]))  # same relevance, opposite directions
    step = Adaptation(memory, torch.randn(10, 4), AdaptConfig(uncertainty_weight=0.0, top_k=3))(key.unsqueeze(0))
    delta, _ = step.correction(torch.zeros(1, 10))
    assert float(delta.norm()) < 1e-6


def test_empty_memory_leaves_the_state_unchanged():
    memory = DirectionMemory(4, 4)
    step = Adaptation(memory, torch.randn(10, 4))(torch.randn(2, 4))
    h = torch.randn(2, 4)
    assert torch.equal(step(h, torch.zeros(2, 10), 0), h)
