"""One table per suite of how each method fares under three protocols, from `memcl bench` folders of the same
methods: the stream waits for every consolidation (A_last and test-then-train accuracy), and the stream does not wait
at two rates, the trainers consolidating in the background (prequential accuracy, and the staleness of the
consolidated rows: labelled rows delivered between a row's arrival and the version that learned it). Mean ± std
over the seeds each folder holds; the share of labelled rows the buffer let go where any was.

    M=mars-memcl,mars,mars-analytic,analytic,analytic-rp,finetune,lwf,ewc,derpp,simplecil,slda,ncm,joint,blind
    for s in synthetic-drift bbc-text digits-mnist-fmnist fmnist-5x2; do
      memcl bench $s --seeds 3 --methods $M --set stream.task_free=true --set method.consolidate_every=2 \
        --out runs/waits
      for rate in 1.0 0.05; do
        memcl bench $s --seeds 3 --methods $M --set stream.task_free=true --set method.consolidate_every=2 \
          --set stream.realtime.mode=simulated --set stream.realtime.rate=$rate --out runs/realtime_$rate
      done
    done
    python benchmarks/stream_protocols.py runs/waits runs/realtime_1.0 runs/realtime_0.05

Prints markdown: per suite, a row per method, the winner of each protocol, and the share of its own waiting
test-then-train accuracy each method keeps at every rate.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

COLUMNS = ("a_last", "prequential", "near_future", "let_go", "staleness")


def read(folder: Path) -> dict[str, dict[str, list[float]]]:
    """Per method, each column's values over the seeds (NaN where the run had none); staleness from each run's
    metrics.json."""
    out: dict[str, dict[str, list[float]]] = {}
    with open(folder / "runs.csv", newline="") as f:
        for row in csv.DictReader(f):
            mine = out.setdefault(row["method"], {})
            for key in COLUMNS[:-1]:
                mine.setdefault(key, []).append(float(row.get(key) or "nan"))
            metrics = json.loads((Path(row["run_dir"]) / "metrics.json").read_text())
            staleness = (metrics.get("consolidation") or {}).get("staleness_mean")
            mine.setdefault("staleness", []).append(np.nan if staleness is None else staleness)
    return out


def cell(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    a = np.asarray(values, dtype=float)
    if np.isnan(a).all():
        return "-"
    return f"{scale * a.mean():.{digits}f}" + (f" ± {scale * a.std(ddof=1):.{digits}f}" if len(a) > 1 else "")


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
        head = "| method | A_last | preq. | near-future | staleness |" + "".join(
            f" preq. @{r} | kept @{r} | staleness @{r} |" for r, _ in fast)
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for method in sorted(waits, key=lambda m: -np.nanmean(waits[m]["prequential"])):
            row = waits[method]
            cells = [cell(row["a_last"]), cell(row["prequential"]), cell(row["near_future"]),
                     cell(row["staleness"], 1.0, 0)]
            for _, table in fast:
                other = table.get(method, {})
                preq = other.get("prequential", [np.nan])
                kept = np.nanmean(preq) / np.nanmean(row["prequential"])
                let_go = np.nanmean(other.get("let_go", [np.nan]))
                cells += [cell(preq), f"{100 * kept:.0f} %" + (f" (let go {100 * let_go:.1f} %)" if let_go > 0 else ""),
                          cell(other.get("staleness", [np.nan]), 1.0, 0)]
            print(f"| {method} | " + " | ".join(cells) + " |")
        winners = [("A_last", waits, "a_last"), ("prequential (waits)", waits, "prequential")]
        winners += [(f"prequential @{r}", table, "prequential") for r, table in fast]
        print("\n" + "; ".join(f"best {what}: {max(t, key=lambda m, k=key, t=t: np.nanmean(t[m][k]))}"
                               for what, t, key in winners) + "\n")


if __name__ == "__main__":
    main()
