"""A trainer as 1 and as 2 data-parallel workers (`runtime.data_parallel`) on the same stream, side by side:
training throughput, and whether the two learn the same thing (the accuracy matrix, the trained weights' largest
difference after the first round and at the end).

`--trainer nsr`: NSR's adapter trainer on pipeline/configs/nsr-bbc-cyclic.yaml (pretrained MiniLM, BBC News
A B C A B C). `--trainer lora`: `memcl lm`'s LoRA baseline on its default stream (SmolLM2-135M-Instruct, five tasks
of 24 training pairs, three epochs each). Three settings on the same cores: one worker with `--threads` torch
threads, one worker with `--threads / 2`, and two workers with `--threads / 2` each. The second is the control: the
same learning as the first with the float sums in another order (fewer threads), so its difference from the first is
what float order alone does here. The settings alternate for `--repeats` runs each; the table gives medians.

    python benchmarks/data_parallel.py --trainer nsr --repeats 2
    python benchmarks/data_parallel.py --trainer lora --repeats 2
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
from memcl.pipeline.lm import LMRunConfig

ROOT = Path(__file__).resolve().parents[1]


def trained_weights(folder: Path, role: str, prefixes: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    """The trained weights after each round (one checkpoint each)."""
    out = []
    for path in sorted((folder / "checkpoints").glob("ckpt-*.npz")):
        parts, _ = checkpoint.read(path)
        out.append({k: v for k, v in parts[role].items() if k.startswith(prefixes)})
    return out


def nsr_run(workers: int, threads: int, out: str, cores: int, actors: ActorCache) -> dict:
    config = load_config(ROOT / "pipeline" / "configs" / "nsr-bbc-cyclic.yaml", overrides={
        "runtime.data_parallel": workers, "encoder.threads": threads, "runtime.out": out,
        "runtime.progress": False, "runtime.num_cpus": cores})
    metrics = runner.run(config, actors=actors).metrics
    return {"acc": metrics["acc_matrix"], "a_last": metrics["summary"]["a_last"],
            "rows_per_s": metrics["samples"]["learned"] / metrics["wall_seconds"]["stream"],
            "weights": trained_weights(Path(metrics["run_dir"]), "adapter_trainer", ("learner.lora.", "learner.head."))}


def lora_run(workers: int, threads: int, out: str, cores: int, actors: ActorCache) -> dict:
    config = load_config(overrides={"methods": ["lora"], "runtime.data_parallel": workers,
                                    "runtime.actor_threads": threads, "runtime.out": out, "runtime.progress": False,
                                    "runtime.num_cpus": cores}, cls=LMRunConfig)
    metrics = runner.run(config, actors=actors).metrics
    run = metrics["runs"]["lora"]
    epochs = config.method.finetune.optim.epochs
    return {"acc": run["acc_matrix"], "a_last": run["summary"]["a_last"],
            "rows_per_s": run["samples"]["learned"] * epochs / run["wall_seconds"]["consolidate"],
            "weights": trained_weights(Path(metrics["run_dir"], "runs", "lora"), "lm_trainer", ("lora.",))}


def largest_gap(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", choices=("nsr", "lora"), default="nsr")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the one worker (split over two)")
    args = parser.parse_args(argv)
    one_run = nsr_run if args.trainer == "nsr" else lora_run
    half = max(args.threads // 2, 1)
    settings = [(1, args.threads), (1, half), (2, half)]  # (workers, torch threads each)
    runs: dict[tuple[int, int], list[dict]] = {s: [] for s in settings}
    actors = ActorCache()
    try:
        with tempfile.TemporaryDirectory(prefix="memcl-dp-") as out:
            for _ in range(args.repeats):
                for workers, threads in settings:
                    runs[workers, threads].append(one_run(workers, threads, out, args.threads, actors))
    finally:
        actors.close()
    first = runs[settings[0]][0]
    unit = "rows" if args.trainer == "nsr" else "pairs (x epochs)"
    print(f"{args.trainer}: {os.cpu_count()} cores; {args.repeats} alternating runs per setting, medians\n\n"
          f"| workers | torch threads each | trained {unit}/s | A_last | same matrix as the first row | "
          "max abs weight difference vs the first row, after round 1 / at the end |\n|---|---|---|---|---|---|")
    for (workers, threads), rs in runs.items():
        speed = statistics.median(r["rows_per_s"] for r in rs)
        early, late = (largest_gap(rs[0]["weights"][i], first["weights"][i]) for i in (0, -1))
        same = np.array_equal(np.array(rs[0]["acc"], float), np.array(first["acc"], float), equal_nan=True)
        print(f"| {workers} | {threads} | {speed:.1f} | {100 * rs[0]['a_last']:.2f} | {'yes' if same else 'no'} | "
              f"{early:.1e} / {late:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
