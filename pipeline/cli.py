"""`memcl`: the one entry point.

    memcl run [--config FILE] [--address auto] [--out DIR] [--seed N] [--resume RUN_DIR] [--set key=value ...]
    memcl report RUN_DIR
    memcl bench SUITE [--seeds 3] [--methods a,b,...] [--out DIR] [--set key=value ...]
    memcl bench throughput [--images 2560] [--image-size 64] [--repeats 3]
    memcl lm [--config FILE] [--address auto] [--out DIR] [--seed N] [--set key=value ...]
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


def cmd_lm(args: argparse.Namespace) -> int:
    from pipeline import lm_runner
    from pipeline.config import load_config

    metrics = lm_runner.run(load_config(args.config, _overrides(args), cls=lm_runner.LMRunConfig))
    print(lm_runner.summary_table(metrics))
    print(f"\nrun folder: {metrics['run_dir']}")
    return 0


def cmd_stress(args: argparse.Namespace) -> int:
    from pipeline.stress import compare, table

    results = compare(args.tasks, args.task_free, _overrides(args), args.signals.split(","))
    first = results[0]
    mode = "task-free" if first["task_free"] else "task boundaries given"
    print(f"stress: {first['tasks']} visits of {first['distinct_tasks']} recurring tasks ({mode}), "
          f"{first['samples']['stream']} samples per run; bound S0 + N_T + 0.05 M, revisit false-expansion rate "
          f"<= 0.05, >= 95 % of novel events detected within 3 blocks, RSS growth < 10 %, last tenth's throughput "
          f">= 0.8 x the second tenth's")
    print(table(results))
    for r in results:
        samples = r["samples"]
        once = samples["learned"] == samples["unique_learned"] == samples["stream"]
        print(f"{r['signal']}: {r['wall_seconds']:.0f} s, every sample learned exactly once: "
              f"{'yes' if once else 'NO'}; run folder {r['run_dir']} (stress.csv, stress.png, stress.json)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline import report

    run_dir = Path(args.run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if "runs" in metrics:  # a `memcl lm` folder: several runs side by side
        from pipeline import lm_runner

        lm_runner.render_lm(run_dir, metrics)
        print(lm_runner.summary_table(metrics))
        return 0
    report.render(run_dir, metrics)
    print(report.summary_table(metrics))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "throughput":
        from pipeline.throughput import table, throughput

        rows = throughput(images=args.images, image_size=args.image_size, out=args.bench_out, repeats=args.repeats)
        print()
        print(table(rows))
        print(f"throughput.csv and throughput.png: {Path(args.bench_out) / 'throughput'}")
        return 0
    from pipeline import bench

    folder = Path(args.bench_out) / args.suite
    if args.render:
        rows = bench.read_runs(folder)
        bench.write_results(folder, bench.suite(args.suite), rows, max(r.seed for r in rows) + 1)
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
        rows = bench.bench(args.suite, seeds=args.seeds, methods=methods, out=args.bench_out,
                           overrides=_overrides(args), progress=args.progress)
    print()
    print(bench.markdown(bench.suite(args.suite), bench.aggregate(rows), max(r.seed for r in rows) + 1))
    print(f"tables, curves and runs: {folder}")
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

    st = sub.add_parser("stress", help="a long-horizon drift stream through the actor pipeline, with resource sampling")
    st.add_argument("--tasks", type=int, default=1000, help="visits of the stream (tasks recur; default 1000)")
    st.add_argument("--task-free", action="store_true", help="give the learner no task boundaries")
    st.add_argument("--out", help="parent folder of the run folder (default: runs/stress)")
    st.add_argument("--seed", type=int, help="the run's seed (the drift stream's own: --set data.drift.seed=N)")
    st.add_argument("--signals", default="reference,paper",
                    help="comma-separated SGSE signals, one run each on the same stream (default reference,paper)")
    st.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value")
    st.set_defaults(func=cmd_stress)

    lm = sub.add_parser("lm", help="MIITA and baselines on a small-LM task stream (SmolLM2-135M without --config)")
    lm.add_argument("--config", help="YAML file overriding the embedded default (pipeline/lm_runner.py LMRunConfig)")
    lm.add_argument("--address", help="join a Ray cluster ('auto' or host:port) instead of starting Ray in-process")
    lm.add_argument("--out", help="parent folder of the run folder (default: runs)")
    lm.add_argument("--seed", type=int)
    lm.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override one config value, e.g. --set budgets=[8192] --set method.adapt.step=0.2")
    lm.set_defaults(func=cmd_lm)

    rep = sub.add_parser("report", help="re-render the tables and plots of a run folder")
    rep.add_argument("run_dir")
    rep.set_defaults(func=cmd_report)

    from pipeline.suites import SUITES

    ben = sub.add_parser("bench", help="every method side by side on one stream (suites: " + ", ".join(SUITES) + ")")
    ben.add_argument("suite", choices=[*sorted(SUITES), "throughput"],
                     help="a suite of methods on one stream, or `throughput`: bare encoder loop vs actor pipeline")
    ben.add_argument("--images", type=int, default=2560, help="throughput: images streamed per case")
    ben.add_argument("--image-size", type=int, default=64, help="throughput: EfficientNet input resolution")
    ben.add_argument("--repeats", type=int, default=3, help="throughput: alternating timings per case (medians)")
    ben.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method (default 3)")
    ben.add_argument("--methods", help="comma-separated subset of the registered methods (default: all)")
    ben.add_argument("--out", dest="bench_out", default="runs/bench", help="parent folder of <suite>/ results")
    ben.add_argument("--address", help="join a Ray cluster ('auto' or host:port) instead of starting Ray in-process")
    ben.add_argument("--progress", action="store_true", help="show each run's progress bars")
    ben.add_argument("--render", action="store_true", help="re-write the tables and plot from <out>/<suite>/runs.csv")
    ben.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value of the suite")
    ben.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
