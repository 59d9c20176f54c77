"""From the paper's MARS to memcl's, one extension at a time, and the paper's ablations on the paper's MARS.

On one bench suite, with `memcl bench`'s runs (pipeline/bench.py: the same actors, stream, seeds and tables):

* `paper/`: `mars` (the paper's method), its four ablations (`mars-no-sgse`, `mars-no-anchor`, `mars-no-stage1`,
  `mars-no-stage2`) and DER++, by default and at `mars`'s bytes (`derpp@mars`);
* `step-K-NAME/`: `mars-memcl` with the extensions after the K-th of `EXTENSIONS` (memcl_ops/mars/methods.py)
  turned off, so step K adds the K-th to step K - 1; the last step is `mars-memcl` itself.

Then `steps.md` beside them: the additive table (A_last of each step, its change against the step before, and the
seeds' spread) and the ablation table (each ablation's A_last against `mars`'s), read from the folders' runs.csv.

    python -m benchmarks.mars_steps fmnist-5x2 --seeds 3 --out runs/mars-steps
    python -m benchmarks.mars_steps fmnist-5x2 --only paper          # one part (paper, or a step's number)
    python -m benchmarks.mars_steps fmnist-5x2 --render              # steps.md from the folders already there
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from memcl.pipeline import bench
from memcl_ops.mars.methods import EXTENSIONS

PAPER = ["mars", "mars-no-sgse", "mars-no-anchor", "mars-no-stage1", "mars-no-stage2", "derpp"]


def step_folder(k: int) -> str:
    return "paper" if k == 0 else f"step-{k}-{EXTENSIONS[k - 1].name}"


def step_overrides(k: int) -> dict[str, object]:
    """`method.` settings of step k: every extension after the k-th off."""
    return {f"method.{key}": value for ext in EXTENSIONS[k:] for key, value in ext.paper.items()}


def run(suite: str, seeds: int, out: Path, parts: list[str], extra: dict[str, object]) -> None:
    for k in range(len(EXTENSIONS) + 1):
        if parts and step_folder(k) not in parts and str(k) not in parts:
            continue
        folder = out / step_folder(k)
        if k == 0:
            bench.bench(suite, seeds=seeds, methods=PAPER, out=folder, overrides=extra, equal_bytes=["mars"])
        else:
            bench.bench(suite, seeds=seeds, methods=["mars-memcl"], out=folder,
                        overrides={**step_overrides(k), **extra})


def a_last(folder: Path, suite: str, label: str) -> np.ndarray:
    rows = [r for r in bench.read_runs(folder / suite) if r.label == label]
    return np.array([100 * r.summary["a_last"] for r in sorted(rows, key=lambda r: r.seed)])


def mean_std(values: np.ndarray) -> str:
    return f"{values.mean():.2f} ± {values.std(ddof=1) if len(values) > 1 else 0.0:.2f}"


def render(suite: str, out: Path) -> str:
    """The additive table and the ablation table, from the runs.csv files there."""
    lines = [f"### {suite}: from the paper's MARS to memcl's, one extension at a time", "",
             "| step | adds | A_last | change against the step before (mean ± std over seeds, paired by seed) |",
             "|---|---|---|---|"]
    before = None
    for k in range(len(EXTENSIONS) + 1):
        folder = out / step_folder(k)
        if not (folder / suite / "runs.csv").exists():
            lines.append(f"| {k} | {EXTENSIONS[k - 1].name if k else 'mars (the paper)'} | not run | |")
            before = None
            continue
        now = a_last(folder, suite, "mars" if k == 0 else "mars-memcl")
        name = "`mars`, the paper's method" if k == 0 else f"{EXTENSIONS[k - 1].name}: {EXTENSIONS[k - 1].summary}"
        change = "" if before is None or len(before) != len(now) else mean_std(now - before)
        lines.append(f"| {k} | {name} | {mean_std(now)} | {change} |")
        before = now
    paper = out / "paper"
    if (paper / suite / "runs.csv").exists():
        full = a_last(paper, suite, "mars")
        lines += ["", f"### {suite}: the paper's ablations on the paper's MARS", "",
                  "| method | A_last | against `mars` (paired by seed) |", "|---|---|---|"]
        for label in [*PAPER[:5], "derpp", "derpp@mars"]:
            values = a_last(paper, suite, label)
            if len(values):
                lines.append(f"| {label} | {mean_std(values)} | "
                             f"{'' if label == 'mars' else mean_std(values - full)} |")
        notes = bench.read_notes(paper / suite)
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="runs/mars-steps")
    parser.add_argument("--only", action="append", default=[], help="a part to run: paper, or a step's number")
    parser.add_argument("--render", action="store_true", help="only write steps.md from the folders there")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a suite override for all")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.render:
        extra = dict(item.split("=", 1) for item in args.set)
        run(args.suite, args.seeds, out, args.only, {k: _value(v) for k, v in extra.items()})
    text = render(args.suite, out)
    (out / f"{args.suite}-steps.md").write_text(text)
    print(text)
    return 0


def _value(text: str) -> object:
    import yaml

    return yaml.safe_load(text)


if __name__ == "__main__":
    raise SystemExit(main())
