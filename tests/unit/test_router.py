import itertools

import numpy as np
import pytest
import torch

from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.mars.sgse import Expansion
from memcl_ops.mars.slots import SlotMemory
from memcl_ops.tensors import layer_norm, normalize


def _router(d=16, slots=8, seed=0):
    return SlotRouter(d, RouterConfig(initial_slots=slots), seed=seed)


def test_identity_at_init_and_probabilities():
    router = _router()
    h = torch.randn(32, 16) * 3 + 1
    out = router(h)
    torch.testing.assert_close(out.h_tilde, layer_norm(h))
    torch.testing.assert_close(out.probs.sum(dim=1), torch.ones(32))
    assert (out.probs >= 0).all()
    torch.testing.assert_close(out.confidence, out.probs.max(dim=1).values)


def test_default_slots_and_temperature():
    router = SlotRouter(8)
    assert router.num_slots == 32 and router.config.temperature == 0.07


def test_confidence_rises_as_query_moves_toward_best_key():
    router = _router()
    torch.manual_seed(3)
    for _ in range(20):
        h = torch.randn(1, 16)
        with torch.no_grad():
            best = router(h).probs.argmax().item()
            # W_q is an isometry, so the key taken into feature space has query k: walk h towards that point.
            target = router.feature_keys()[best] * h.norm()
            path = [(1 - t) * h + t * target for t in np.linspace(0, 1, 6)]
            sims = [(normalize(router.query(x)) @ normalize(router.keys[best])).item() for x in path]
            conf = [router(x).confidence.item() for x in path]
        # the best-slot similarity c_t rises along the path, and with it s_t (Prop. 1 holds only for
        # fixed competitor mass, so s_t is compared against the start rather than step by step)
        assert all(b > a for a, b in itertools.pairwise(sims)), sims
        assert all(c > conf[0] for c in conf[1:]), conf


def test_add_slot_and_exact_state_roundtrip():
    router = _router()
    h = torch.randn(10, 16)
    with torch.no_grad():
        router.gamma.add_(0.1 * torch.randn_like(router.gamma))
    router.update_anchor_stats(h)
    index = router.add_slot(np.ones(16, dtype=np.float32))
    assert index == 8 and router.num_slots == 9
    torch.testing.assert_close(router.keys[8], normalize(torch.ones(16)))
    torch.testing.assert_close(router.gamma[8], torch.ones(16))
    state = router.state()
    clone = _router(seed=99)  # different init, fewer slots
    clone.load_state(state)
    assert clone.num_slots == 9
    for key, value in clone.state().items():
        np.testing.assert_array_equal(value, state[key])
    assert torch.equal(clone(h).h_tilde, router(h).h_tilde)


def test_anchor_ema_and_anchor_points():
    router = _router(d=4, slots=3)
    h = torch.randn(5, 4)
    probs = router.route(h)
    router.update_anchor_stats(h)
    rho = router.config.anchor_momentum
    torch.testing.assert_close(router.anchor_mass, (1 - rho) * probs.sum(0))
    torch.testing.assert_close(router.anchor_sum, (1 - rho) * probs.T @ layer_norm(h))
    anchors, live = router.anchors()
    expected = router.gamma[live] * (router.anchor_sum[live] / router.anchor_mass[live, None]) + router.beta[live]
    torch.testing.assert_close(anchors, expected)
    # A fresh slot has no mass and gives no anchor.
    router.add_slot(np.ones(4))
    assert router.anchors()[1].tolist() == live.tolist()


def _routed_by_queries(router: SlotRouter, h: torch.Tensor) -> torch.Tensor:
    """Routing as written: every sample's query W_q h against the normalised keys."""
    w_q = router.w_q if len(router.w_q) else torch.eye(router.feature_dim)  # no rows: the identity
    sims = normalize(h @ w_q.T) @ normalize(router.keys).T
    return torch.softmax(sims / router.config.temperature, dim=-1)


def test_routing_by_keys_in_feature_space_equals_routing_by_queries_while_w_q_is_an_isometry():
    torch.manual_seed(0)
    h = torch.randn(64, 16) * 3 + 1
    # the implicit identity, a square orthogonal W_q and a taller one (orthonormal columns)
    for query_dim, init in ((16, "identity"), (16, "orthogonal"), (24, "identity")):
        router = SlotRouter(16, RouterConfig(initial_slots=8, temperature=0.1, query_dim=query_dim,
                                             query_init=init), seed=1)
        assert len(router.w_q) == (0 if init == "identity" and query_dim == 16 else query_dim)
        router.add_slot(torch.randn(query_dim).numpy())
        with torch.no_grad():
            router.keys.mul_(torch.rand(9, 1) + 0.5)  # keys of any norm
            torch.testing.assert_close(router.route(h), _routed_by_queries(router, h), rtol=1e-4, atol=1e-5)
        clone = SlotRouter.from_state(16, router.config, router.state())
        assert torch.equal(clone.route(h), router.route(h))


def test_a_trained_or_narrow_w_q_routes_by_queries():
    torch.manual_seed(0)
    h = torch.randn(64, 16) * 3 + 1
    narrow = SlotRouter(16, RouterConfig(initial_slots=8, temperature=0.1, query_dim=8), seed=1)
    trained = SlotRouter(16, RouterConfig(initial_slots=8, temperature=0.1), seed=1)
    trained.train_query()
    assert torch.equal(trained.w_q, torch.eye(16))  # the implicit identity, now a matrix to train
    with torch.no_grad():
        trained.w_q.mul_(torch.rand(16, 1) * 2)  # no longer orthogonal: |W_q h| != |h|
    clone = SlotRouter.from_state(16, trained.config, trained.state())
    for router in (narrow, trained, clone):
        with torch.no_grad():
            by_queries = _routed_by_queries(router, h)
            torch.testing.assert_close(router.route(h), by_queries)
            keys_in_feature_space = normalize(router.keys) @ router.w_q
            assumed = torch.softmax(normalize(h) @ keys_in_feature_space.T / router.config.temperature, dim=-1)
            assert not torch.allclose(assumed, by_queries, atol=1e-3)  # the shortcut would be wrong here


def test_an_expansion_adds_a_slot_keyed_on_the_mean_query_of_its_samples_up_to_the_cap():
    memory = SlotMemory(16, RouterConfig(initial_slots=2, query_dim=24), max_slots=3, seed=0)
    failed = torch.randn(5, 16) * 2 + 1
    expansion = Expansion(failed.mean(0).numpy(), successes=1, trials=5, lower_bound=0.05, step=5)
    assert memory.expand([expansion, expansion]) == 3 and memory.refused_expansions == 1
    with torch.no_grad():
        torch.testing.assert_close(memory.router.keys[2], normalize(memory.router.query(failed).mean(0)))


def test_the_keys_in_feature_space_follow_every_change_of_k_and_w_q():
    router = _router()
    h = torch.randn(32, 16)
    with torch.no_grad():
        def fresh() -> torch.Tensor:
            return _routed_by_queries(router, h)
        torch.testing.assert_close(router.route(h), fresh())
        router.keys.add_(torch.randn_like(router.keys))  # an optimizer step: in place
        torch.testing.assert_close(router.route(h), fresh())
        router.add_slot(torch.randn(16).numpy())  # a new tensor
        torch.testing.assert_close(router.route(h), fresh())
        other = _router(seed=5)
        other.add_slot(torch.randn(16).numpy())
        router.load_state(other.state())  # copied in
        torch.testing.assert_close(router.route(h), fresh())


def test_a_state_without_the_isometry_flag_names_the_missing_entry():
    state = _router().state()
    del state["query_isometry"]
    with pytest.raises(KeyError, match="query_isometry"):
        _router().load_state(state)


def test_the_implicit_identity_stores_no_matrix_and_round_trips_either_way():
    identity = _router()
    orthogonal = SlotRouter(16, RouterConfig(initial_slots=8, query_init="orthogonal"), seed=0)
    assert identity.state()["w_q"].shape == (0, 16) and identity.nbytes() == orthogonal.nbytes() - 16 * 16 * 4
    h = torch.randn(32, 16)
    with torch.no_grad():
        torch.testing.assert_close(identity.route(h), torch.softmax(
            normalize(h) @ normalize(identity.keys).T / identity.config.temperature, dim=-1))
    # a router built for one start holds the other's state exactly (a checkpoint of either kind resumes)
    for source, target in ((identity, SlotRouter(16, orthogonal.config, init=False)),
                           (orthogonal, SlotRouter(16, identity.config, init=False))):
        target.load_state(source.state())
        with torch.no_grad():
            assert torch.equal(target.route(h), source.route(h))
        assert target.state()["w_q"].shape == source.state()["w_q"].shape


def test_an_unknown_query_init_is_named():
    with pytest.raises(ValueError, match="query_init"):
        SlotRouter(16, RouterConfig(query_init="random"))
