import numpy as np
import torch

from memcl_ops.losses import smoothness_loss, supcon_loss
from memcl_ops.mars.dcda import Stage1Config, Stage2Config, Teacher, train_stage1, train_stage2
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.tensors import layer_norm
from memcl_ops.training import OptimConfig


def separable(num_classes=4, per_class=40, dim=16, seed=0, offset=0, spread=3.0):
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, dim, generator=gen) * spread
    x = torch.cat([c + torch.randn(per_class, dim, generator=gen) for c in centres])
    y = torch.arange(num_classes).repeat_interleave(per_class) + offset
    return x, y


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _stage1_objective(router, x, y, cfg):
    with torch.no_grad():
        out = router(x)
        return float(supcon_loss(out.h_tilde, y, cfg.temperature, cfg.temperature)
                     + cfg.lambda_smooth * smoothness_loss(out.h_tilde, layer_norm(x)))


def test_stage1_reduces_its_loss_and_changes_only_memory_parameters():
    x, y = separable(spread=1.0)  # overlapping enough that SupCon is far from its floor at init
    router = SlotRouter(16, RouterConfig(initial_slots=4))
    head = GrowingLinearHead(16)
    head.grow(y)
    before_router, before_head = _snapshot(router), _snapshot(head)
    cfg = Stage1Config(optim=OptimConfig(epochs=30, batch_size=32, lr=1e-2))
    start = _stage1_objective(router, x, y, cfg)
    train_stage1(router, x, y, cfg)
    assert _stage1_objective(router, x, y, cfg) < 0.9 * start
    after = _snapshot(router)
    for name in ("w_q", "keys", "gamma", "beta"):
        assert not torch.equal(before_router[name], after[name]), name
    for name in ("anchor_sum", "anchor_mass"):
        assert torch.equal(before_router[name], after[name])
    for k, v in _snapshot(head).items():
        assert torch.equal(v, before_head[k])


def test_stage2_reduces_its_loss_and_changes_only_the_head():
    x, y = separable()
    first = y < 2
    router = SlotRouter(16, RouterConfig(initial_slots=4))
    router.update_anchor_stats(x[first])  # anchors summarise the old task, as in the pipeline
    head = GrowingLinearHead(16)
    head.grow(y[first])
    train_stage2(head, router, x[first], y[first], None, Stage2Config(optim=OptimConfig(epochs=5)))
    teacher = Teacher.snapshot(router, head)
    head.grow(y)
    before_router, before_head = _snapshot(router), _snapshot(head)
    history = train_stage2(head, router, x[~first], y[~first], teacher,
                           Stage2Config(optim=OptimConfig(epochs=30, batch_size=32)))
    # the full-softmax anchor KD (pushing new-class logits down on old anchors) dominates and falls slowly
    assert history[-1] < history[0] * 0.85
    for k, v in _snapshot(router).items():
        assert torch.equal(v, before_router[k]), k
    assert not torch.equal(_snapshot(head)["weight"], before_head["weight"])
    accuracy = (head.predict(router(x[~first]).h_tilde) == y[~first].numpy()).mean()
    assert accuracy > 0.8  # learned the new classes (chance is 0.25) while anchors hold the old ones


def test_teacher_state_roundtrip():
    router = SlotRouter(8, RouterConfig(initial_slots=3))
    router.update_anchor_stats(torch.randn(5, 8))
    head = GrowingLinearHead(8)
    head.grow([3, 1])
    t = Teacher.snapshot(router, head)
    back = Teacher.from_state(t.state())
    for k, v in t.state().items():
        np.testing.assert_array_equal(back.state()[k], v)
