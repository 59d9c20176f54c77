"""The boundary run and the task-free run of the same stream, side by side: reads the results.csv of two
`memcl bench SUITE` folders (one with `--set stream.task_free=false`, one with `=true`) and prints one markdown row
per method: A_last of each (mean ± std over seeds), their difference, and Ā of each.

    python benchmarks/task_free_beside.py runs/boundary/bbc-text runs/task-free/bbc-text

Methods missing from the task-free run (not run, or not task-free) show the boundary run only.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def results(folder: Path) -> dict[str, dict[str, str]]:
    with open(folder / "results.csv", newline="") as f:
        return {row["method"]: row for row in csv.DictReader(f)}


def points(row: dict[str, str], field: str) -> str:
    return f"{100 * float(row[field + '_mean']):.2f} ± {100 * float(row[field + '_std']):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("boundary", type=Path, help="bench suite folder of the run with task boundaries")
    parser.add_argument("task_free", type=Path, help="bench suite folder of the task-free run of the same stream")
    args = parser.parse_args()
    bounded, free = results(args.boundary), results(args.task_free)
    print("| method | role | seeds | A_last boundaries | A_last task-free | task-free − boundaries | Ā boundaries | "
          "Ā task-free |")
    print("|---|---|---|---|---|---|---|---|")
    for method, row in bounded.items():
        other = free.get(method)
        gap = f"{100 * (float(other['a_last_mean']) - float(row['a_last_mean'])):+.2f}" if other else "–"
        free_last = points(other, "a_last") if other else "(not in the task-free run)"
        free_mean = points(other, "a_mean") if other else "–"
        print(f"| {method} | {row['role']} | {row['seeds']} | {points(row, 'a_last')} | {free_last} | {gap} | "
              f"{points(row, 'a_mean')} | {free_mean} |")


if __name__ == "__main__":
    main()
