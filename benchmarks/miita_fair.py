"""MIITA on SmolLM2-135M-Instruct at budgets that bind, side by side with the baselines, knobs chosen on dev data
(docs/methods.md, "MIITA, position-aware"; benchmarks/RESULTS.md, "MIITA at binding budgets").

    python -m benchmarks.miita_fair                            # every stream, budgets 2-16 KiB, seeds 0 1 2
    python -m benchmarks.miita_fair --streams partly --seeds 0  # one stream, one seed
    python -m benchmarks.miita_fair --tiny                      # a tiny random LM on a small stream (seconds)
    python -m benchmarks.miita_fair --streams superni-a --dev --seeds 0 --knob memory.centre_keys=true
                                                               # the dev split, knobs given by hand
    python -m benchmarks.miita_fair --streams partly --knob memory.positions=2 --knob memory.centre_keys=false
                                                               # knobs an earlier dev grid chose: no dev runs

Streams: `partly` (tasks the frozen base can partly do: bbc-topic, sentiment-negation, word-category; 32 train / 40
test each), `superni-a` and `superni-b` (the shipped SuperNI order-A subsample, in order and reversed), `format`
(the five format-learning tasks of `memcl lm`'s default: answers the base cannot know), `open` (capital-city,
plural, past-tense: every answer its own, no test answer among the training answers; 32 train / 32 test each).
For each stream, MIITA's knobs (answer positions kept, centred keys) are first chosen on the dev split (a held-out
quarter of the training pairs, seed 0, 8 KiB; no test item is seen), then every method runs on the test pairs at
every budget and seed (`miita-paper` only where one of its fp16 prototypes fits). Prints one markdown table per
stream: mean ± std over seeds of OP (the headline: exact match, ROUGE-L on free text), OP of each score, BWT,
prompt tokens and ms per query and the memory's bytes; and writes it all to --out/fair.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from memcl.pipeline import lm, runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import RuntimeConfig
from memcl_ops import files
from memcl_ops.data import superni
from memcl_ops.data.lm_tasks import OPEN_ANSWERS, PARTLY_CAPABLE, LMStreamSpec
from memcl_ops.metrics import figure_text
from memcl_ops.miita.directions import prototype_bytes
from memcl_ops.models.causal_lm import LMSpec

METHODS = ("base", "replay", "nearest-answer", "miita", "miita-paper", "miita-replay", "lora")
BUDGETS = (2048, 4096, 8192, 16384)
# MIITA's knobs chosen per stream on its dev split: answer positions kept, and whether keys are centred ("small":
# the positions only, for the long SuperNI prompts)
CANDIDATES = [{"memory.positions": p, "memory.centre_keys": c} for p in (2, 8, 32) for c in (False, True)]
GRIDS = {"full": CANDIDATES, "small": [{"memory.positions": p, "memory.centre_keys": False} for p in (8, 32)]}


def streams(tiny: bool) -> dict[str, LMStreamSpec]:
    order = tuple(f"superni:{t}" for t in superni.available())
    if tiny:
        return {"partly": LMStreamSpec(tasks=PARTLY_CAPABLE[1:], train_per_task=8, test_per_task=4)}
    return {"partly": LMStreamSpec(tasks=PARTLY_CAPABLE, train_per_task=32, test_per_task=40),
            "superni-a": LMStreamSpec(tasks=order), "superni-b": LMStreamSpec(tasks=order[::-1]),
            "format": LMStreamSpec(), "open": LMStreamSpec(tasks=OPEN_ANSWERS, train_per_task=32, test_per_task=32)}


def base_config(stream: LMStreamSpec, tiny: bool, out: str) -> lm.LMRunConfig:
    # answer the new task after each task and every task after the last (evaluate_window 1): what A_last and BWT need;
    # the table scores the test pairs only, so the training pairs are not answered first (a generation fewer a pair)
    config = lm.LMRunConfig(stream=replace(stream, answer_training_pairs=False),
                            runtime=RuntimeConfig(evaluate_window=1, progress=False, out=out, checkpoint=False))
    if tiny:
        config = replace(config, model=LMSpec(name="tiny:llama", threads=1),
                         stream=replace(config.stream, batch_size=4), runtime=replace(config.runtime, actor_threads=1))
    return config


def with_knobs(config: lm.LMRunConfig, knobs: dict) -> lm.LMRunConfig:
    """`config` with "section.key" values set in its method config."""
    method = config.method
    for dotted, value in knobs.items():
        section, key = dotted.split(".")
        method = replace(method, **{section: replace(getattr(method, section), **{key: value})})
    return replace(config, method=method)


def choose_knobs(config: lm.LMRunConfig, actors: ActorCache, candidates: list[dict]) -> tuple[dict, list[dict]]:
    """The candidate with the best MIITA A_last on the dev split (seed 0, 8 KiB); ties keep the earlier one."""
    dev = replace(config, seed=0, methods=("miita",), budgets=(8192,),
                  stream=replace(config.stream, seed=0, evaluate_on="dev"))
    tried = []
    for knobs in candidates:
        run = runner.run(with_knobs(dev, knobs), actors=actors).metrics["runs"]["miita@8KiB"]
        tried.append({**knobs, "dev_a_last": run["summary"]["a_last"]})
    best = max(range(len(tried)), key=lambda i: (tried[i]["dev_a_last"], -i))
    return candidates[best], tried


def given_knobs(pairs: list[str]) -> dict:
    """`--knob section.key=value` pairs, each value JSON (2, false, "text")."""
    knobs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key.count(".") != 1:
            raise SystemExit(f"miita_fair: --knob wants SECTION.KEY=VALUE, got {pair!r}")
        try:
            knobs[key] = json.loads(value)
        except json.JSONDecodeError:
            raise SystemExit(f"miita_fair: --knob {key}: {value!r} is not JSON (e.g. 2, false, \"text\")") from None
    return knobs


def summarise(runs: list[dict]) -> dict:
    """Mean and std over seeds of one (method, budget)'s scores."""
    def stat(values: list[float | None]) -> list[float]:
        a = np.asarray(values, dtype=np.float64)  # null in metrics.json (an undefined figure): NaN
        return [float(np.mean(a)), float(np.std(a))]
    first = runs[0]
    return {"method": first["method"], "budget_bytes": first["budget_bytes"], "seeds": len(runs),
            "a_last": stat([r["summary"]["a_last"] for r in runs]), "bwt": stat([r["summary"]["bwt"] for r in runs]),
            **{f"a_last_{k}": stat([r["scores"][k]["a_last"] for r in runs]) for k in lm.SCORES},
            **{k: stat([r["query_cost"][k] for r in runs]) for k in lm.QUERY_COST},
            # what the method keeps (LoRA: its adapter), not the recomputable replay keys or bookkeeping
            "bytes": stat([sum(v for k, v in r["memory_bytes"].items() if k not in ("replay_keys", "bookkeeping"))
                           for r in runs])}


def from_run_folders(out: Path) -> dict[str, list[dict]]:
    """Every test run's metrics under `out` (the dev runs left out), by run name: what an interrupted benchmark
    finished (`--summarise`)."""
    import yaml

    per_run: dict[str, list[dict]] = {}
    for folder in sorted(p for p in out.iterdir() if (p / "config.yaml").is_file()):
        if yaml.safe_load((folder / "config.yaml").read_text())["stream"].get("evaluate_on") == "dev":
            continue
        for path in sorted(folder.glob("runs/*/metrics.json")):
            metrics = json.loads(path.read_text())
            per_run.setdefault(metrics["run"], []).append(metrics)
    return per_run


def markdown(name: str, rows: dict[str, dict], knobs: dict) -> str:
    pct = lambda s: f"{figure_text(s[0], '.1f')} ± {figure_text(s[1], '.1f')}"  # noqa: E731
    lines = [f"### {name} (MIITA knobs from dev: {knobs})", "",
             "| run | A_last (OP) | exact | first word | label-restricted | ROUGE-L | BWT | prompt tokens | ms / query "
             "| bytes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run, r in rows.items():
        lines.append(f"| {run} | {pct(r['a_last'])} | {pct(r['a_last_exact'])} | {pct(r['a_last_first_word'])} | "
                     f"{pct(r['a_last_label_restricted'])} | {pct(r['a_last_rouge_l'])} | {pct(r['bwt'])} | "
                     f"{r['prompt_tokens'][0]:.0f} | {r['ms_per_query'][0]:.0f} | {r['bytes'][0]:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", nargs="+", default=None, help="partly, superni-a, superni-b, format, open")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--lora-seeds", type=int, nargs="*", default=[0], help="the seeds LoRA runs at")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="full", help="the dev candidates for MIITA's knobs")
    parser.add_argument("--knob", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="MIITA's knobs as an earlier dev grid chose them (e.g. memory.positions=2): no dev runs")
    parser.add_argument("--tiny", action="store_true", help="a tiny random LM: checks the benchmark runs end to end")
    parser.add_argument("--dev", action="store_true", help="answer each task's dev split (a held-out quarter of its "
                        "training pairs) instead of its test pairs: knobs compared by hand without a test item")
    parser.add_argument("--out", default="runs/bench/miita_fair")
    parser.add_argument("--summarise", metavar="NAME", help="print the table of the runs finished under --out "
                        "(e.g. after an interrupted benchmark) for stream NAME, run nothing")
    args = parser.parse_args()
    if args.summarise:
        per_run = from_run_folders(Path(args.out))
        print(markdown(args.summarise, {run: summarise(rs) for run, rs in per_run.items()}, "see the dev runs"))
        print("seeds per run: " + ", ".join(f"{run} {len(rs)}" for run, rs in per_run.items()))
        return
    available = streams(args.tiny)
    chosen = args.streams or list(available)
    unknown = [s for s in chosen if s not in available]
    if unknown:
        parser.error(f"unknown stream(s) {unknown}; known: {list(available)}")
    if args.knob and len(chosen) != 1:
        parser.error("--knob gives one stream's knobs (the dev grid chooses them per stream): name one --streams")
    report: dict[str, dict] = {}
    actors = ActorCache()
    started = time.perf_counter()
    try:
        for name in chosen:
            config = base_config(available[name], args.tiny, args.out)
            if args.knob:
                knobs, tried = given_knobs(args.knob), []
            else:
                knobs, tried = choose_knobs(config, actors, GRIDS[args.grid])
            config = with_knobs(replace(config, methods=tuple(args.methods), budgets=tuple(args.budgets)), knobs)
            per_run: dict[str, list[dict]] = {}
            for seed in args.seeds:
                seeded = replace(config, seed=seed, stream=replace(config.stream, seed=seed,
                                                                   evaluate_on="dev" if args.dev else "test"))
                # LoRA trains on the CPU for minutes a task: only at --lora-seeds
                skip = {"miita-paper", *(() if seed in args.lora_seeds else ("lora",))}
                others = tuple(m for m in seeded.methods if m not in skip)
                metrics = runner.run(replace(seeded, methods=others), actors=actors).metrics
                runs = dict(metrics["runs"])
                # miita-paper only at the budgets that hold one of its fp16 prototypes (2H + 2H + 4 bytes: 2,308 at
                # SmolLM2's H = 576)
                hidden = metrics["model"]["hidden"]
                fits = tuple(b for b in seeded.budgets if b >= prototype_bytes(hidden, hidden, 1))
                if "miita-paper" in seeded.methods and fits:
                    paper = replace(seeded, methods=("miita-paper",), budgets=fits)
                    runs |= runner.run(paper, actors=actors).metrics["runs"]
                for run, r in runs.items():
                    per_run.setdefault(run, []).append(r)
            rows = {run: summarise(rs) for run, rs in per_run.items()}
            report[name] = {"knobs": knobs, "knobs_given": bool(args.knob), "dev": tried, "rows": rows,
                            "tasks": list(available[name].tasks)}
            print(markdown(name, rows, knobs), flush=True)
            print(flush=True)
    finally:
        actors.close()
    report["seconds"] = time.perf_counter() - started
    Path(args.out).mkdir(parents=True, exist_ok=True)
    files.write_json(Path(args.out, "fair.json"), report)
    print(f"{report['seconds']:.0f} s; {Path(args.out, 'fair.json')}")


if __name__ == "__main__":
    main()
