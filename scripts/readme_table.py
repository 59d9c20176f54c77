"""The README's table of what the default run reaches (and the A_last line of its sample output), written from the
runs themselves so they cannot go stale: `memcl run` (memcl's MARS, `mars-memcl`), `memcl run --set method.name=mars`
(the MaRS paper's method) and `memcl run --set method.name=finetune`, seed 0, each through `memcl.run`.

    python scripts/readme_table.py           # run the three, rewrite the table in README.md
    python scripts/readme_table.py --check   # run the three, exit 1 if README.md's table differs

tests/slow/test_readme_table.py runs the check."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from memcl_ops import files
from memcl_ops.metrics import figure_text

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- default-run-table: scripts/readme_table.py writes it -->", "<!-- /default-run-table -->"
RUNS = (("mars-memcl (memcl's MARS)", "mars-memcl"), ("mars (the paper's MARS)", "mars"), ("finetune", "finetune"))


def measure(out: str) -> dict[str, dict]:
    """Each method's summary of the default run (seed 0), in README's order."""
    import memcl

    return {label: memcl.run(method, {"runtime.out": out}).metrics["summary"] for label, method in RUNS}


def table(summaries: dict[str, dict]) -> str:
    pct = figure_text
    lines = ["| method | A_last | Ā | forgetting | BWT |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {pct(s['a_last'])} | {pct(s['a_mean'])} | {pct(s['forgetting'])} | {pct(s['bwt'])} |"
              for label, s in summaries.items()]
    return "\n".join(lines)


def summary_line(s: dict) -> str:
    """The A_last line `memcl run` prints (pipeline/report.py)."""
    pct = figure_text
    return f"A_last {pct(s['a_last'])}   Ā {pct(s['a_mean'])}   forgetting {pct(s['forgetting'])}   BWT {pct(s['bwt'])}"


def readme_table(text: str) -> str:
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, flags=re.S)
    if found is None:
        raise SystemExit(f"{README}: no table between {BEGIN} and {END}")
    return found.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's table is not what the runs give")
    parser.add_argument("--out", default="runs/readme", help="parent folder of the run folders")
    args = parser.parse_args()
    text = README.read_text()
    summaries = measure(args.out)
    written, measured = readme_table(text), table(summaries)
    line_written = re.search(r"^A_last .*$", text, flags=re.M)
    line_measured = summary_line(summaries[RUNS[0][0]])  # the sample output is `memcl run`'s
    if args.check:
        if written != measured or line_written is None or line_written.group(0) != line_measured:
            print(f"README.md is stale; the runs give:\n{measured}\n{line_measured}", file=sys.stderr)
            return 1
        print("README.md's table and sample output are what the runs give")
        return 0
    text = text.replace(written, measured)
    if line_written is not None:
        text = text.replace(line_written.group(0), line_measured)
    files.write_text(README, text)
    print(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
