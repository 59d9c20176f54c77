import pytest
import torch

from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.tensors import take_rows
from memcl_ops.training import OptimConfig, optimize, plateaued, report_epochs


def test_plateaued_waits_for_patience_epochs_without_enough_improvement():
    assert not plateaued([5.0, 5.0, 5.0], patience=0, tolerance=0.1)  # patience 0: never
    assert not plateaued([5.0], patience=1, tolerance=1e-3)  # nothing to compare with yet
    assert plateaued([5.0, 4.999], patience=1, tolerance=1e-3)  # 0.02 % better: not enough
    assert not plateaued([5.0, 4.99], patience=1, tolerance=1e-3)  # 0.2 % better
    assert not plateaued([5.0, 5.1, 4.9], patience=2, tolerance=1e-3)  # the second epoch of patience improved
    assert plateaued([5.0, 5.1, 5.0], patience=2, tolerance=1e-3)
    assert plateaued([-1.0, -1.0005], patience=1, tolerance=1e-3)  # relative to |best| for negative losses
    assert not plateaued([-1.0, -1.01], patience=1, tolerance=1e-3)


def _quadratic(target: torch.Tensor, noise_floor: float = 0.0):
    w = torch.nn.Parameter(torch.zeros_like(target))
    return w, lambda idx: (w - target).pow(2).sum() + noise_floor


def test_optimize_stops_at_a_plateau_and_not_before():
    target = torch.full((4,), 3.0)
    # lr 1: Adam reaches the minimum within a few epochs, then the loss stops falling
    w, loss_on = _quadratic(target)
    long = optimize([w], loss_on, 8, OptimConfig(epochs=200, lr=0.5, batch_size=8), seed=0)
    w, loss_on = _quadratic(target)
    stopped = optimize([w], loss_on, 8, OptimConfig(epochs=200, lr=0.5, batch_size=8, patience=3, tolerance=1e-3),
                       seed=0)
    assert len(long) == 200 and len(stopped) < 200
    assert stopped == long[:len(stopped)]  # the same epochs up to the stop
    best = min(stopped[:-3])
    assert min(stopped[-3:]) >= best * (1 - 1e-3)  # the last 3 epochs did not improve enough
    assert not plateaued(stopped[:-1], 3, 1e-3)  # and it did not stop an epoch earlier


def test_epoch_hooks_see_the_early_stop_as_the_last_epoch():
    w, loss_on = _quadratic(torch.zeros(3))  # starts at its minimum: flat from the first epoch
    seen = []
    with report_epochs(lambda done, total, loss: seen.append((done, total))):
        history = optimize([w], loss_on, 4, OptimConfig(epochs=50, patience=1, tolerance=1e-3), seed=0)
    assert len(history) == 2 and seen == [(1, 50), (2, 2)]


def test_fused_adam_equals_the_default_adam():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=gen), torch.randn(64, generator=gen)
    results = []
    for fused in (False, True):
        w = torch.nn.Parameter(torch.zeros(8))
        history = optimize([w], lambda idx, w=w: ((x[idx] @ w - y[idx]) ** 2).mean(), 64,
                           OptimConfig(epochs=5, lr=1e-2, batch_size=16, fused=fused), seed=1)
        results.append((history, w.detach().clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-7)


def test_router_from_state_equals_load_state_and_skips_the_initialisation():
    router = SlotRouter(12, RouterConfig(initial_slots=3, query_dim=6), seed=4)
    router.add_slot(torch.randn(6))
    router.update_anchor_stats(torch.randn(10, 12))
    back = SlotRouter.from_state(12, router.config, router.state())
    for k, v in router.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    h = torch.randn(5, 12)
    torch.testing.assert_close(back(h).h_tilde, router(h).h_tilde, rtol=0, atol=0)


def test_take_rows_equals_indexing_for_any_minibatch_order():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 7, generator=gen)
    for idx in (torch.randperm(300, generator=gen)[:128], torch.randint(300, (64,), generator=gen),
                torch.zeros(0, dtype=torch.long)):
        assert torch.equal(take_rows(x, idx), x[idx])
