"""`memcl`: the one entry point. `memcl <command> --help` describes each command; `--debug` on any of them
shows the full traceback of an error (otherwise an error is one line on stderr and a non-zero exit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml


def _overrides(args: argparse.Namespace) -> dict:
    from memcl.pipeline.config import ConfigError

    out = {}
    for item in args.set or []:
        key, _, value = item.partition("=")
        if not key or not _:
            raise ConfigError(f"--set expects key=value (e.g. --set stream.tasks=5), got {item!r}")
        out[key] = yaml.safe_load(value)
    if getattr(args, "address", None):
        out["runtime.address"] = args.address
    if getattr(args, "out", None):
        out["runtime.out"] = args.out
    if getattr(args, "seed", None) is not None:
        out["seed"] = args.seed
    if args.func is cmd_lm and args.methods:
        out["methods"] = [m for m in args.methods.split(",") if m]
    if args.func is cmd_lm and args.budgets:
        try:
            out["budgets"] = [int(b) for b in args.budgets.split(",") if b]
        except ValueError:
            raise ConfigError(f"--budgets expects comma-separated byte counts (e.g. 16384,65536), got "
                              f"{args.budgets!r}") from None
    if getattr(args, "chaos", None) is not None and args.func is not cmd_stress:  # stress runs fault-free beside it
        out["runtime.chaos_seconds"] = args.chaos
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from memcl.pipeline import runner
    from memcl.pipeline.config import load_config

    if args.resume:
        return _report(runner.run(resume=Path(args.resume)), strict=args.strict)
    config = load_config(args.config, _overrides(args))
    if args.check:
        from memcl.pipeline import preflight

        spec = preflight.check_run(preflight.with_absolute_paths(config))
        given = preflight.payload_of(config) == "features"  # frozen features: no encoder runs
        print(f"memcl: the run can start: {spec.name} ({spec.family}) on {config.data.dataset}, "
              + ("features as given (no encoder)" if given else f"encoder {config.encoder.spec.name}"))
        return 0
    return _report(runner.run(config), strict=args.strict)


def cmd_lm(args: argparse.Namespace) -> int:
    from memcl.pipeline import lm, runner
    from memcl.pipeline.config import load_config

    if args.resume:
        return _report(runner.run(resume=Path(args.resume)))
    config = load_config(args.config, _overrides(args), cls=lm.LMRunConfig)
    if args.check:
        specs, tasks = lm.check_config(config)
        print(f"memcl: the runs can start: {', '.join(s.name for s in specs)} on {len(tasks)} tasks, "
              f"model {config.model.name}")
        return 0
    return _report(runner.run(config))


def _report(result, strict: bool = False) -> int:
    """Print a finished run's tables and folder (a `memcl lm` run's too, whichever command resumed it); a run that
    learned nothing is a failed run, whatever it wrote, and with `strict` so is a run that refused any row."""
    from memcl.pipeline import lm, report

    if isinstance(result, lm.LMResult):
        print(lm.summary_table(result.metrics))
        print(f"\nrun folder: {result.run_dir}")
        return 0
    print(report.summary_table(result.metrics))
    print(f"\nrun folder: {result.run_dir}")
    samples = result.samples
    if not samples.learned:
        if not samples.stream:
            why = "the source streamed no rows"
        else:
            reasons = ", ".join(f"{r} {n}" for r, n in samples.refused_by_reason.items())
            why = (f"{samples.refused} of {samples.stream} training rows refused ({reasons}); "
                   f"{report.commonest_refusal(samples.refused_by_reason, result.run_dir)}; the rows are in "
                   f"{result.run_dir}/dead_letters/")
        print(f"memcl: error: nothing was learned: {why}", file=sys.stderr)
        return 1
    if samples.refused or samples.refused_test:
        split = "train" if samples.refused else "test"
        commonest = report.commonest_refusal(samples.refused_by_reason or samples.refused_test_by_reason,
                                             result.run_dir, split)
        print(f"memcl: {'error' if strict else 'warning'}: {refusal_line(samples)}; {commonest}; the rows are in "
              f"{result.run_dir}/dead_letters/", file=sys.stderr)
        return 1 if strict else 0
    return 0


def refusal_line(samples) -> str:
    """What the gate refused, where people look: rows per split and reason, and the files they came from."""
    def counts(by: dict[str, int], most: int = 5) -> str:
        ranked = sorted(by.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{k} {n}" for k, n in ranked[:most]) + (f", {len(ranked) - most} more" if len(ranked) > most
                                                                  else "")
    parts = []
    if samples.refused:
        parts.append(f"{samples.refused} of {samples.stream} training rows refused "
                     f"({counts(samples.refused_by_reason)})")
    if samples.refused_test:
        parts.append(f"{samples.refused_test} test rows refused ({counts(samples.refused_test_by_reason)})")
    return "; ".join(parts) + (f"; by file: {counts(samples.refused_by_origin)}" if samples.refused_by_origin else "")


def cmd_stress(args: argparse.Namespace) -> int:
    from memcl.pipeline.stress import RSS_GROWTH, THROUGHPUT_RATIO, compare, table

    results = compare(args.tasks, args.task_free, _overrides(args), args.signals and args.signals.split(","),
                      chaos=args.chaos)
    first = results[0]
    mode = "task-free" if first["task_free"] else "task boundaries given"
    print(f"stress: {first['tasks']} visits of {first['distinct_tasks']} recurring tasks ({mode}), "
          f"{first['samples']['stream']} samples per run; bound S0 + N_T + 0.05 M, revisit false-expansion rate "
          f"<= 0.05, >= 95 % of novel events detected within 3 blocks, RSS growth < {100 * RSS_GROWTH:.0f} %, last "
          f"tenth's throughput >= {THROUGHPUT_RATIO} x the second tenth's, stores within their budgets")
    print(table(results))
    for r in results:
        samples = r["samples"]
        once = samples["learned"] == samples["unique_learned"] == samples["stream"]
        print(f"{r['method']} ({r['signal']} signal): {r['wall_seconds']:.0f} s, every sample learned exactly once: "
              f"{'yes' if once else 'NO'}; run folder {r['run_dir']} (stress.csv, stress.png, stress.json)")
        print("  store bytes at 10 % -> end of the stream (budget): " + ", ".join(
            f"{name} {v['at_10pct']:,} -> {v['at_end']:,}" + (f" ({v['budget']:,})" if v["budget"] is not None else "")
            for name, v in r["stores"].items()))
        unique = r["uss_growth_10_to_100pct"]
        print("  RSS growth from 10 % to the end (unique memory, USS): " + ", ".join(
            f"{role} {100 * g:+.1f} % ({100 * unique[role]:+.1f} %)" if role in unique else f"{role} {100 * g:+.1f} %"
            for role, g in r["rss_growth_10_to_100pct"].items()))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from memcl.pipeline import preflight, report

    run_dir = preflight.run_folder(args.run_dir, "metrics.json")
    metrics = report.read_metrics(run_dir / "metrics.json")
    if "runs" in metrics:  # a `memcl lm` folder: several runs side by side
        from memcl.pipeline import lm

        lm.render_lm(run_dir, metrics)
        print(lm.summary_table(metrics))
        return 0
    report.render(run_dir, metrics)
    print(report.summary_table(metrics, run_dir))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from memcl.pipeline import runs

    parent = Path(args.out)
    if args.action == "list":
        print(runs.list_table(runs.find(parent), parent))
    elif args.action == "compare":
        print(runs.compare_table([Path(p) for p in args.folders]))
    else:
        return clean_runs(args)
    return 0


def clean_runs(args: argparse.Namespace) -> int:
    """`memcl runs clean`: list what would go and what stays (and why), ask, then remove."""
    from memcl.pipeline import runs
    from memcl.pipeline.config import ConfigError

    plan, kept = runs.clean_plan(Path(args.out), args.unfinished, args.older_than, [Path(p) for p in args.folders])
    for f, why in kept:
        print(f"keeping {f.path}: {why}")
    if not plan:
        print("no run folders to remove")
        return 0
    total = runs.size_text(sum(f.size_bytes for f in plan))
    for f in plan:
        print(f"to remove: {f.path} ({f.status}, {runs.size_text(f.size_bytes)})")
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"memcl runs clean: {len(plan)} run folders to remove ({total}) and no terminal to ask "
                              "on; pass --yes to remove them")
        if input(f"remove these {len(plan)} run folders ({total})? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    removed = runs.remove(plan)
    for f in plan:
        if f not in removed:
            print(f"keeping {f.path}: a run started in it meanwhile")
    print(f"{len(removed)} run folders removed ({runs.size_text(sum(f.size_bytes for f in removed))})")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "throughput":
        from memcl.pipeline.config import ConfigError
        from memcl.pipeline.throughput import default_cases, table, throughput

        cases = default_cases()
        if args.cases:
            known = {case.name: case for case in cases}
            unknown = [name for name in args.cases.split(",") if name not in known]
            if unknown:
                raise ConfigError(f"--cases: unknown {unknown}; the cases are {sorted(known)}")
            cases = [known[name] for name in args.cases.split(",")]
        rows, stage_rows = throughput(images=args.images, image_size=args.image_size, cases=cases,
                                      out=args.bench_out, repeats=args.repeats)
        print()
        print(table(rows, stage_rows))
        print(f"throughput.csv, stages.csv and throughput.png: {Path(args.bench_out) / 'throughput'}")
        return 0
    from memcl.pipeline import bench, preflight

    folder = Path(args.bench_out) / args.suite
    if args.render:
        rows = bench.read_runs(folder)
        bench.write_results(folder, bench.suite(args.suite), rows, max(r.seed for r in rows) + 1,
                            bench.read_notes(folder))
    else:
        names = lambda text: [preflight.method(m.strip()).name for m in text.split(",") if m.strip()]  # noqa: E731
        rows = bench.bench(args.suite, seeds=args.seeds, methods=names(args.methods) if args.methods else None,
                           out=args.bench_out, overrides=_overrides(args), progress=args.progress,
                           fan_out=args.fan_out, equal_bytes=names(args.equal_bytes) if args.equal_bytes else None)
    print()
    print(bench.markdown(bench.suite(args.suite), bench.aggregate(rows), max(r.seed for r in rows) + 1,
                         bench.read_notes(folder)))
    print(f"tables, curves and runs: {folder}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "methods":
        from memcl_ops.methods import METHODS

        rows = [(name, f"{spec.family} {spec.role}", f"{spec.summary} [{', '.join(sorted(spec.tags))}]")
                for name, spec in METHODS.items()]
    elif args.what == "datasets":
        from memcl_ops.data.datasets import DATASETS, missing_parts

        rows = [(name, f"{e.payload}, {e.num_classes} classes", e.summary
                 + (f" [not installed: {missing_parts(e)[0]}]" if missing_parts(e) else ""))
                for name, e in DATASETS.items()]
        rows += [(name, payload, summary) for name, payload, summary in OWN_DATA]
    elif args.what == "suites":
        from memcl.pipeline.suites import SUITES

        rows = [(name, "bench", s.summary) for name, s in SUITES.items()]
    else:
        from memcl_ops.models.encoders import ENCODER_NAMES

        rows = [(name, "encoder", "") for name in ENCODER_NAMES]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    for name, kind, summary in rows:
        print(f"{name:<{width[0]}}  {kind:<{width[1]}}  {summary}".rstrip())
    return 0


OWN_DATA = [  # the data sources that are not a fixed dataset (memcl_ops/data/sources.py)
    ("synthetic", "features/text", "Gaussian class clusters in feature space, or texts of class-owned nouns "
                                   "(data.synthetic.*)"),
    ("drift", "features", "recurring tasks under drift and abrupt shifts (data.drift.*)"),
    ("arrow:<folder>", "any", "your own Parquet / Arrow IPC files: <folder>/train/, <folder>/test/ (docs/guide.md)"),
    ("image-folder:<folder>", "image", "<folder>/{train,test}/<class>/*.png|jpg (data.image_size resizes)"),
]


def cmd_config(args: argparse.Namespace) -> int:
    from memcl.pipeline.config import describe, load_config

    if args.lm:
        from memcl.pipeline.lm import LMRunConfig

        config = load_config(args.config, _overrides(args), cls=LMRunConfig)
    else:
        config = load_config(args.config, _overrides(args))
    print(describe(config), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memcl", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    seed_help = "the run's seed (model initialisation, sampling); default 0"
    chaos_help = ("chaos mode: kill a random actor of the run every SECONDS while it streams (runtime.chaos_seconds); "
                  "the run replays from its last committed state")
    check_help = ("check the config, and that its data, encoder or model are on this machine, without starting Ray; "
                  "exit 0 if the run can start")
    run = command("run", "run one continual-learning stream (the embedded default without --config)")
    run.add_argument("--config", help="YAML file overriding the embedded default (`memcl config --show` lists keys)")
    run.add_argument("--address", help="join a Ray cluster ('auto' or host:port) instead of starting Ray in-process")
    run.add_argument("--out", help="parent folder of the run folder (default: runs)")
    run.add_argument("--seed", type=int, help=seed_help)
    run.add_argument("--chaos", type=float, metavar="SECONDS", help=chaos_help)
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its last good checkpoint")
    run.add_argument("--check", action="store_true", help=check_help)
    run.add_argument("--strict", action="store_true",
                     help="exit 1 if the gate refused any row (they are always kept in the run's dead_letters/)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override one config value, e.g. --set method.name=finetune")
    run.set_defaults(func=cmd_run)

    st = command("stress", "a long-horizon drift stream through the actor pipeline, with resource sampling")
    st.add_argument("--tasks", type=int, default=1000, help="visits of the stream (tasks recur; default 1000)")
    st.add_argument("--task-free", action="store_true", help="give the learner no task boundaries")
    st.add_argument("--out", help="parent folder of the run folder (default: runs/stress)")
    st.add_argument("--seed", type=int, help=seed_help)
    st.add_argument("--chaos", type=float, metavar="SECONDS",
                    help=chaos_help + "; each stream also runs fault-free, and the table says if the results match")
    st.add_argument("--signals", help="comma-separated SGSE signals (reference, paper), one run each on the same "
                    "stream (default: the method's own signal, then the other one)")
    st.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value")
    st.set_defaults(func=cmd_stress)

    lm = command("lm", "MIITA and baselines on a small-LM task stream (SmolLM2-135M without --config)")
    lm.add_argument("--config", help="YAML file overriding the embedded default (pipeline/lm.py LMRunConfig)")
    lm.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted `memcl lm` from its last checkpoints")
    lm.add_argument("--address", help="join a Ray cluster ('auto' or host:port) instead of starting Ray in-process")
    lm.add_argument("--out", help="parent folder of the run folder (default: runs)")
    lm.add_argument("--seed", type=int, help=seed_help)
    lm.add_argument("--chaos", type=float, metavar="SECONDS", help=chaos_help)
    lm.add_argument("--check", action="store_true", help=check_help)
    lm.add_argument("--methods", help="comma-separated LM methods (default: base,replay,miita,lora; `memcl list "
                    "methods` marks them 'lm')")
    lm.add_argument("--budgets", help="comma-separated byte budgets of the memory methods (default: 16384,65536)")
    lm.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override one config value, e.g. --set budgets=[8192] --set method.adapt.step=0.2")
    lm.set_defaults(func=cmd_lm)

    rs = command("runs", "list the run folders, compare runs side by side, or remove unfinished or old ones")
    rs.add_argument("action", nargs="?", default="list", choices=["list", "compare", "clean"],
                    help="list (default): every run under --out with its method, data, status, A_last and size; "
                         "compare RUN RUN...: finished runs side by side; clean [RUN...]: remove what "
                         "--unfinished / --older-than select, or the runs named, after asking (never a folder memcl "
                         "did not create, nor a run in progress; a resumable run only when named)")
    rs.add_argument("folders", nargs="*", metavar="RUN",
                    help="compare: the run folders; clean: remove these run folders (a resumable one too)")
    rs.add_argument("--out", default="runs", help="the parent folder of the runs (default: runs)")
    rs.add_argument("--unfinished", action="store_true", help="clean: the runs that never finished")
    rs.add_argument("--older-than", type=float, metavar="DAYS", help="clean: the runs last written DAYS ago or more")
    rs.add_argument("--yes", action="store_true",
                    help="clean: remove without asking (needed where stdin is no terminal)")
    rs.set_defaults(func=cmd_runs)

    rep = command("report", "re-render the tables and plots of a run folder")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `memcl run` or `memcl lm`")
    rep.set_defaults(func=cmd_report)

    from memcl.pipeline.suites import SUITES

    ben = command("bench", "every method side by side on one stream (suites: " + ", ".join(SUITES) + ")")
    ben.add_argument("suite", choices=[*sorted(SUITES), "throughput"],
                     help="a suite of methods on one stream, or `throughput`: bare loop, actor calls, compiled graph")
    ben.add_argument("--images", type=int, default=2560, help="throughput: images streamed per case")
    ben.add_argument("--image-size", type=int, default=64, help="throughput: EfficientNet input resolution")
    ben.add_argument("--repeats", type=int, default=3, help="throughput: alternating timings per case (medians)")
    ben.add_argument("--cases", help="throughput: comma-separated cases (default all: efficientnet-lite0-b256-x1, "
                     "efficientnet-lite0-b512-x1, efficientnet-lite0-b256-x2, tiny-b256-x1, "
                     "efficientnet-lite0-cached-b256-x1)")
    ben.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method (default 3)")
    ben.add_argument("--methods", help="comma-separated subset of the registered methods (default: all)")
    ben.add_argument("--out", dest="bench_out", default="runs/bench", help="parent folder of <suite>/ results")
    ben.add_argument("--address", help="join a Ray cluster ('auto' or host:port) instead of starting Ray in-process")
    ben.add_argument("--progress", action="store_true", help="show each run's progress bars")
    ben.add_argument("--fan-out", type=float, nargs="?", const=1.0, default=0.0, metavar="CPUS",
                     help="run the (method, seed) runs side by side over the cluster (--address), on bench workers "
                          "of CPUS each (default 1); the tables are the sequential bench's")
    ben.add_argument("--equal-bytes", metavar="METHOD,...",
                     help="after the methods compared, run each one with a rehearsal buffer (derpp) again per METHOD "
                          "with the largest buffer within METHOD's memory bytes (row derpp@METHOD)")
    ben.add_argument("--render", action="store_true", help="re-write the tables and plot from <out>/<suite>/runs.csv")
    ben.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value of the suite")
    ben.set_defaults(func=cmd_bench)

    ls = command("list", "list the registered methods, datasets, bench suites or encoders")
    ls.add_argument("what", choices=["methods", "datasets", "suites", "encoders"], help="what to list")
    ls.set_defaults(func=cmd_list)

    cfg = command("config", "print the run config (the embedded default, or with --config / --set applied)")
    cfg.add_argument("--show", action="store_true", help="print it as YAML with each key's help (the default action)")
    cfg.add_argument("--lm", action="store_true", help="the config of `memcl lm` instead of `memcl run`'s")
    cfg.add_argument("--config", help="YAML file overriding the embedded default")
    cfg.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value")
    cfg.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes `memcl runs`' positionals at their first appearance: run folders after an option come back here
    if extra and args.func is cmd_runs and not any(e.startswith("-") for e in extra):
        args.folders += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from memcl.pipeline.errors import RunInterrupted, RunStopped, one_line

    try:
        return args.func(args)
    except RunInterrupted as stop:
        print(f"\nmemcl: interrupted; {stop.next_step}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\nmemcl: interrupted", file=sys.stderr)
        return 130
    except RunStopped as stop:
        print(f"memcl: error: {stop.why}; {stop.next_step}", file=sys.stderr)
        return 1
    except Exception as err:
        if args.debug:
            raise
        message, user_error = one_line(err)
        print(f"memcl: error: {message}" + ("" if user_error else " (--debug shows the traceback)"), file=sys.stderr)
        return 2 if user_error else 1


if __name__ == "__main__":
    sys.exit(main())
