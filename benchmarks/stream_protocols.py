"""One table per suite of how each method fares under three protocols, from `memcl bench` folders of the same
methods: the stream waits (test-then-train accuracy and A_last), and the stream does not wait at two rates
(prequential accuracy and the share of labelled rows skipped). Mean over the seeds each folder holds.

    for s in synthetic-drift bbc-text digits-mnist-fmnist fmnist-5x2; do
      memcl bench $s --seeds 3 --set stream.task_free=true --set method.consolidate_every=2 --out runs/preq
      for rate in 1.0 0.05; do
        memcl bench $s --seeds 1 --set stream.task_free=true --set method.consolidate_every=2 \\
          --set stream.realtime.mode=simulated --set stream.realtime.rate=$rate --out runs/realtime_$rate
      done
    done
    python benchmarks/stream_protocols.py runs/preq runs/realtime_1.0 runs/realtime_0.05

Prints markdown: per suite, a row per method, and the winner of each protocol.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def read(folder: Path) -> dict[str, dict[str, list[float]]]:
    """Per method, each column's values over the seeds (NaN where the run had none)."""
    out: dict[str, dict[str, list[float]]] = {}
    with open(folder / "runs.csv", newline="") as f:
        for row in csv.DictReader(f):
            mine = out.setdefault(row["method"], {})
            for key in ("a_last", "prequential", "near_future", "skipped"):
                mine.setdefault(key, []).append(float(row.get(key) or "nan"))
    return out


def cell(values: list[float]) -> str:
    a = np.asarray(values, dtype=float)
    if np.isnan(a).all():
        return "-"
    return f"{100 * a.mean():.2f}" + (f" ± {100 * a.std(ddof=1):.2f}" if len(a) > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("waits", type=Path, help="bench output folder of the stream that waits (holds SUITE/)")
    parser.add_argument("realtime", type=Path, nargs="*", help="bench output folders of the stream that does not "
                        "wait, one per rate (named ..._RATE)")
    args = parser.parse_args()
    for suite in sorted(p.name for p in args.waits.iterdir() if (p / "runs.csv").exists()):
        waits = read(args.waits / suite)
        fast = [(folder.name.rsplit("_", 1)[-1], read(folder / suite)) for folder in args.realtime
                if (folder / suite / "runs.csv").exists()]
        print(f"### {suite}\n")
        head = "| method | A_last | preq. | near-future |" + "".join(f" preq. @{r} | skipped @{r} |" for r, _ in fast)
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for method in sorted(waits, key=lambda m: -np.nanmean(waits[m]["prequential"])):
            row = waits[method]
            cells = [cell(row["a_last"]), cell(row["prequential"]), cell(row["near_future"])]
            for _, table in fast:
                other = table.get(method, {})
                cells += [cell(other.get("prequential", [np.nan])), cell(other.get("skipped", [np.nan]))]
            print(f"| {method} | " + " | ".join(cells) + " |")
        winners = [("A_last", waits, "a_last"), ("prequential (waits)", waits, "prequential")]
        winners += [(f"prequential @{r}", table, "prequential") for r, table in fast]
        print("\n" + "; ".join(f"best {what}: {max(t, key=lambda m, k=key, t=t: np.nanmean(t[m][k]))}"
                               for what, t, key in winners) + "\n")


if __name__ == "__main__":
    main()
