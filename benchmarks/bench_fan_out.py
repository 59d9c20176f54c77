"""`memcl bench` fanned out over a 2-node local Ray cluster beside the sequential bench on the same cluster.

Starts a `ray.cluster_utils.Cluster` (a head and one worker node, `--cpus` CPUs each), runs `bench SUITE` once
sequentially (one run after another, shared actors) and once with `fan_out=1` (bench workers of one CPU each,
spread over both nodes, each taking the next (method, seed) run), then says whether the tables are the same (every
column but the train seconds, which are timings) and prints both wall times and their ratio.

    python benchmarks/bench_fan_out.py synthetic-drift --seeds 3 --methods mars,derpp,simplecil,analytic,ewc
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from memcl.pipeline import auth, bench

COMPARED = ("method", "seed", "a_last", "a_mean", "forgetting", "bwt", "memory_bytes", "curve")


def runs_table(folder: Path) -> list[tuple]:
    with open(folder / "runs.csv", newline="") as f:
        return [tuple(row[k] for k in COMPARED) for row in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", help="comma-separated (default: the suite's)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs of each of the two nodes")
    args = parser.parse_args(argv)
    methods = args.methods.split(",") if args.methods else None
    if auth.token_on():
        auth.ensure_local_token()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus, "include_dashboard": False})
    cluster.add_node(num_cpus=args.cpus)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="memcl-fan-out-") as root:
            walls = {}
            for mode, fan_out in (("sequential", 0.0), ("fanned out", 1.0)):
                started = time.perf_counter()
                bench.bench(args.suite, seeds=args.seeds, methods=methods, out=Path(root) / mode, fan_out=fan_out,
                            log=lambda line: print(line, file=sys.stderr))
                walls[mode] = time.perf_counter() - started
            same = runs_table(Path(root) / "sequential" / args.suite) == runs_table(Path(root) / "fanned out" /
                                                                                     args.suite)
            runs = len(runs_table(Path(root) / "sequential" / args.suite))
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"| suite | runs | nodes x CPUs | sequential s | fanned out s | speed-up | same tables |\n"
          f"|---|---|---|---|---|---|---|\n"
          f"| {args.suite} | {runs} | 2 x {args.cpus} | {walls['sequential']:.0f} | {walls['fanned out']:.0f} | "
          f"{walls['sequential'] / walls['fanned out']:.2f} | {'yes' if same else 'NO'} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
