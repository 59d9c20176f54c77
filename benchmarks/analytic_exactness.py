"""Why the analytic head sums in exact fixed point, measured side by side in one run.

The same rows (real EfficientNet-Lite0 features from the feature cache when present, else seeded Gaussian rows) are
dealt to k replicas in a random order, each replica sums its share, the shares are merged; that is repeated for
several random deals. Plain float64 sums (what `G += φᵀφ` does) give a different G for each deal; the exact
fixed-point sums of `memcl_ops.analytic.ridge` give the same bits every time. Also printed: the time of one
statistics update (exact: rounding + chunked products + int64 sums; plain: one float64 product), as a ratio.

    python benchmarks/analytic_exactness.py [--rows 4000] [--expansion-dim 1024] [--deals 4] [--replicas 4]
"""

from __future__ import annotations

import argparse
import glob
import time

import numpy as np
import pyarrow.parquet as pq

from memcl_ops.analytic.ridge import AnalyticConfig, AnalyticHead


def features(rows: int) -> tuple[np.ndarray, np.ndarray, str]:
    cached = sorted(glob.glob(".memcl_cache/fashion-mnist-train-efficientnet-lite0@64px-*.parquet"))
    if cached:
        table = pq.read_table(cached[0])
        x = np.stack(table.column("features").to_numpy(zero_copy_only=False)[:rows]).astype(np.float32)
        source = f"EfficientNet-Lite0 features from {cached[0]}"
    else:
        x = np.random.default_rng(0).normal(1.0, 1.5, (rows, 1280)).astype(np.float32)
        source = "seeded Gaussian rows (no Fashion-MNIST feature cache found)"
    labels = np.random.default_rng(1).integers(0, 10, len(x))  # the labels only index C's columns here
    return x, labels, source


def plain_sums(phi: np.ndarray, deal: list[np.ndarray]) -> np.ndarray:
    parts = [phi[rows].T @ phi[rows] for rows in deal]
    total = np.zeros_like(parts[0])
    for part in parts:
        total += part
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--expansion-dim", type=int, default=1024)
    parser.add_argument("--deals", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    x, labels, source = features(args.rows)
    config = AnalyticConfig(expansion_dim=args.expansion_dim)
    print(f"{len(x)} rows of {source}; φ = ReLU(Rᵀh) with M = {args.expansion_dim}, s = {config.fraction_bits}")
    fmap = AnalyticHead(x.shape[1], config).feature_map
    # the plain head's φ: the same random expansion on the unrounded float64 features
    projection = fmap.projection * fmap.rescale
    phi = np.maximum(np.asarray(x, np.float64) @ projection, 0.0)

    plain, exact = [], []
    for d in range(args.deals):
        rng = np.random.default_rng(100 + d)
        deal = np.array_split(rng.permutation(len(x)), args.replicas)
        plain.append(plain_sums(phi, deal))
        heads = [AnalyticHead(x.shape[1], config) for _ in deal]
        for head, rows in zip(heads, deal):
            head.update(x[rows], labels[rows])
        merged, *rest = [heads[i] for i in rng.permutation(len(heads))]
        for head in rest:
            merged.merge(head)
        exact.append(merged.stats.gram.copy())
    plain_spread = max(float(np.abs(g - plain[0]).max()) for g in plain)
    plain_differ = sum(not np.array_equal(g, plain[0]) for g in plain[1:])
    exact_differ = sum(not np.array_equal(g, exact[0]) for g in exact[1:])
    print(f"{args.deals} random deals to {args.replicas} replicas, merged in random order:")
    print(f"  plain float64 G: {plain_differ} of {args.deals - 1} deals differ from the first "
          f"(largest entry difference {plain_spread:.3g})")
    print(f"  exact fixed-point G: {exact_differ} of {args.deals - 1} deals differ from the first")

    block = slice(0, min(len(x), 2000))
    t0 = time.perf_counter()
    AnalyticHead(x.shape[1], config).update(x[block], labels[block])
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    f = np.maximum(np.asarray(x[block], np.float64) @ projection, 0.0)
    _ = f.T @ f
    t_plain = time.perf_counter() - t0
    print(f"one update of {block.stop} rows: exact {t_exact:.2f} s, plain float64 {t_plain:.2f} s, "
          f"ratio {t_exact / t_plain:.2f}")


if __name__ == "__main__":
    main()
