"""Are two `memcl bench` runs the same result? Compares the runs.csv of two bench folders field by field (every
method and seed both hold): A_last, Ā, forgetting, BWT, memory bytes and the accuracy curve; times are ignored.

    python benchmarks/compare_runs.py runs/old/bbc-text runs/new/bbc-text

Prints one line per run that differs and a count; exits 1 if any run differs or is missing from either side.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

FIELDS = ("a_last", "a_mean", "forgetting", "bwt", "memory_bytes", "curve")


def runs(folder: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(folder / "runs.csv", newline="") as f:
        return {(row["method"], row["seed"]): row for row in csv.DictReader(f)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="a bench suite folder (holding runs.csv)")
    parser.add_argument("second", type=Path)
    args = parser.parse_args()
    a, b = runs(args.first), runs(args.second)
    differ = 0
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b:
            print(f"{key[0]} seed {key[1]}: only in {args.first if key in a else args.second}")
            differ += 1
            continue
        fields = [f for f in FIELDS if a[key][f] != b[key][f]]
        if fields:
            print(f"{key[0]} seed {key[1]}: " + ", ".join(f"{f} {a[key][f]} vs {b[key][f]}" for f in fields))
            differ += 1
    total = len(a.keys() | b.keys())
    print(f"{total - differ} of {total} runs identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
