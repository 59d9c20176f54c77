import itertools

import numpy as np
import torch

from memcl_ops.mars.router import RouterConfig, SlotRouter
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
            # W_q is orthogonal, so W_qᵀ k has query k: walk h towards that point.
            target = router.keys[best] @ router.w_q * h.norm()
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
    _, probs = router.route(h)
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
