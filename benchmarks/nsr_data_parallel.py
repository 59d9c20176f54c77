"""NSR's adapter trainer as 1 and as 2 data-parallel workers (`runtime.data_parallel`) on the same stream, side by
side: training throughput, and whether the two learn the same thing (the accuracy matrix, the final adapter and
head weights' largest difference).

The stream is pipeline/configs/nsr-bbc-cyclic.yaml (pretrained MiniLM, BBC News A B C A B C). Both settings get
the same cores: one worker with `--threads` torch threads, or two workers with `--threads / 2` each (at least 1).
The settings alternate for `--repeats` runs each; the table gives medians.

    python benchmarks/nsr_data_parallel.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from memcl.pipeline import checkpoint, runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def final_adapter(metrics: dict) -> dict[str, np.ndarray]:
    last = sorted((Path(metrics["run_dir"]) / "checkpoints").glob("ckpt-*.npz"))[-1]
    parts, _ = checkpoint.read(last)
    return {k: v for k, v in parts["adapter_trainer"].items() if k.startswith(("learner.lora.", "learner.head."))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the one worker (split over two)")
    args = parser.parse_args(argv)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    actors = ActorCache()
    try:
        with tempfile.TemporaryDirectory(prefix="memcl-nsr-dp-") as out:
            for _ in range(args.repeats):
                for workers in (1, 2):
                    config = load_config(ROOT / "pipeline" / "configs" / "nsr-bbc-cyclic.yaml", overrides={
                        "runtime.data_parallel": workers, "encoder.threads": max(args.threads // workers, 1),
                        "runtime.out": out, "runtime.progress": False, "runtime.num_cpus": args.threads})
                    metrics = runner.run(config, actors=actors).metrics
                    runs[workers].append({"metrics": metrics, "adapter": final_adapter(metrics)})
    finally:
        actors.close()
    one, two = runs[1][0], runs[2][0]
    gap = max(float(np.abs(two["adapter"][k] - one["adapter"][k]).max()) for k in one["adapter"])
    same = np.array_equal(np.array(one["metrics"]["acc_matrix"], float), np.array(two["metrics"]["acc_matrix"], float))
    print(f"{os.cpu_count()} cores; {args.repeats} alternating runs per setting, medians\n\n"
          "| workers | torch threads each | train samples/s | stream s | A_last | same matrix as 1 worker | "
          "max abs weight difference vs 1 worker |\n|---|---|---|---|---|---|---|")
    for workers, rs in runs.items():
        stream = statistics.median(r["metrics"]["wall_seconds"]["stream"] for r in rs)
        learned = rs[0]["metrics"]["samples"]["learned"]
        a_last = 100 * rs[0]["metrics"]["summary"]["a_last"]
        print(f"| {workers} | {max(args.threads // workers, 1)} | {learned / stream:.1f} | {stream:.1f} | "
              f"{a_last:.2f} | {'-' if workers == 1 else ('yes' if same else 'NO')} | "
              f"{'-' if workers == 1 else f'{gap:.2e}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
