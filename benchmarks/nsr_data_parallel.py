"""NSR's adapter trainer as 1 and as 2 data-parallel workers (`runtime.data_parallel`) on the same stream, side by
side: training throughput, and whether the two learn the same thing (the accuracy matrix, the final adapter and
head weights' largest difference).

The stream is pipeline/configs/nsr-bbc-cyclic.yaml (pretrained MiniLM, BBC News A B C A B C). Three settings on
the same cores: one worker with `--threads` torch threads, one worker with `--threads / 2`, and two workers with
`--threads / 2` each. The second is the control: the same learning as the first with the float sums in another
order (fewer threads), so its difference from the first is what float order alone does here. The settings
alternate for `--repeats` runs each; the table gives medians.

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


def adapters(metrics: dict) -> list[dict[str, np.ndarray]]:
    """The adapter and head weights after each visit (one checkpoint each)."""
    out = []
    for path in sorted((Path(metrics["run_dir"]) / "checkpoints").glob("ckpt-*.npz")):
        parts, _ = checkpoint.read(path)
        out.append({k: v for k, v in parts["adapter_trainer"].items()
                    if k.startswith(("learner.lora.", "learner.head."))})
    return out


def largest_gap(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the one worker (split over two)")
    args = parser.parse_args(argv)
    half = max(args.threads // 2, 1)
    settings = [(1, args.threads), (1, half), (2, half)]  # (workers, torch threads each)
    runs: dict[tuple[int, int], list[dict]] = {s: [] for s in settings}
    actors = ActorCache()
    try:
        with tempfile.TemporaryDirectory(prefix="memcl-nsr-dp-") as out:
            for _ in range(args.repeats):
                for workers, threads in settings:
                    config = load_config(ROOT / "pipeline" / "configs" / "nsr-bbc-cyclic.yaml", overrides={
                        "runtime.data_parallel": workers, "encoder.threads": threads, "runtime.out": out,
                        "runtime.progress": False, "runtime.num_cpus": args.threads})
                    metrics = runner.run(config, actors=actors).metrics
                    runs[workers, threads].append({"metrics": metrics, "adapters": adapters(metrics)})
    finally:
        actors.close()
    first = runs[settings[0]][0]
    print(f"{os.cpu_count()} cores; {args.repeats} alternating runs per setting, medians\n\n"
          f"| workers | torch threads each | train samples/s | stream s | A_last | same matrix as the first row | "
          "max abs weight difference vs the first row, after visit 1 / at the end |\n|---|---|---|---|---|---|---|")
    for (workers, threads), rs in runs.items():
        stream = statistics.median(r["metrics"]["wall_seconds"]["stream"] for r in rs)
        learned = rs[0]["metrics"]["samples"]["learned"]
        a_last = 100 * rs[0]["metrics"]["summary"]["a_last"]
        early, late = (largest_gap(rs[0]["adapters"][i], first["adapters"][i]) for i in (0, -1))
        same = np.array_equal(np.array(rs[0]["metrics"]["acc_matrix"], float),
                              np.array(first["metrics"]["acc_matrix"], float), equal_nan=True)
        print(f"| {workers} | {threads} | {learned / stream:.1f} | {stream:.1f} | {a_last:.2f} | "
              f"{'yes' if same else 'no'} | {early:.1e} / {late:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
