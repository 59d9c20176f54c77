import numpy as np
import pytest
import torch

from memcl_ops.head_training import Stage2Config, Teacher, anchor_point_weights, start_at_prototypes, train_stage2
from memcl_ops.losses import smoothness_loss, supcon_loss
from memcl_ops.mars.dcda import ClassAnchors, ClassGaussians, Stage1Config, train_stage1
from memcl_ops.mars.head import DistillHead
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.tensors import layer_norm, normalize
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
    cfg = Stage1Config(optim=OptimConfig(epochs=30, batch_size=32, lr=1e-2), train_query=True)
    start = _stage1_objective(router, x, y, cfg)
    train_stage1(router, x, y, cfg)
    assert _stage1_objective(router, x, y, cfg) < 0.9 * start
    after = _snapshot(router)
    assert after["w_q"].shape == (16, 16) and not torch.equal(after["w_q"], torch.eye(16))  # trained from I
    for name in ("keys", "gamma", "beta"):
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


def test_a_teacher_past_its_byte_budget_keeps_the_anchor_points_of_most_mass():
    router = SlotRouter(8, RouterConfig(initial_slots=3))
    head = GrowingLinearHead(8)
    head.grow([0, 1, 2])
    rng = np.random.default_rng(0)
    points = torch.from_numpy(rng.normal(size=(50, 8)).astype(np.float32))
    labels, mass = rng.integers(0, 3, 50), rng.permutation(50).astype(np.float32) + 1
    whole = Teacher.snapshot(router, head, (points, labels, mass))
    per_point = sum(v.nbytes for k, v in whole.state().items() if k.startswith("anchor")) // 50
    for kept in (1, 7, 50):
        teacher = Teacher.snapshot(router, head, (points, labels, mass), budget=kept * per_point + per_point - 1)
        anchors = sum(v.nbytes for k, v in teacher.state().items() if k.startswith("anchor"))
        assert anchors == kept * per_point
        chosen = np.flatnonzero(mass > 50 - kept)  # the masses are 1..50: the top `kept`, in their order
        np.testing.assert_array_equal(teacher.anchors, points.numpy()[chosen])
        np.testing.assert_array_equal(teacher.anchor_labels, labels[chosen])
        np.testing.assert_array_equal(teacher.anchor_logits, whole.anchor_logits[chosen])


@pytest.mark.parametrize("query_init", ["identity", "orthogonal"])
def test_stage1_without_query_training_keeps_w_q_and_matches_the_per_minibatch_computation(query_init):
    x, y = separable(spread=1.0)
    cfg = Stage1Config(optim=OptimConfig(epochs=30, batch_size=32, lr=1e-2), train_query=False)
    router = SlotRouter(16, RouterConfig(initial_slots=4, query_init=query_init))
    before = _snapshot(router)
    start = _stage1_objective(router, x, y, cfg)
    history = train_stage1(router, x, y, cfg, seed=3)
    assert _stage1_objective(router, x, y, cfg) < 0.9 * start
    after = _snapshot(router)
    assert torch.equal(before["w_q"], after["w_q"])
    for name in ("keys", "gamma", "beta"):
        assert not torch.equal(before[name], after[name]), name
    # the same optimisation written the slow way: every sample's query W_q h inside every minibatch's graph (the
    # router takes the keys into feature space instead, or uses them as they are: W_q is orthogonal or the identity)
    reference = SlotRouter(16, RouterConfig(initial_slots=4, query_init=query_init))
    w_q = torch.eye(16) if query_init == "identity" else reference.w_q.detach()

    def reference_h_tilde(h: torch.Tensor) -> torch.Tensor:
        sims = normalize(h @ w_q.T) @ normalize(reference.keys).T
        probs = torch.softmax(sims / reference.config.temperature, dim=-1)
        return (probs @ reference.gamma) * layer_norm(h) + probs @ reference.beta

    optimizer = torch.optim.Adam([reference.keys, reference.gamma, reference.beta], lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    target, want = layer_norm(x), []
    for _ in range(30):
        order, total = torch.randperm(len(x), generator=gen), 0.0
        for start_ in range(0, len(x), 32):
            idx = order[start_:start_ + 32]
            h_tilde = reference_h_tilde(x[idx])
            loss = (supcon_loss(h_tilde, y[idx], cfg.temperature, cfg.temperature)
                    + cfg.lambda_smooth * smoothness_loss(h_tilde, target[idx]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        want.append(total / len(x))
    np.testing.assert_allclose(history, want, rtol=1e-5)
    for name, value in _snapshot(reference).items():
        torch.testing.assert_close(after[name], value, rtol=1e-4, atol=1e-6)


def test_stage1_early_stop_ends_a_flat_loss_early_and_the_paper_schedule_runs_every_epoch():
    x, y = separable(num_classes=2, per_class=128, dim=32, spread=0.0)  # pure noise: SupCon cannot fall
    stopping = Stage1Config(optim=OptimConfig(epochs=20, patience=1, tolerance=1e-3))
    flat = train_stage1(SlotRouter(32, RouterConfig(initial_slots=4)), x, y, stopping)
    assert 2 <= len(flat) < 20
    paper = Stage1Config(optim=OptimConfig(epochs=20), train_query=True)
    assert len(train_stage1(SlotRouter(32, RouterConfig(initial_slots=4)), x, y, paper)) == 20


def test_stage1_early_stop_runs_on_while_the_loss_still_falls():
    x, y = separable(num_classes=4, per_class=40, dim=16, spread=1.0)
    cfg = Stage1Config(optim=OptimConfig(epochs=15, batch_size=32, lr=1e-2, patience=1, tolerance=1e-3))
    history = train_stage1(SlotRouter(16, RouterConfig(initial_slots=4)), x, y, cfg)
    assert len(history) > 4  # a separable problem keeps improving by more than 0.1 % an epoch for a while
    assert all(history[i + 1] < history[i] * (1 - 1e-3) for i in range(len(history) - 2))


def test_class_anchors_are_routing_weighted_class_means_through_each_slot():
    """Over two blocks, with a slot added between them, each (slot, class) point is γ_i·Σp_i LN(h)/Σp_i + β_i over
    that class's samples of both blocks, for exactly the pairs with at least one sample's worth of routing mass."""
    router = SlotRouter(16, RouterConfig(initial_slots=3, temperature=0.5), seed=1)
    with torch.no_grad():
        router.gamma.uniform_(0.5, 1.5)
        router.beta.normal_()
    anchors = ClassAnchors(16)
    (x1, y1), (x2, y2) = separable(seed=2), separable(seed=3, offset=2, num_classes=3)
    with torch.no_grad():
        first = torch.cat([router.route(x1), torch.zeros(len(y1), 1)], dim=1)  # the 4th slot comes later
    anchors.add(router, x1, y1)
    router.add_slot(torch.randn(16))
    anchors.add(router, x2, y2)
    x, y = torch.cat([x1, x2]), torch.cat([y1, y2])
    with torch.no_grad():
        probs = torch.cat([first, router.route(x2)])
        expected, expected_classes, expected_mass = [], [], []
        for slot in range(router.num_slots):
            for c in np.unique(y.numpy()):
                p = probs[y == c, slot]
                if p.sum() >= 1.0:
                    mean = (p[:, None] * layer_norm(x[y == c])).sum(0) / p.sum()
                    expected.append(router.gamma[slot] * mean + router.beta[slot])
                    expected_classes.append(c)
                    expected_mass.append(float(p.sum()))
        points, classes, mass = anchors.points(router)
    assert 4 < len(expected) < router.num_slots * 5  # some pairs are below the mass floor, several are above
    np.testing.assert_allclose(points.numpy(), torch.stack(expected).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(classes, expected_classes)
    np.testing.assert_allclose(mass, expected_mass, rtol=1e-5)


def test_anchor_ce_keeps_old_classes_that_new_class_ce_alone_loses():
    """Two tasks of two classes each through a 4-slot memory, stage 2 with neither LwF nor anchor KD: CE on the new
    task alone loses much of the old classes (class-incremental), CE on the (slot, class) anchors keeps them, over
    10 seeded problems, and the new task is learned either way. Class ids are not the head's column order (task 1
    brings 5 and 6, task 2 brings 1 and 2), and the test rows are held out of training. New columns start at zero:
    started at their prototypes, 10 epochs at lr 1e-3 leave this toy's new classes too weak to take the old ones' rows
    even without the anchor CE, so there would be nothing for it to keep."""
    def split(x, y):  # 60 training and 30 test rows per class
        train = (torch.arange(len(y)) % 90) < 60
        return (x[train], y[train]), (x[~train], y[~train])

    kept, lost, new = [], [], []
    for seed in range(10):
        (x1, y1), (t1, u1) = split(*separable(2, 90, seed=seed, offset=5, spread=1.5))
        (x2, y2), (t2, u2) = split(*separable(2, 90, seed=seed + 100, offset=1, spread=1.5))
        router = SlotRouter(16, RouterConfig(initial_slots=4, temperature=0.5), seed=seed)
        for weight, into in ((1.0, kept), (0.0, lost)):
            config = Stage2Config(optim=OptimConfig(epochs=10), lambda_lwf=0.0, lambda_anchor=0.0,
                                  lambda_anchor_ce=weight, lambda_gaussian=0.0, new_class_init="zero")
            head = DistillHead(16, config, seed)
            head.fit(x1, y1, router)
            head.end_task(router)
            head.fit(x2, y2, router)
            into.append(float((head.predict(t1, router) == u1.numpy()).mean()))
            new.append(float((head.predict(t2, router) == u2.numpy()).mean()))
    assert np.median(kept) > 0.9 and np.median(kept) - np.median(lost) > 0.25, (kept, lost)
    assert sum(k > f for k, f in zip(kept, lost)) >= 9
    assert np.median(new) > 0.9


def test_anchor_point_weights_give_each_class_one_share_split_by_mass():
    labels = np.array([4, 4, 4, 9, 2, 2])
    mass = np.array([1.0, 2.0, 1.0, 50.0, 3.0, 1.0], np.float32)
    weights = anchor_point_weights(labels, mass, "class").numpy()
    for c in (4, 9, 2):
        assert abs(weights[labels == c].sum() - 1 / 3) < 1e-6
    np.testing.assert_allclose(weights[labels == 4], np.array([1, 2, 1]) / 4 / 3, rtol=1e-6)
    np.testing.assert_allclose(anchor_point_weights(labels, mass, "point").numpy(), np.full(6, 1 / 6), rtol=1e-6)


def test_class_weighted_anchor_ce_keeps_a_class_held_by_one_anchor_beside_a_new_class():
    """Old class 0 lives in one anchor point, old class 1 in thirty; the new task brings class 2 two units from class
    0's mean. Weighing the anchor CE per point gives class 0 1/31 of it and the new class takes its region; per
    class (by mass) it keeps half, and both class 0 and the new class are recognised, over 10 seeded problems."""
    def trial(seed, weighting):
        gen = torch.Generator().manual_seed(seed)
        dim = 8
        means = torch.randn(4, dim, generator=gen) * 3
        means[2] = means[0] + 2.0 * torch.nn.functional.normalize(torch.randn(dim, generator=gen), dim=0)

        def draw(c, n):
            return means[c] + 0.5 * torch.randn(n, dim, generator=gen)

        config = Stage2Config(optim=OptimConfig(epochs=60, lr=1e-2), lambda_lwf=0.0, lambda_anchor=0.0,
                              lambda_anchor_ce=1.0, anchor_weighting=weighting)
        head = GrowingLinearHead(dim)
        x_old, y_old = torch.cat([draw(0, 60), draw(1, 60)]), torch.tensor([0] * 60 + [1] * 60)
        head.grow(y_old)
        train_stage2(head, None, x_old, y_old, None, config, seed=seed)
        points = torch.cat([means[:1], means[1] + 0.3 * torch.randn(30, dim, generator=gen)])
        with torch.no_grad():
            teacher = Teacher({}, head.state(), points.numpy(), head(points).numpy(), np.array([0] + [1] * 30),
                              np.array([60.0] + [2.0] * 30, np.float32))
        x_new, y_new = torch.cat([draw(2, 60), draw(3, 60)]), torch.tensor([2] * 60 + [3] * 60)
        head.grow(y_new)
        train_stage2(head, None, x_new, y_new, teacher, config, seed=seed)
        return float((head.predict(draw(0, 100)) == 0).mean()), float((head.predict(draw(2, 100)) == 2).mean())

    by_point = np.array([trial(seed, "point") for seed in range(10)])
    by_class = np.array([trial(seed, "class") for seed in range(10)])
    assert np.median(by_point[:, 0]) < 0.2 and np.median(by_class[:, 0]) > 0.8, (by_point, by_class)
    assert (by_class[:, 0] > by_point[:, 0]).sum() >= 9
    assert np.median(by_class[:, 1]) > 0.8  # the new class is learned too


def test_stage2_trains_the_same_head_given_the_blocks_routing_or_computing_it():
    """Stage 2 trains the same head whether it is given the block's routing or computes it, with an LwF teacher
    whose memory has moved since (so the teacher's h̃ is not the current one)."""
    x, y = separable(seed=4)
    router = SlotRouter(16, RouterConfig(initial_slots=3, temperature=0.5), seed=2)
    head = GrowingLinearHead(16)
    head.grow(y)
    teacher = Teacher.snapshot(router, head)
    with torch.no_grad():
        router.gamma.mul_(1.3)
        routed = router(x)
        assert not torch.allclose(teacher.router(router)(x).h_tilde, routed.h_tilde)
    heads = []
    for given in (routed, None):
        trained = GrowingLinearHead(16)
        trained.load_state(head.state())
        train_stage2(trained, router, x, y, teacher, Stage2Config(optim=OptimConfig(epochs=2)), seed=0, routed=given)
        heads.append(trained.state())
    for key in heads[0]:
        np.testing.assert_array_equal(heads[0][key], heads[1][key])


def test_new_columns_start_at_their_scaled_prototypes_and_old_columns_stay():
    x, y = separable(num_classes=3, seed=4, offset=7)  # classes 7, 8, 9
    head = GrowingLinearHead(16)
    head.grow([2, 5])
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[3.0] * 16, [1.0] * 16]))
        head.bias.copy_(torch.tensor([0.5, -1.5]))
    old_weight, old_bias = head.weight.detach().clone(), head.bias.detach().clone()
    new = head.grow(y)
    start_at_prototypes(head, x, y, new, scale=0.5)
    assert new == [7, 8, 9]
    torch.testing.assert_close(head.weight[:2].detach(), old_weight)
    torch.testing.assert_close(head.bias[:2].detach(), old_bias)
    old_norm = (3.0 * 4 + 1.0 * 4) / 2  # the two old rows' norms, 3·√16 and 1·√16, averaged
    for column, label in enumerate(new, start=2):
        mean = x[y == label].mean(0)
        torch.testing.assert_close(head.weight[column].detach(), 0.5 * old_norm * mean / mean.norm())
        assert float(head.bias[column].detach()) == -0.5  # the old biases' mean
    fresh = GrowingLinearHead(16)  # nothing trained before: unit norm x scale, zero bias
    start_at_prototypes(fresh, x, y, fresh.grow(y), scale=0.5)
    torch.testing.assert_close(fresh.weight.norm(dim=1), torch.full((3,), 0.5))
    assert not fresh.bias.any()


def test_prototype_start_classifies_every_seen_class_better_after_a_short_visit():
    """Low-dimensional classes and few Adam steps (a 400-sample visit of synthetic-drift gets 40): over 10 seeded
    problems of two 4-class tasks, the accuracy over all 8 classes right after the second visit is higher when new
    columns start at their prototypes than at zero, whose new task takes the old classes' rows instead."""
    overall = {"zero": [], "prototype": []}
    for seed in range(10):
        tasks = [separable(4, 150, dim=8, seed=seed + 50 * t, spread=0.8) for t in (0, 1)]
        tasks = [(x, torch.tensor(ids)[y]) for (x, y), ids in zip(tasks, ([9, 2, 14, 5], [0, 11, 3, 7]))]
        train = torch.arange(600) % 150 < 100  # 100 training and 50 test rows per class
        for init, into in overall.items():
            config = Stage2Config(optim=OptimConfig(epochs=10), lambda_lwf=0.0, lambda_anchor=0.0,
                                  lambda_anchor_ce=0.0, lambda_gaussian=0.0,
                                  new_class_init=init)
            head = DistillHead(8, config, seed)
            for x, y in tasks:
                head.fit(x[train], y[train], None)
                head.end_task(None)
            x, y = torch.cat([x[~train] for x, _ in tasks]), torch.cat([y[~train] for _, y in tasks])
            into.append(float((head.predict(x, None) == y.numpy()).mean()))
    assert sum(p > z for p, z in zip(overall["prototype"], overall["zero"])) >= 9, overall


def _class_scatters(xs: np.ndarray, ys: np.ndarray, classes: np.ndarray) -> list[np.ndarray]:
    return [np.cov(xs[ys == c].T, ddof=0) * (ys == c).sum() for c in classes]


def test_class_gaussians_hold_each_class_mean_and_scatter_however_the_stream_is_cut():
    """With as many directions as dimensions the factor is the whole scatter: against numpy's float64 computation
    over all rows, for features with a mean 1,000 times their spread (where Σ x xᵀ − Σ s sᵀ / n would cancel away),
    classes out of order, one class seen in several pieces."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(300, 6, generator=gen) * torch.tensor([1.0, 2, 3, 1, 1, 0.5]) * 0.1 + 100.0
    y = torch.tensor([9, 4, 12, 0, 7])[torch.randint(0, 5, (300,), generator=gen)]
    whole, pieces = ClassGaussians(6, rank=6), ClassGaussians(6, rank=6)
    whole.add(x, y)
    for start, stop in ((0, 7), (7, 150), (150, 151), (151, 300)):
        pieces.add(x[start:stop], y[start:stop])
    xs, ys = x.double().numpy(), y.numpy()
    classes = np.unique(ys)
    means = np.stack([xs[ys == c].mean(0) for c in classes])
    scatters = _class_scatters(xs, ys, classes)
    for held in (whole, pieces):
        np.testing.assert_array_equal(held.classes, classes)
        np.testing.assert_allclose((held.sums / held.counts[:, None]).numpy(), means, rtol=1e-12)
        np.testing.assert_allclose(held.traces.numpy(), [np.trace(s) for s in scatters], rtol=1e-9)
        for factor, scatter in zip(held.factors.double().numpy(), scatters):
            np.testing.assert_allclose(factor @ factor.T, scatter, rtol=1e-4, atol=1e-4 * np.abs(scatter).max())


@pytest.mark.parametrize("block", [9, 97])
def test_class_gaussians_keep_each_class_top_directions_when_cut_short(block):
    """Rank 3 of 40 dimensions, the stream cut into blocks of `block` rows (9: every merge goes through the stack's
    own Gram matrix, as at D = 1,280; 97: through the D × D one): a class whose rows lie in a 3-d subspace is kept
    exactly; a class with a clear gap after its third eigenvalue keeps numpy's top-3 subspace and eigenvalues; the
    traces stay exact either way."""
    gen = torch.Generator().manual_seed(5)
    flat = torch.randn(400, 3, generator=gen) @ torch.randn(3, 40, generator=gen) + 4.0
    spiky = torch.randn(400, 40, generator=gen) * torch.tensor([9.0, 7, 5] + [0.3] * 37)
    spiky = spiky @ torch.linalg.qr(torch.randn(40, 40, generator=gen))[0] - 2.0
    x, y = torch.cat([flat, spiky]), torch.tensor([0] * 400 + [1] * 400)
    order = torch.randperm(800, generator=gen)
    x, y = x[order], y[order]
    held = ClassGaussians(40, rank=3)
    for start in range(0, 800, block):
        held.add(x[start:start + block], y[start:start + block])
    flat_scatter, spiky_scatter = _class_scatters(x.double().numpy(), y.numpy(), np.array([0, 1]))
    kept = [f.double().numpy() for f in held.factors]
    np.testing.assert_allclose(kept[0] @ kept[0].T, flat_scatter, rtol=1e-3, atol=1e-4 * np.abs(flat_scatter).max())
    values, vectors = np.linalg.eigh(spiky_scatter)
    np.testing.assert_allclose((kept[1] ** 2).sum(0), values[::-1][:3], rtol=0.02)  # largest first
    projector = vectors[:, -3:] @ vectors[:, -3:].T
    basis = kept[1] / np.linalg.norm(kept[1], axis=0)
    np.testing.assert_allclose(basis @ basis.T, projector, atol=0.02)
    np.testing.assert_allclose(held.traces.numpy(), [np.trace(flat_scatter), np.trace(spiky_scatter)], rtol=1e-9)


def test_class_gaussians_draw_only_classes_that_show_spread():
    held = ClassGaussians(3, rank=2)
    gen = torch.Generator().manual_seed(0)
    held.add(torch.tensor([[1.0, 2, 3]]), torch.tensor([5]))
    held.add(torch.tensor([[0.0, 1, 0], [4, 4, 4]]), torch.tensor([2, 8]))  # three classes of one row each
    assert held.sample(4, 0.1, gen) is None
    held.add(torch.tensor([[1.0, 2, 3]] * 4), torch.tensor([5, 5, 5, 5]))  # class 5's row again: still no spread
    assert held.sample(4, 0.1, gen) is None
    held.add(torch.tensor([[7.0, 8, 7], [7, 6, 7]]), torch.tensor([5, 5]))
    rows, classes = held.sample(4, 0.1, gen)
    assert rows.shape == (4, 3) and np.array_equal(classes, [5, 5, 5, 5])
    assert torch.isfinite(rows).all()


@pytest.mark.parametrize("rank", [0, 2])
def test_class_gaussian_draws_have_each_class_own_mean_and_shrunk_covariance(rank):
    """Two classes of different shapes in 5 dimensions: each class's draws have its mean and the covariance
    (1 − s)(its top-`rank` part + the rest of its trace spread over the other directions) + s·tr/5·I (rank 0: its
    mean variance in every direction)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [torch.randn(5, 5, generator=gen) * torch.tensor([3.0, 2, 0.5, 0.5, 0.5]), torch.eye(5) * 0.7]
    x = torch.cat([torch.randn(3000, 5, generator=gen) @ shape.T + 2.0 * k for k, shape in enumerate(shapes)])
    y = torch.arange(6000) // 3000
    held = ClassGaussians(5, rank=rank)
    held.add(x, y)
    rows, classes = held.sample(20_000, 0.2, torch.Generator().manual_seed(1))
    for c in (0, 1):
        own = x[y == c].double()
        covariance = torch.cov(own.T)
        values, vectors = torch.linalg.eigh(covariance)
        top = vectors[:, 5 - rank:]
        rest = values[:5 - rank].mean()
        eye = torch.eye(5, dtype=torch.float64)
        kept = top @ torch.diag(values[5 - rank:] - rest) @ top.T + rest * eye
        target = (0.8 * kept + 0.2 * values.mean() * eye).float()
        draws = rows[torch.from_numpy(classes == c)]
        standard_error = target.diagonal().sqrt() / np.sqrt(len(draws))
        assert (draws.mean(0) - own.mean(0).float()).abs().le(5 * standard_error).all()
        torch.testing.assert_close(torch.cov(draws.T), target, rtol=0.05, atol=0.05 * float(target.abs().max()))


def test_class_gaussian_draws_of_a_small_class_use_its_unbiased_covariance():
    """Five rows: the draws' covariance is the scatter over n − 1 = 4 (over n it would be 20 % smaller)."""
    x = torch.tensor([[0.0, 1], [2, 0], [1, 3], [4, 1], [3, 5]])
    held = ClassGaussians(2, rank=2)
    held.add(x, torch.zeros(5, dtype=torch.int64))
    rows, _ = held.sample(200_000, 1e-6, torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.cov(rows.T.double()), torch.cov(x.T.double()), rtol=0.02, atol=0.02)


def test_stage2_config_refuses_a_negative_gaussian_rank_or_teacher_budget():
    with pytest.raises(ValueError, match=r"gaussian_rank >= 0 and teacher_bytes >= 0, got .*, -1, 16777216$"):
        Stage2Config(gaussian_rank=-1)
    with pytest.raises(ValueError, match=r"teacher_bytes >= 0, got .*, 32, -1$"):
        Stage2Config(teacher_bytes=-1)


def test_class_gaussians_name_a_checkpoint_they_cannot_resume():
    held = ClassGaussians(4, rank=2)
    held.add(torch.randn(10, 4), torch.arange(10) % 2)
    # a pooled scatter (memcl before per-class covariances): the KeyError a resume reports as an older memcl's state
    with pytest.raises(KeyError, match="factors"):
        ClassGaussians(4, rank=2).restore({"scatter": np.zeros((4, 4), np.float32), "sums": held.state()["sums"],
                                           "counts": held.state()["counts"], "classes": held.state()["classes"]})
    with pytest.raises(ValueError, match=r"keep 2 directions of 4 features per class, this run 3 of 4"):
        ClassGaussians(4, rank=3).restore(held.state())
    with pytest.raises(ValueError, match=r"keep 2 directions of 4 features per class, this run 2 of 5"):
        ClassGaussians(5, rank=2).restore(held.state())
    twin = ClassGaussians(4, rank=2)
    twin.restore(held.state())
    gen_a, gen_b = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    torch.testing.assert_close(twin.sample(8, 0.1, gen_a)[0], held.sample(8, 0.1, gen_b)[0], rtol=0, atol=0)


def test_gaussian_replay_keeps_old_classes_that_ce_alone_loses_and_restores_exactly():
    """Two tasks of two overlapping classes, stage 2 with no LwF and no anchors: over 10 seeded problems the first
    task's classes score higher after the second task with Gaussian replay than without; a learner restored from the
    state of one that learned task 1 learns task 2 into the same head. New columns start at zero, as in the anchor CE's
    test: started at their prototypes, this toy's second task takes nothing from the first to keep."""
    kept, lost = [], []
    for seed in range(10):
        (x1, y1), (x2, y2) = separable(2, 120, seed=seed, spread=1.0), separable(2, 120, seed=seed + 50, spread=1.0)
        y1, y2 = torch.tensor([9, 4])[y1], torch.tensor([1, 7])[y2]  # class ids are not the head's columns
        train = torch.arange(240) % 120 < 80
        for weight, into in ((0.3, kept), (0.0, lost)):
            config = Stage2Config(optim=OptimConfig(epochs=10), lambda_lwf=0.0, lambda_anchor=0.0,
                                  lambda_anchor_ce=0.0, lambda_gaussian=weight, new_class_init="zero")
            head = DistillHead(16, config, seed)
            head.fit(x1[train], y1[train], None)
            head.end_task(None)
            if weight and seed == 0:
                twin = DistillHead(16, config, seed)
                twin.restore(head.state())
                twin.fit(x2[train], y2[train], None)
            head.fit(x2[train], y2[train], None)
            if weight and seed == 0:
                torch.testing.assert_close(twin.head.weight, head.head.weight, rtol=0, atol=0)
            into.append(float((head.predict(x1[~train], None) == y1[~train].numpy()).mean()))
    assert sum(k > f for k, f in zip(kept, lost)) >= 9, (kept, lost)
