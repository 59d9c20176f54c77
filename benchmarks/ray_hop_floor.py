"""Ray's own cost per batch for chains of 1 to 4 no-op actor hops, classic calls and a compiled graph, on this
machine: the floor under any memcl chain of that many hops.

The batches are the cheap-encoder and cached-feature cases of `memcl bench throughput` (256 rows of 64-d and of
1280-d float32 features); each chain is timed `--repeats` times, alternating the hop counts, and the median is
printed. Uses `memcl.pipeline.throughput.ray_floor`, the same measurement as the throughput bench's floor columns.

    python -m benchmarks.ray_hop_floor [--batches 100] [--repeats 3]
"""

from __future__ import annotations

import argparse

import numpy as np
import ray

from memcl.pipeline.config import load_config
from memcl.pipeline.roles import ensure_ray
from memcl.pipeline.throughput import ray_floor
from memcl_ops.arrow import schema as S


def feature_batches(count: int, rows: int, dim: int) -> list:
    rng = np.random.default_rng(0)
    return [S.feature_batch(np.arange(rows) + k * rows, rng.normal(size=(rows, dim)).astype(np.float32),
                            np.zeros(rows, np.int64), None, stream="floor") for k in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=None, help="default: runtime.max_in_flight")
    args = parser.parse_args()
    config = load_config()
    ensure_ray(config)
    in_flight = args.in_flight or config.runtime.max_in_flight
    print(f"in flight: {in_flight}; {args.batches} batches of 256 rows; median of {args.repeats} repeats, ms per batch")
    print("| features | bytes per batch | hops | classic ms/batch | compiled ms/batch |")
    print("|---|---|---|---|---|")
    for dim in (64, 1280):
        batches = feature_batches(args.batches, 256, dim)
        times: dict[int, list[dict[str, float]]] = {h: [] for h in (1, 2, 3, 4)}
        for _ in range(args.repeats):
            for hops in times:
                times[hops].append(ray_floor(batches, hops, in_flight))
        for hops, runs in times.items():
            per = {k: 1e3 * float(np.median([r[k] for r in runs])) / args.batches for k in ("actors", "compiled")}
            print(f"| {dim}-d | {batches[0].nbytes:,} | {hops} | {per['actors']:.2f} | {per['compiled']:.2f} |",
                  flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
