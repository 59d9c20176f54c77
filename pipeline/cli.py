"""`memcl`: the one entry point.

    memcl run [--config FILE] [--address auto] [--out DIR] [--seed N] [--resume RUN_DIR] [--set key=value ...]
    memcl report RUN_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _overrides(args: argparse.Namespace) -> dict:
    out = {}
    for item in args.set or []:
        key, _, value = item.partition("=")
        if not key or not _:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    if getattr(args, "address", None):
        out["runtime.address"] = args.address
    if getattr(args, "out", None):
        out["runtime.out"] = args.out
    if getattr(args, "seed", None) is not None:
        out["seed"] = args.seed
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline import report, runner
    from pipeline.config import load_config

    if args.resume:
        metrics = runner.run(resume=Path(args.resume))
    else:
        metrics = runner.run(load_config(args.config, _overrides(args)))
    print(report.summary_table(metrics))
    print(f"\nrun folder: {metrics['run_dir']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline import report

    run_dir = Path(args.run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    report.render(run_dir, metrics)
    print(report.summary_table(metrics))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memcl", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one continual-learning stream (the embedded default without --config)")
    run.add_argument("--config", help="YAML file overriding the embedded default")
    run.add_argument("--address", help="join a Ray cluster ('auto' or host:port) instead of starting Ray in-process")
    run.add_argument("--out", help="parent folder of the run folder (default: runs)")
    run.add_argument("--seed", type=int)
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its last good checkpoint")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override one config value, e.g. --set method.name=finetune")
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser("report", help="re-render the tables and plots of a run folder")
    rep.add_argument("run_dir")
    rep.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
