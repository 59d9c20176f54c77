"""What each baseline head learner claims to do, checked against an independent computation or over seeds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from memcl_ops.baselines.heads import (
    DERppConfig,
    DERppHead,
    EWCConfig,
    EWCHead,
    JointHead,
    NearestMeanHead,
    ReservoirBuffer,
    StreamingLDAHead,
    linear_head_fisher,
)
from memcl_ops.head_training import Stage2Config
from memcl_ops.mars.head import DistillHead
from memcl_ops.models.head import GrowingLinearHead
from memcl_ops.training import OptimConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# New columns start at zero here: started at their prototypes, these separable tasks are learned to near-certain
# predictions, where the empirical Fisher vanishes (test_ewc_fisher_nearly_vanishes_on_a_head_started_at_prototypes),
# so EWC's penalty would barely act.
FINETUNE = Stage2Config(optim=OptimConfig(epochs=5, batch_size=32, lr=1e-2), lambda_lwf=0.0, lambda_anchor=0.0,
                        lambda_anchor_ce=0.0, lambda_gaussian=0.0, new_class_init="zero")


def two_tasks(seed: int, dim: int = 12, per_class: int = 40):
    """Four Gaussian classes, task 0 = classes 0-1, task 1 = classes 2-3; train and test draws."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(4, dim, generator=gen) * 2.5

    def draw(classes):
        y = torch.tensor(classes).repeat_interleave(per_class)
        return means[y] + torch.randn(len(y), dim, generator=gen), y

    return [(draw([0, 1]), draw([0, 1])), (draw([2, 3]), draw([2, 3]))]


def accuracy(learner, x, y) -> float:
    return float((learner.predict(x, None) == y.numpy()).mean())


def test_closed_form_fisher_is_the_mean_squared_per_sample_gradient():
    gen = torch.Generator().manual_seed(0)
    head = GrowingLinearHead(5)
    head.grow([3, 7, 9])
    with torch.no_grad():
        head.weight.normal_(generator=gen)
        head.bias.normal_(generator=gen)
    h, y = torch.randn(20, 5, generator=gen), torch.tensor([3, 7, 9, 9, 3] * 4)
    fisher_w, fisher_b = linear_head_fisher(head, h, y)
    sq_w, sq_b = torch.zeros_like(head.weight), torch.zeros_like(head.bias)
    for i in range(len(h)):
        head.zero_grad()
        torch.nn.functional.cross_entropy(head(h[i:i + 1]), head.columns(y[i:i + 1])).backward()
        sq_w += head.weight.grad.pow(2) / len(h)
        sq_b += head.bias.grad.pow(2) / len(h)
    torch.testing.assert_close(fisher_w, sq_w)
    torch.testing.assert_close(fisher_b, sq_b)


def old_rows_drift(learner, task0, task1) -> float:
    (x0, y0), _ = task0
    learner.fit(x0, y0, None)
    learner.end_task(None)
    before = learner.head.weight.detach()[:2].clone()
    (x1, y1), _ = task1
    learner.fit(x1, y1, None)
    return float((learner.head.weight.detach()[:2] - before).norm())


def test_ewc_penalty_holds_old_class_weights_that_finetuning_moves():
    for seed in range(5):
        tasks = two_tasks(seed)
        free = old_rows_drift(EWCHead(12, FINETUNE, EWCConfig(lam=0.0), seed), *tasks)
        held = old_rows_drift(EWCHead(12, FINETUNE, EWCConfig(lam=1e4), seed), *tasks)
        assert held < 0.2 * free, (seed, held, free)


def test_ewc_fisher_nearly_vanishes_on_a_head_started_at_prototypes():
    """Why the EWC tests start their heads at zero: on each of five toy tasks, the diagonal Fisher after the task is
    at least 10x smaller when the new columns start at their prototypes (14x to 2,650x here)."""
    for seed in range(5):
        fisher = {}
        for init in ("zero", "prototype"):
            learner = EWCHead(12, dataclasses.replace(FINETUNE, new_class_init=init), EWCConfig(lam=1.0), seed)
            (x, y), _ = two_tasks(seed)[0]
            learner.fit(x, y, None)
            learner.end_task(None)
            fisher[init] = float(learner.fisher["weight"].sum())
        assert fisher["prototype"] * 10 < fisher["zero"], (seed, fisher)


def test_ewc_without_penalty_is_finetuning():
    tasks = two_tasks(0)
    ewc, finetune = EWCHead(12, FINETUNE, EWCConfig(lam=0.0), 0), DistillHead(12, FINETUNE, 0)
    for (x, y), _ in tasks:
        for learner in (ewc, finetune):
            learner.fit(x, y, None)
            learner.end_task(None)
    torch.testing.assert_close(ewc.head.weight, finetune.head.weight)


def test_reservoir_keeps_every_sample_with_the_same_probability():
    """Over 400 seeds, a 120-sample stream offered in uneven blocks into a 30-slot reservoir: each sample is
    kept with probability 30/120 = 0.25 (binomial std 0.022 per sample)."""
    n, capacity, seeds = 120, 30, 400
    kept = np.zeros(n)
    for seed in range(seeds):
        buffer = ReservoirBuffer(capacity, seed)
        for a, b in ((0, 50), (50, 57), (57, 120)):
            ids = np.arange(a, b)
            buffer.offer(ids[:, None].astype(np.float32), ids, np.zeros((b - a, 2), np.float32))
        assert len(buffer) == capacity and buffer.seen == n
        np.testing.assert_array_equal(buffer.features[:, 0].astype(np.int64), buffer.labels)  # rows stay whole
        kept[buffer.labels] += 1
    freq = kept / seeds
    assert np.abs(freq - 0.25).max() < 0.1, freq
    assert abs(freq[:60].mean() - freq[60:].mean()) < 0.03  # early and late samples alike


def test_reservoir_logits_keep_the_width_they_were_stored_with():
    buffer = ReservoirBuffer(10, 0)
    buffer.offer(np.zeros((3, 4), np.float32), np.array([0, 1, 0]), np.ones((3, 2), np.float32))
    buffer.offer(np.zeros((2, 4), np.float32), np.array([2, 3]), np.full((2, 4), 2.0, np.float32))
    assert buffer.logits.shape == (5, 4)
    np.testing.assert_array_equal(buffer.widths, [2, 2, 2, 4, 4])
    np.testing.assert_array_equal(buffer.logits[:3, 2:], 0.0)


def test_derpp_remembers_the_first_task_where_finetuning_forgets_it():
    gains = []
    for seed in range(8):
        tasks = two_tasks(seed)
        derpp = DERppHead(12, FINETUNE, DERppConfig(buffer_size=40), seed)
        finetune = DistillHead(12, FINETUNE, seed)
        for (x, y), _ in tasks:
            for learner in (derpp, finetune):
                learner.fit(x, y, None)
                learner.end_task(None)
        (_, (x0, y0)) = tasks[0]
        gains.append(accuracy(derpp, x0, y0) - accuracy(finetune, x0, y0))
    assert min(gains) >= 0 and np.mean(gains) > 0.2, gains


def test_nearest_mean_is_the_cosine_nearest_class_mean_whatever_the_blocks():
    (x0, y0), (xt, _) = two_tasks(1)[0]
    (x1, y1), _ = two_tasks(1)[1]
    x, y = torch.cat([x0, x1]), torch.cat([y0, y1])
    whole, pieces = NearestMeanHead(12), NearestMeanHead(12)
    whole.fit(x, y, None)
    for part in np.array_split(np.random.default_rng(0).permutation(len(y)), 5):
        pieces.fit(x[part], y[part], None)
    means = np.stack([x.numpy()[y.numpy() == c].mean(0) for c in range(4)])
    unit = means / np.linalg.norm(means, axis=1, keepdims=True)
    expected = (xt.numpy() @ unit.T).argmax(1)  # ‖x‖ does not change the argmax over classes
    np.testing.assert_array_equal(whole.predict(xt, None), expected)
    np.testing.assert_array_equal(pieces.predict(xt, None), expected)


def test_joint_does_not_forget_where_finetuning_does():
    for seed in range(4):
        tasks = two_tasks(seed)
        joint = JointHead(12, FINETUNE, seed)
        (x0, y0), (x0_test, y0_test) = tasks[0]
        joint.fit(x0, y0, None)
        right_after = accuracy(joint, x0_test, y0_test)
        joint.fit(*tasks[1][0], None)
        assert accuracy(joint, x0_test, y0_test) > right_after - 0.1, seed
        assert len(joint.labels) == len(y0) + len(tasks[1][0][1])


@pytest.mark.parametrize("make, message", [
    (lambda: EWCConfig(lam=-1.0), "lam >= 0"),
    (lambda: EWCConfig(gamma=1.5), "gamma <= 1"),
    (lambda: DERppConfig(buffer_size=0), "derpp.buffer_size"),
    (lambda: DERppConfig(alpha=-0.1), "alpha, beta >= 0"),
])
def test_bad_knobs_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _lda_stream(seed: int, rows: int = 600, dim: int = 6):
    """Three classes whose means differ along directions of little noise, beside one axis of large noise that hides
    them from a Euclidean distance."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, rows)
    means = rng.normal(0.0, 1.0, (3, dim)) * np.array([0.6] * (dim - 1) + [0.0])
    mix = np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    noise = rng.normal(size=(rows, dim)) * np.array([0.3] * (dim - 1) + [6.0])
    x = (means[y] + noise) @ mix.T
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y + 10)


@pytest.mark.parametrize("seed", range(5))
def test_streaming_lda_is_its_batch_solution_whatever_the_order_and_cutting(seed):
    x, y = _lda_stream(seed)
    order = np.random.default_rng(seed).permutation(len(y))
    streamed = StreamingLDAHead(x.shape[1])
    for block in np.array_split(order, 7):  # another order, seven uneven blocks
        streamed.fit(x[block], y[block], None)
    # the batch solution, computed independently: class means, the pooled within-class covariance, shrinkage
    h, labels = x.double().numpy(), y.numpy()
    classes = np.unique(labels)
    means = np.stack([h[labels == c].mean(0) for c in classes])
    centred = h - means[np.searchsorted(classes, labels)]
    sigma = centred.T @ centred / (len(h) - len(classes))
    eps = streamed.config.shrinkage
    weights = means @ np.linalg.inv((1 - eps) * sigma + eps * np.eye(h.shape[1]))
    bias = -0.5 * np.einsum("cd,cd->c", weights, means)
    order_of = np.argsort(streamed.classes)
    got_w, got_b = streamed.solution()
    np.testing.assert_allclose(got_w[order_of], weights, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got_b[order_of], bias, rtol=1e-8, atol=1e-10)
    expected = classes[(h @ weights.T + bias).argmax(1)]
    np.testing.assert_array_equal(streamed.predict(x, None), expected)


def test_the_shared_covariance_finds_what_a_euclidean_nearest_mean_misses():
    lda, euclid = [], []
    for seed in range(10):
        x, y = _lda_stream(seed, rows=1200)
        train, test = slice(0, 900), slice(900, None)
        for head, scores in ((StreamingLDAHead(x.shape[1]), lda),
                             (StreamingLDAHead(x.shape[1], covariance=False), euclid)):
            head.fit(x[train], y[train], None)
            scores.append(float((head.predict(x[test], None) == y[test].numpy()).mean()))
    assert all(a >= b for a, b in zip(lda, euclid, strict=True)), (lda, euclid)
    assert np.mean(lda) - np.mean(euclid) > 0.15, (lda, euclid)


DEVICES = [torch.device("cpu"), *([torch.device("cuda")] if torch.cuda.is_available() else [])]
TRAINED_HEADS = {  # every extra term of the stage-2 loop on: LwF and the Gaussian replay, EWC's penalty, DER++'s replay
    "distill": lambda: DistillHead(12, dataclasses.replace(FINETUNE, lambda_lwf=0.3, lambda_gaussian=0.3), 0),
    "ewc": lambda: EWCHead(12, FINETUNE, EWCConfig(), 0),
    "derpp": lambda: DERppHead(12, FINETUNE, DERppConfig(buffer_size=40), 0),
    "joint": lambda: JointHead(12, FINETUNE, 0),
}


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("name", list(TRAINED_HEADS))
def test_a_head_trained_on_a_device_learns_what_it_learns_where_it_was_built(name, device):
    """The epochs on `device` (a role's placement), the head back on the CPU after each fit: on the CPU the state of
    a head never moved, bit for bit; on a GPU its predictions on nearly every row."""
    placed, plain = TRAINED_HEADS[name](), TRAINED_HEADS[name]()
    placed.to(device)
    tasks = two_tasks(0)
    for (x, y), _ in tasks:
        for learner in (placed, plain):
            learner.fit(x, y, None)
            learner.end_task(None)
        assert placed.head.weight.device.type == "cpu"
    if device.type == "cpu":
        ours, theirs = placed.state(), plain.state()
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    else:
        x_test = torch.cat([test[0] for _, test in tasks])
        assert np.mean(placed.predict(x_test, None) == plain.predict(x_test, None)) > 0.95
