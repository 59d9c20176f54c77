"""MIITA's reliability gate chosen on dev data across streams at once (docs/methods.md, "vote record and reliability
gate"; benchmarks/RESULTS.md, "MIITA that abstains where answers do not repeat").

    python -m benchmarks.miita_gate                                   # partly, format, open; 8 KiB; seed 0
    python -m benchmarks.miita_gate --streams open partly --levels off 0
    python -m benchmarks.miita_gate --tiny                            # a tiny random LM (checks the script)

On each stream's dev split (a held-out quarter of each task's training pairs; no test item is seen), the frozen base
and MIITA at each `adapt.min_advantage` level of the vote gate ("off": no gate, the memory steers every position it
has a token for), each stream with the answer positions its own dev grid chose (benchmarks/RESULTS.md). Prints dev OP
per stream and level, MIITA's margin over the base, and the gate level whose worst margin over the base is the highest
(then the best mean dev OP; one level for every stream: no stream gets its own).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from benchmarks.miita_fair import base_config, streams, with_knobs
from memcl.pipeline import runner
from memcl.pipeline.actor_cache import ActorCache
from memcl_ops import files

LEVELS = ("off", "0", "0.1", "0.25")
# answer positions per stream as the dev grids of benchmarks/RESULTS.md chose them (open: the default, 8)
POSITIONS = {"partly": 2, "format": 8, "open": 8}


def dev_op(config, actors: ActorCache, method: str, knobs: dict) -> float:
    dev = replace(config, seed=0, methods=(method,), budgets=(8192,),
                  stream=replace(config.stream, seed=0, evaluate_on="dev"))
    runs = runner.run(with_knobs(dev, knobs), actors=actors).metrics["runs"]
    return float(next(iter(runs.values()))["summary"]["a_last"])


def gate_knobs(level: str) -> dict:
    return {"adapt.vote_gate": False} if level == "off" else {"adapt.vote_gate": True,
                                                               "adapt.min_advantage": float(level)}


def choose(table: dict[str, dict[str, float]], levels: list[str]) -> str:
    """The gate level whose worst margin over the base is the highest; ties: the higher mean dev OP, then the lower
    level ("off" is measured beside them, never chosen)."""
    def key(level: str) -> tuple[float, float, float]:
        margins = [row[level] - row["base"] for row in table.values()]
        return (round(min(margins), 6), round(float(np.mean([row[level] for row in table.values()])), 6),
                -float(level))
    return max((lv for lv in levels if lv != "off"), key=key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", nargs="+", default=list(POSITIONS))
    parser.add_argument("--levels", nargs="+", default=list(LEVELS), help="min_advantage values, or off")
    parser.add_argument("--tiny", action="store_true", help="a tiny random LM on a small stream (checks the script)")
    parser.add_argument("--out", default="runs/bench/miita_gate")
    args = parser.parse_args()
    available = streams(args.tiny)
    chosen = list(available) if args.tiny else args.streams
    unknown = [s for s in chosen if s not in available]
    if unknown:
        parser.error(f"unknown stream(s) {unknown}; known: {list(available)}")
    actors, started, table = ActorCache(), time.perf_counter(), {}
    try:
        for name in chosen:
            config = base_config(available[name], args.tiny, args.out)
            knobs = {"memory.positions": POSITIONS.get(name, 8), "memory.centre_keys": False}
            row = {"base": dev_op(config, actors, "base", {})}
            for level in args.levels:
                row[level] = dev_op(config, actors, "miita", {**knobs, **gate_knobs(level)})
            table[name] = row
            print(f"{name}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in row.items()), flush=True)
    finally:
        actors.close()
    best = choose(table, args.levels)
    print("\n| stream | base | " + " | ".join(f"miita, gate {lv}" for lv in args.levels) + " |")
    print("|---" * (2 + len(args.levels)) + "|")
    for name, row in table.items():
        cells = " | ".join(f"{100 * row[lv]:.1f} ({100 * (row[lv] - row['base']):+.1f})" for lv in args.levels)
        print(f"| {name} | {100 * row['base']:.1f} | {cells} |")
    seconds = time.perf_counter() - started
    print(f"\nchosen min_advantage: {best} (the highest worst margin over the base, then the best mean); "
          f"{seconds:.0f} s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    files.write_json(Path(args.out, "gate.json"), {"table": table, "chosen": best, "seconds": seconds})


if __name__ == "__main__":
    main()
