"""MIITA on SmolLM2-135M-Instruct: the frozen base, text replay and MIITA at the same byte budgets, and sequential
LoRA, side by side on one five-task stream in one `memcl lm` run (docs/methods.md, "MIITA").

    python benchmarks/miita_lm.py                     # the RESULTS.md table (budgets 16 and 64 KiB, seed 0)
    python benchmarks/miita_lm.py --steps 0.05 0.3    # plus MIITA at other step sizes η (same stream, same seed)

Prints a markdown table (OP and BWT in percent, the mean teacher-forced NLL of the reference answers after the
last task, final accuracy per task, memory bytes) and the differences
MIITA − base and MIITA − replay per budget, measured in this run. The run folder (metrics.json, results.csv,
accuracy matrices, plots, every prediction) is written under --out.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from memcl.pipeline import lm, runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import load_config
from memcl_ops.metrics import figure_text


def markdown(metrics: dict, extra: dict[float, dict]) -> str:
    tasks = metrics["tasks"]
    lines = ["| run | C_mem | A_last (OP) | BWT | answer NLL | " + " | ".join(tasks) + " | memory bytes | seconds |",
             "|---|---|---|---|---|" + "---|" * len(tasks) + "---|---|"]
    rows = list(metrics["runs"].items())
    for step, m in extra.items():
        rows += [(f"{name} (η={step})", r) for name, r in m["runs"].items()]
    for name, r in rows:
        budget = f"{r['budget_bytes'] // 1024} KiB" if r["budget_bytes"] else "-"
        final = " | ".join(figure_text(v, ".1f") for v in r["acc_matrix"][-1])
        mem = ", ".join(f"{k} {v:,}" for k, v in r["memory_bytes"].items()) or "0"
        s = r["summary"]
        scores = (f"{figure_text(s['a_last'], '.1f')} | {figure_text(s['bwt'], '.1f')} | "
                  f"{figure_text(r['final_answer_nll'], '.2f', 1)}")
        lines.append(f"| {name} | {budget} | {scores} | {final} | {mem} | {r['wall_seconds']['total']:.0f} |")
    runs = metrics["runs"]
    lines.append("")
    for name, r in runs.items():
        if r["method"] != "miita":
            continue
        replay = runs.get(name.replace("miita", "replay"))
        a_last = {n: v["summary"]["a_last"] for n, v in runs.items()}
        parts = [f"{name}: A_last − base {100 * (a_last[name] - a_last['base']):+.1f} points, answer NLL − base "
                 f"{r['final_answer_nll'] - runs['base']['final_answer_nll']:+.2f}"] if "base" in runs else []
        if replay is not None:
            parts.append(f"A_last − replay {100 * (a_last[name] - replay['summary']['a_last']):+.1f} points, "
                         f"BWT − replay {100 * (r['summary']['bwt'] - replay['summary']['bwt']):+.1f}")
        lines.append("; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16 * 1024, 64 * 1024], help="C_mem in bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=float, nargs="*", default=[], help="extra MIITA runs at these η")
    parser.add_argument("--out", default="runs/bench/miita_lm")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    args = parser.parse_args()
    import yaml

    overrides = {"budgets": args.budgets, "seed": args.seed, "runtime.out": args.out,
                 "runtime.evaluate_window": 1, **{k: yaml.safe_load(v) for k, _, v in
                                                          (s.partition("=") for s in args.set)}}
    config = load_config(overrides=overrides, cls=lm.LMRunConfig)
    actors = ActorCache()
    try:
        metrics = runner.run(config, actors=actors).metrics
        extra = {}
        for step in args.steps:
            adapt = replace(config.method.adapt, step=step)
            sweep = replace(config, methods=("miita",), method=replace(config.method, adapt=adapt))
            extra[step] = runner.run(sweep, actors=actors).metrics
    finally:
        actors.close()
    print(lm.summary_table(metrics))
    print()
    print(markdown(metrics, extra))
    print(f"\nrun folder: {metrics['run_dir']}" + "".join(f", {m['run_dir']}" for m in extra.values()))


if __name__ == "__main__":
    main()
