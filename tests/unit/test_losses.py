import math

import torch
import torch.nn.functional as F

from memcl_ops.losses import kd_loss, old_class_kd, old_class_kd_full, smoothness_loss, supcon_loss


def supcon_reference(features, labels, temperature):
    """Slow loop over anchors/positives, straight from Khosla et al. Eq. 2 (single view)."""
    z = F.normalize(features, dim=1)
    n = len(z)
    terms = []
    for i in range(n):
        positives = [p for p in range(n) if p != i and labels[p] == labels[i]]
        if not positives:
            continue
        denom = sum(math.exp(float(z[i] @ z[a]) / temperature) for a in range(n) if a != i)
        terms.append(-sum(float(z[i] @ z[p]) / temperature - math.log(denom) for p in positives) / len(positives))
    return sum(terms) / len(terms)


def test_supcon_matches_loop_reference():
    gen = torch.Generator().manual_seed(0)
    for _trial in range(5):
        x = torch.randn(9, 5, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 3, (9,), generator=gen)
        y[0] = 7  # an anchor with no positive is left out
        for temperature in (0.07, 0.5):
            ours = supcon_loss(x, y, temperature, temperature)
            assert abs(float(ours) - supcon_reference(x, y, temperature)) < 1e-6  # Norm ε = 1e-8


def test_supcon_with_no_positive_is_zero_and_differentiable():
    x = torch.randn(4, 3, requires_grad=True)
    loss = supcon_loss(x, torch.arange(4))
    loss.backward()
    assert loss.item() == 0.0 and x.grad is not None and torch.all(x.grad == 0)


def test_kd_zero_for_identical_and_positive_otherwise():
    logits = torch.randn(6, 5)
    assert float(kd_loss(logits, logits.clone(), 3.0)) < 1e-6
    assert float(kd_loss(logits, torch.randn(6, 5), 3.0)) > 0


def test_kd_has_t_squared_factor():
    s, t = torch.randn(4, 3), torch.randn(4, 3)
    kl = F.kl_div(F.log_softmax(s / 2, 1), F.softmax(t / 2, 1), reduction="batchmean")
    torch.testing.assert_close(kd_loss(s, t, 2.0), 4 * kl)


def test_old_class_kd_uses_only_old_columns():
    teacher = torch.randn(5, 3)
    student = torch.cat([teacher, torch.randn(5, 4) * 10], dim=1)  # new columns differ wildly
    assert float(old_class_kd(student, teacher, 3.0)) < 1e-6


def test_smoothness():
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert float(smoothness_loss(a, b)) == 3.0


def test_weighted_kd_is_the_weighted_mean_of_the_rows_kd():
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 6, generator=gen), torch.randn(5, 4, generator=gen)
    weights = torch.tensor([0.1, 0.4, 0.0, 0.3, 0.2])
    for kd in (old_class_kd, old_class_kd_full):
        rows = torch.stack([kd(student[i:i + 1], teacher[i:i + 1], 3.0) for i in range(5)])
        assert torch.allclose(kd(student, teacher, 3.0, weights), weights @ rows, atol=1e-6)
        assert torch.allclose(kd(student, teacher, 3.0), rows.mean(), atol=1e-6)
