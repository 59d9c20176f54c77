"""QR-of-factors SVD and the energy-rule compression of LoRA deltas (NSR, docs/methods.md, "NSR")."""

import numpy as np
import pytest
import torch

from memcl_ops.models.lowrank import CompressionConfig, compress, energy_rank, factored_svd, mix_and_refactor

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices (tests/conftest.py)


SHAPES = [(48, 32, 8), (32, 48, 8), (64, 64, 4), (20, 30, 1), (6, 5, 8)]  # (d_out, d_in, r), incl. r > min(d)


def factors(d_out, d_in, r, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(d_out, r, generator=gen), torch.randn(r, d_in, generator=gen)


@pytest.mark.parametrize("shape", SHAPES)
def test_factored_svd_equals_dense_svd(shape):
    for seed in range(20):
        B, A = factors(*shape, seed)
        dense = B @ A
        u, s, vh = factored_svd(B, A)
        k = min(s.shape[0], *dense.shape)
        s_ref = torch.linalg.svdvals(dense)
        torch.testing.assert_close(s[:k], s_ref[:k], rtol=1e-5, atol=1e-5 * float(s_ref[0]))
        torch.testing.assert_close(u @ torch.diag(s) @ vh, dense, rtol=1e-4, atol=1e-5 * float(s_ref[0]))
        torch.testing.assert_close(u.T @ u, torch.eye(u.shape[1]), atol=1e-5, rtol=0)
        # the leading singular subspaces agree with the dense SVD's (sign-free: compare projectors)
        u_ref, _, vh_ref = torch.linalg.svd(dense, full_matrices=False)
        j = min(k, 3)
        torch.testing.assert_close(u[:, :j] @ u[:, :j].T, u_ref[:, :j] @ u_ref[:, :j].T, atol=1e-4, rtol=0)
        torch.testing.assert_close(vh[:j].T @ vh[:j], vh_ref[:j].T @ vh_ref[:j], atol=1e-4, rtol=0)


def test_rank_deficient_factors_give_zero_trailing_singular_values():
    B, A = factors(40, 30, 8, 0)
    B[:, 5:] = 0.0  # rank 5
    _, s, _ = factored_svd(B, A)
    assert float(s[5:].abs().max()) < 1e-5 * float(s[0])
    torch.testing.assert_close(s[:5], torch.linalg.svdvals(B @ A)[:5], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_full_rank_compression_reconstructs_the_delta(shape):
    d_out, d_in, r = shape
    full = CompressionConfig(energy=1.0, max_rank=r, dtype="float32")
    for seed in range(10):
        B, A = factors(*shape, seed)
        dense = B @ A
        c = compress(B, A, full)
        assert c.rank == min(r, d_out, d_in) and c.energy_kept == pytest.approx(1.0)
        torch.testing.assert_close(c.dense(), dense, rtol=1e-4, atol=1e-5 * float(dense.abs().max()))
        half = compress(B, A, CompressionConfig(energy=1.0, max_rank=r))
        assert half.B.dtype == half.A.dtype == np.float16
        # fp16 keeps ~11 bits: the error is a few 1e-3 of the largest entry, not more
        assert float((half.dense() - dense).abs().max()) < 5e-3 * float(dense.abs().max())


def delta_with_singular_values(s, d_out=40, d_in=30, seed=0):
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(d_out, len(s), generator=gen))
    v, _ = torch.linalg.qr(torch.randn(d_in, len(s), generator=gen))
    return u * torch.tensor(s), v.T  # B = U diag(s), A = Vᵀ


def test_energy_rule_picks_the_documented_rank():
    # σ = 3, 2, 1, 0.5: cumulative energy 9, 13, 14, 14.25 of 14.25 -> 0.632, 0.912, 0.982, 1.0
    B, A = delta_with_singular_values([3.0, 2.0, 1.0, 0.5])
    assert compress(B, A).rank == 2  # η_E = 0.90 -> 2 (0.912 ≥ 0.90 > 0.632)
    assert compress(B, A, CompressionConfig(energy=0.95)).rank == 3
    assert compress(B, A, CompressionConfig(energy=0.5)).rank == 1
    assert compress(B, A, CompressionConfig(energy=0.99, max_rank=2)).rank == 2  # capped at k_max
    assert compress(B, A, CompressionConfig(energy=1.0)).rank == 4
    assert compress(B, A).energy_kept == pytest.approx(13 / 14.25, rel=1e-6)


def test_energy_rank_is_the_smallest_reaching_the_threshold_over_random_spectra():
    rng = np.random.default_rng(0)
    for _ in range(500):
        s = torch.from_numpy(np.sort(rng.exponential(size=rng.integers(1, 12)))[::-1].copy())
        eta, cap = float(rng.uniform(0.3, 1.0)), int(rng.integers(1, 12))
        k = energy_rank(s, eta, cap)
        frac = torch.cumsum(s**2, 0) / (s**2).sum()
        assert 1 <= k <= min(cap, len(s))
        if k < min(cap, len(s)):
            assert frac[k - 1] >= eta - 1e-9
        if k > 1:
            assert frac[k - 2] < eta


def test_stored_bytes_are_the_kept_factors_at_the_storage_dtype():
    B, A = factors(48, 32, 8, 1)
    c = compress(B, A, CompressionConfig(energy=1.0, max_rank=4))
    assert (c.B.shape, c.A.shape) == ((48, 4), (4, 32))
    assert c.nbytes == (48 + 32) * 4 * 2
    c32 = compress(B, A, CompressionConfig(energy=1.0, max_rank=4, dtype="float32"))
    assert c32.nbytes == 2 * c.nbytes


def test_zero_delta_compresses_to_rank_zero():
    B, A = factors(10, 12, 4, 0)
    c = compress(torch.zeros_like(B), A)
    assert c.rank == 0 and c.nbytes == 0
    assert torch.equal(c.dense(), torch.zeros(10, 12))


def test_fp16_overflow_is_refused():
    B, A = factors(10, 12, 2, 0)
    with pytest.raises(ValueError, match="overflow float16"):
        compress(B * 1e6, A * 1e6)


def test_warm_start_mix_is_the_weighted_sum_of_deltas_refactored():
    full = CompressionConfig(energy=1.0, max_rank=4, dtype="float32")
    parts = [compress(*factors(30, 20, 2, seed), full) for seed in range(3)]
    weights = [0.5, 0.3, 0.2]
    mixed = sum(w * p.dense() for w, p in zip(weights, parts))
    out = mix_and_refactor([(w, {"site": p}) for w, p in zip(weights, parts)], rank=8)
    b0, a0 = out["site"]
    assert b0.shape == (30, 6) and a0.shape == (6, 20)  # total rank 6 <= 8: exact
    torch.testing.assert_close(torch.from_numpy(b0 @ a0), mixed, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a0 @ a0.T, np.eye(6), atol=1e-5)  # peft convention: orthonormal rows of A
    b3, a3 = mix_and_refactor([(w, {"site": p}) for w, p in zip(weights, parts)], rank=3)["site"]
    u, s, vh = torch.linalg.svd(mixed)
    best = u[:, :3] @ torch.diag(s[:3]) @ vh[:3]  # Eckart-Young: the best rank-3 approximation
    torch.testing.assert_close(torch.from_numpy(b3 @ a3), best, rtol=1e-4, atol=1e-5)
