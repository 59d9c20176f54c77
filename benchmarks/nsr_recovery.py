"""NSR recovery benchmark: how many optimizer steps a returning task needs to be back within 1 point of its
previous best, with NSR's bank vs the memoryless allocation rules, side by side in one run (docs/methods.md, "NSR").

Stream and model: pipeline/configs/nsr-bbc-cyclic.yaml — BBC News (offline) as three binary topic tasks visited
A B C A B C through the real actor pipeline (`memcl run` with `method: nsr`), the pretrained all-MiniLM-L6-v2 with
LoRA r = 8 on query/value. Each allocation rule runs the same stream with the same seed:

* bank  — NSR: restore / warm-start / fresh by key similarity (the bank keeps compressed adapters and heads)
* fresh — memoryless: a fresh adapter and head at every arrival
* keep  — memoryless: keep whatever the previous visit left

Recovery of a returning visit = steps until accuracy on the task's test rows is ≥ previous best − 1 point, where
step 0 is right after the arrival decision and the previous best is the best accuracy measured while the task was
active. Tracking stops at the end of the visit: a task not back by then is censored (its count is a lower bound).

    python benchmarks/nsr_recovery.py --seeds 0 1 2   # the RESULTS.md numbers (~10 min per seed on 2 shared cores)
    python benchmarks/nsr_recovery.py --probe 32      # short probes: noisy task keys (RESULTS.md)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from memcl.pipeline import runner
from memcl.pipeline.config import load_config
from memcl_ops import files

CONFIG = Path(__file__).resolve().parents[1] / "pipeline" / "configs" / "nsr-bbc-cyclic.yaml"
ALLOCATIONS = ("bank", "fresh", "keep")


def config(args: argparse.Namespace, allocation: str, seed: int):
    """pipeline/configs/nsr-bbc-cyclic.yaml, with the allocation rule and any size the command line changes."""
    overrides = {"method.nsr.allocation": allocation, "seed": seed, "stream.sample_seed": seed,
                 "runtime.out": args.out, "runtime.progress": False}
    base = load_config(CONFIG)
    if args.cycles is not None:
        overrides["stream.visits"] = list(range(base.stream.tasks)) * args.cycles
    if args.train_per_class is not None:
        overrides["stream.train_per_class"] = args.train_per_class
        overrides["method.nsr.recovery_max_steps"] = 2 * args.train_per_class // base.method.nsr.batch_size
    for key, value in (("stream.test_per_class", args.test_per_class), ("method.nsr.probe_size", args.probe),
                       ("encoder.spec.max_length", args.max_length)):
        if value is not None:
            overrides[key] = value
    return load_config(CONFIG, overrides)


def row(allocation: str, seed: int, m: dict, seconds: float) -> dict:
    returning = m["recovery"]["returning_visits"]
    bank = m["bank"]["entries"] if m["bank"] else []
    own, other = [], []  # key similarity of a returning visit to its own stored entry / to the other entries
    for e in m["round_log"]:
        sims = {int(k): v for k, v in ((e.get("retrieval") or {}).get("similarities") or {}).items()}
        if e["task"] in sims:
            own.append(sims[e["task"]])
            other += [v for k, v in sims.items() if k != e["task"]]
    return {
        "allocation": allocation, "seed": seed,
        "arrivals": [e["arrival"] for e in m["round_log"]],
        "steps": [r["steps"] for r in returning],
        "censored": [r["censored"] for r in returning],
        "start_accuracy": [r["start_accuracy"] for r in returning],
        "previous_best": [r["previous_best"] for r in returning],
        "live_accuracy": [e["acc_live"] for e in m["round_log"]],
        "stored_accuracy": [e["acc_stored"] for e in m["round_log"]],
        "final_accuracy": m["final_accuracy_all_tasks"],
        "acc_matrix": m["acc_matrix"],
        "bank_bytes": m["memory_bytes"].get("bank", 0),  # the memoryless rules keep none
        "bank_entries": len(bank),
        "kept_ranks": sorted({r for e in bank for r in e["ranks"].values()}),
        "own_similarity": own, "other_similarity": other,
        "seconds": seconds,
        "run_dir": m["run_dir"],
    }


def aggregate(rows: list[dict]) -> dict[str, dict]:
    """Per allocation, over seeds: every returning visit's steps (a censored one counts its tracked steps, so the
    mean is a lower bound), accuracy at return, final accuracy, bank bytes, wall time."""
    out = {}
    for allocation in ALLOCATIONS:
        mine = [r for r in rows if r["allocation"] == allocation]
        steps = [s for r in mine for s in r["steps"]]
        out[allocation] = {
            "arrivals": {k: sum(r["arrivals"].count(k) for r in mine) for k in ("restore", "warm", "fresh", "keep")},
            "per_seed": "; ".join(f"s{r['seed']}: " + " ".join(f"≥{s}" if c else str(s)
                                                              for s, c in zip(r["steps"], r["censored"]))
                                  for r in mine),
            "mean_steps": float(np.mean(steps)), "censored": sum(c for r in mine for c in r["censored"]),
            "returning": len(steps),
            "start_accuracy": float(np.mean([a for r in mine for a in r["start_accuracy"]])),
            "final_accuracy": float(np.mean([r["final_accuracy"] for r in mine])),
            "bank_bytes": float(np.mean([r["bank_bytes"] for r in mine])),
            "bank_entries": float(np.mean([r["bank_entries"] for r in mine])),
            "seconds": float(sum(r["seconds"] for r in mine)),
        }
    return out


def table(agg: dict[str, dict]) -> str:
    lines = ["| allocation | arrivals | steps to recover, per seed and returning visit | mean steps | accuracy at "
             "return | final accuracy, all tasks | bank bytes (entries) | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for allocation, a in agg.items():
        arrivals = ", ".join(f"{n} {k}" for k, n in a["arrivals"].items() if n)
        lines.append(f"| {allocation} | {arrivals} | {a['per_seed']} | {a['mean_steps']:.2f} | "
                     f"{100 * a['start_accuracy']:.1f} | {100 * a['final_accuracy']:.1f} | "
                     f"{a['bank_bytes']:,.0f} ({a['bank_entries']:.0f}) | {a['seconds']:.0f} |")
    return "\n".join(lines)


def ratios(agg: dict[str, dict]) -> list[str]:
    bank = agg["bank"]["mean_steps"]
    out = []
    for allocation in ALLOCATIONS[1:]:
        a = agg[allocation]
        if bank == 0:
            ratio = "∞ (the bank needs 0 steps)" if a["mean_steps"] > 0 else "1 (both 0)"
        else:
            ratio = f"{a['mean_steps'] / bank:.1f}x"
        note = ""
        if agg["bank"]["censored"]:  # both means are lower bounds: their ratio is no bound at all
            note = " (indicative only: some visits of both rules censored)"
        elif a["censored"]:
            note = f" (a lower bound: {a['censored']} of {a['returning']} visits censored)"
        out.append(f"{allocation} / bank mean recovery steps: {ratio}{note}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, help="times the A B C cycle is streamed (config: 2)")
    parser.add_argument("--train-per-class", type=int, help="training texts per class and visit (config: 96)")
    parser.add_argument("--test-per-class", type=int, help="test texts per class (config: 40)")
    parser.add_argument("--max-length", type=int, help="tokens per text (config: 32)")
    parser.add_argument("--probe", type=int, help="rows of a visit that make its task key (config: 128)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (sample order, adapter init)")
    parser.add_argument("--out", default="runs/nsr_recovery", help="parent folder of the run folders")
    parser.add_argument("--json", help="also write the per-run rows as JSON here")
    args = parser.parse_args(argv)

    actors = runner.ActorCache()
    rows = []
    try:
        for seed in args.seeds:
            for allocation in ALLOCATIONS:
                t0 = time.perf_counter()
                metrics = runner.run(config(args, allocation, seed), actors=actors).metrics
                rows.append(row(allocation, seed, metrics, time.perf_counter() - t0))
                print(f"seed {seed} {allocation}: done in {rows[-1]['seconds']:.0f} s ({metrics['run_dir']})",
                      flush=True)
    finally:
        actors.close()
    agg = aggregate(rows)
    print()
    print(table(agg))
    print()
    for line in ratios(agg):
        print(line)
    banks = [r for r in rows if r["allocation"] == "bank"]
    own = [s for r in banks for s in r["own_similarity"]]
    other = [s for r in banks for s in r["other_similarity"]]
    if own:
        print(f"bank: key cosine of a returning task to its own entry {min(own):.3f}-{max(own):.3f}, to other "
              f"tasks' entries {min(other):.3f}-{max(other):.3f} (restore at >= tau_same)")
    print("bank: kept ranks " + str(sorted({k for r in banks for k in r["kept_ranks"]})) + ", live/stored accuracy "
          "at each store: " + "; ".join(" ".join(f"{100 * a:.0f}/{100 * b:.0f}" for a, b in
                                                 zip(r["live_accuracy"], r["stored_accuracy"])) for r in banks))
    if args.json:
        files.write_json(args.json, rows, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
