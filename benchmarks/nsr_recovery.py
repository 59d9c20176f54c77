"""NSR's three claims on a recurring stream whose returns bring new rows (docs/methods.md, "NSR"): recovery of
returning tasks with the bank against memoryless allocation, forgetting, and the controlled study (the bank fixed,
only the allocation rule changed: similarity, round-robin, a learned policy).

Stream and model: pipeline/configs/nsr-bbc-recurring.yaml — BBC News (offline) as five binary topic tasks, three
cycles, each cycle in an order drawn per seed; every visit streams 64 texts per class no earlier visit of its task
streamed, the test split held back; the pretrained all-MiniLM-L6-v2 with LoRA r = 8 on query/value, in this process
(`runner.run(in_process=True)`: the same loop and roles as `memcl run`, without actors). Each rule runs the same
stream with the same seed:

* bank         NSR's similarity rule: restore / warm start / fresh by key similarity (a warm or fresh start of a
               returning task keeps its own head)
* bank-restore the same with τ_same 0.75 and a margin of 0.05 over the second-best entry: a returning task's key
               from new rows is far below the default 0.95 (`--key-cosines 100` measures them on other rows)
* bank-kd-off  the same as bank with λ_KD = 0 (the distillation's ablation)
* round-robin  the same bank, key-blind: each arrival restores the next entry in turn
* learned      the same bank, a learned policy over restore top-1/top-2 / warm mix / fresh (memcl_ops/nsr/policy.py),
               trained first on runs of other seeds (their own rows and cycle orders), then frozen
* fresh, keep  memoryless: a fresh adapter and head at every arrival / whatever the previous visit left
* fresh-heads, keep-heads   the same, keeping each task's head: what they lose is the adapter alone

Recovery of a returning visit = Adam steps until accuracy on the task's test rows is within 1 point of its previous
best or at 95 % of it (step 0 = right after the arrival decision); tracking ends with the visit (16 steps), a task
not back by then is censored. BWT and forgetting are the run's (docs/methods.md, "Metrics": every visit's row
counts); task-agnostic accuracy answers each test batch through the bank entry nearest its key.

    python benchmarks/nsr_recovery.py --seeds 0 1 2 --json runs/nsr_recovery.json   # the RESULTS.md table
    python benchmarks/nsr_recovery.py --rules bank fresh --seeds 0                  # a part of it
    python benchmarks/nsr_recovery.py --from-json runs/nsr_recovery.json            # the table of finished runs
    python benchmarks/nsr_recovery.py --key-cosines 100                             # task keys of seed 100's rows
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from memcl.pipeline import runner
from memcl.pipeline.config import load_config
from memcl_ops import files

CONFIG = Path(__file__).resolve().parents[1] / "pipeline" / "configs" / "nsr-bbc-recurring.yaml"
RULES = {
    "bank": {},
    # a restore bar between a returning task's key cosines and those of tasks sharing a class (--key-cosines 100)
    "bank-restore": {"method.nsr.bank.tau_same": 0.75, "method.nsr.bank.restore_margin": 0.05},
    "bank-kd-off": {"method.nsr.kd_weight": 0.0},
    "round-robin": {"method.nsr.allocation": "round-robin"},
    "learned": {"method.nsr.allocation": "learned"},
    "fresh": {"method.nsr.allocation": "fresh"},
    "keep": {"method.nsr.allocation": "keep"},
    "fresh-heads": {"method.nsr.allocation": "fresh", "method.nsr.task_heads": True},
    "keep-heads": {"method.nsr.allocation": "keep", "method.nsr.task_heads": True},
}
MEMORYLESS = ("fresh", "keep", "fresh-heads", "keep-heads")
PAPER = {"recovery": 10.0, "forgetting": 9.0, "similarity_steps": 0.0, "learned_steps": 1.8}


def cycle_order(seed: int, tasks: int, cycles: int) -> list[int]:
    """`cycles` seeded permutations of the tasks, no task twice in a row across a cycle's boundary."""
    rng = np.random.default_rng([seed, 5])
    order: list[int] = []
    for _ in range(cycles):
        cycle = rng.permutation(tasks).tolist()
        while order and cycle[0] == order[-1]:
            cycle = rng.permutation(tasks).tolist()
        order += cycle
    return order


def config(args: argparse.Namespace, rule: str, seed: int, extra: dict | None = None):
    """pipeline/configs/nsr-bbc-recurring.yaml with the rule, the seed's cycle order and any size the command line
    changes."""
    base = load_config(CONFIG)
    overrides = {**RULES[rule], "seed": seed, "stream.sample_seed": seed, "runtime.out": args.out,
                 "runtime.progress": False, "runtime.checkpoint": False,
                 "stream.visits": cycle_order(seed, base.stream.tasks, args.cycles), **(extra or {})}
    if args.train_per_class is not None:
        overrides["stream.train_per_class"] = args.train_per_class
        overrides["method.nsr.recovery_max_steps"] = 2 * args.train_per_class // base.method.nsr.batch_size
    for key, value in (("stream.test_per_class", args.test_per_class), ("method.nsr.probe_size", args.probe),
                       ("encoder.spec.max_length", args.max_length)):
        if value is not None:
            overrides[key] = value
    return load_config(CONFIG, overrides)


def run(args: argparse.Namespace, rule: str, seed: int, extra: dict | None = None) -> tuple[dict, float]:
    t0 = time.perf_counter()
    metrics = runner.run(config(args, rule, seed, extra), in_process=True).metrics
    return metrics, time.perf_counter() - t0


def train_policy(args: argparse.Namespace) -> list[float] | None:
    """The learned policy's weights after learning on runs of `--policy-seeds`, one after the other (each from the
    previous one's weights)."""
    weights = None
    for seed in args.policy_seeds:
        extra = {"method.nsr.policy.learn": True, **({"method.nsr.policy.weights": weights} if weights else {})}
        metrics, seconds = run(args, "learned", seed, extra)
        weights = metrics["bank"]["policy"]["weights"]
        print(f"policy training seed {seed}: done in {seconds:.0f} s, {metrics['bank']['policy']['trained_arrivals']}"
              f" arrivals ({metrics['run_dir']})", flush=True)
    return weights


def row(rule: str, seed: int, m: dict, seconds: float) -> dict:
    """One run's figures, as the table reads them."""
    returning = m["recovery"]["returning_visits"]
    cycles = len(m["visits"]) // len(m["task_classes"])
    per_cycle = [0.0] * cycles
    for r in returning:
        per_cycle[r["visit"] // len(m["task_classes"])] += r["steps"]
    own, other = [], []  # a returning task's key to its own entry, and every key to other tasks' entries
    for e in m["round_log"]:
        sims = {int(k): v for k, v in ((e.get("retrieval") or {}).get("similarities") or {}).items()}
        own += [v for k, v in sims.items() if k == e["task"]]
        other += [v for k, v in sims.items() if k != e["task"]]
    summary, agnostic = m["summary"], m["task_agnostic"]
    return {
        "rule": rule, "seed": seed, "visits": m["visits"],
        "arrivals": [e["arrival"] for e in m["round_log"]],
        "false_restores": m["arrivals"]["false_restores"], "missed_restores": m["arrivals"]["missed_restores"],
        "steps": [r["steps"] for r in returning], "censored": [r["censored"] for r in returning],
        "start_accuracy": [r["start_accuracy"] for r in returning],
        "previous_best": [r["previous_best"] for r in returning],
        "cycle_cost": per_cycle,
        "a_last": summary["a_last"], "bwt": summary["bwt"], "forgetting": summary["forgetting"],
        "task_agnostic": agnostic["accuracy"] if agnostic else None,
        "routed_to_own_task": agnostic["routed_to_own_task"] if agnostic else None,
        "memory_bytes": m["memory_bytes"],
        "own_similarity": own, "other_similarity": other,
        "policy": (m["bank"] or {}).get("policy"),
        "seconds": seconds, "run_dir": m["run_dir"],
    }


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def aggregate(rows: list[dict]) -> dict[str, dict]:
    """Per rule, over seeds: recovery steps (a censored visit counts its tracked steps, a lower bound), their spread
    across the seeds' means, the censored share, accuracy at return, A_last, BWT, forgetting, task-agnostic
    accuracy, false and missed restores, recovery cost per cycle (cumulative), bytes."""
    out = {}
    for rule in dict.fromkeys(r["rule"] for r in rows):
        mine = [r for r in rows if r["rule"] == rule]
        steps = [s for r in mine for s in r["steps"]]
        censored = [c for r in mine for c in r["censored"]]
        cost = np.cumsum(np.mean([r["cycle_cost"] for r in mine], axis=0)).tolist()
        out[rule] = {
            "arrivals": {k: sum(r["arrivals"].count(k) for r in mine) for k in ("restore", "warm", "fresh", "keep")},
            "false_restores": sum(r["false_restores"] for r in mine),
            "missed_restores": sum(r["missed_restores"] for r in mine),
            "mean_steps": float(np.mean(steps)),
            "seed_spread": _mean_sd([float(np.mean(r["steps"])) for r in mine])[1],
            "censored": sum(censored), "returning": len(censored),
            "start_accuracy": float(np.mean([a for r in mine for a in r["start_accuracy"]])),
            **{k: _mean_sd([r[k] for r in mine]) for k in ("a_last", "bwt", "forgetting")},
            "task_agnostic": (_mean_sd([r["task_agnostic"] for r in mine]) if mine[0]["task_agnostic"] is not None
                              else None),
            "routed": (float(np.mean([r["routed_to_own_task"] for r in mine]))
                       if mine[0]["routed_to_own_task"] is not None else None),
            "cumulative_cost": cost,
            "bytes": float(np.mean([sum(v for k, v in r["memory_bytes"].items()) for r in mine])),
            "seconds": float(sum(r["seconds"] for r in mine)), "seeds": len(mine),
        }
    return out


def _pm(value: tuple[float, float], scale: float = 100.0, digits: int = 1) -> str:
    return f"{scale * value[0]:.{digits}f} ± {scale * value[1]:.{digits}f}"


def table(agg: dict[str, dict]) -> str:
    lines = ["| rule | arrivals | false / missed restores | recovery steps, mean ± seed spread | censored | accuracy "
             "at return | A_last (task id given) | task-agnostic (routed to own entry) | BWT | forgetting | "
             "memory bytes | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rule, a in agg.items():
        arrivals = ", ".join(f"{n} {k}" for k, n in a["arrivals"].items() if n)
        agnostic = (f"{_pm(a['task_agnostic'])} ({100 * a['routed']:.0f} %)" if a["task_agnostic"] is not None
                    else "n/a (no keys)")
        restores = f"{a['false_restores']} / {a['missed_restores']}" if rule not in MEMORYLESS else "n/a"
        lines.append(f"| {rule} | {arrivals} | {restores} | {a['mean_steps']:.2f} ± {a['seed_spread']:.2f} | "
                     f"{a['censored']} / {a['returning']} | {100 * a['start_accuracy']:.1f} | {_pm(a['a_last'])} | "
                     f"{agnostic} | {_pm(a['bwt'])} | {_pm(a['forgetting'])} | {a['bytes']:,.0f} | "
                     f"{a['seconds']:.0f} |")
    return "\n".join(lines)


def _ratio(num: float, den: float) -> str:
    if abs(den) < 1e-12:
        return "∞ (the bank's is 0)" if abs(num) > 1e-12 else "1 (both 0)"
    return f"{num / den:.1f}x"


def claims(agg: dict[str, dict]) -> list[str]:
    """The paper's three claims beside what these runs measured, for each similarity rule run."""
    out = []
    for name in (r for r in ("bank", "bank-restore") if r in agg):
        bank = agg[name]
        for rule in (r for r in MEMORYLESS if r in agg):
            a = agg[rule]
            note = f" ({a['censored']} of {a['returning']} visits censored: a lower bound)" if a["censored"] else ""
            if bank["censored"]:
                note = f" (indicative only: some of {name}'s visits censored)"
            out.append(f"recovery, {rule} / {name}: {_ratio(a['mean_steps'], bank['mean_steps'])}{note} "
                       f"(paper: {PAPER['recovery']:.0f}x)")
        for rule in (r for r in MEMORYLESS if r in agg):
            a = agg[rule]
            out.append(f"forgetting, |BWT| {rule} / {name}: {_ratio(abs(a['bwt'][0]), abs(bank['bwt'][0]))}, "
                       f"F {rule} / {name}: {_ratio(a['forgetting'][0], bank['forgetting'][0])} "
                       f"(paper: BWT {PAPER['forgetting']:.0f}x nearer zero)")
        for rule in ("learned", "round-robin"):
            if rule in agg:
                out.append(f"controlled study, {name} {bank['mean_steps']:.2f} vs {rule} "
                           f"{agg[rule]['mean_steps']:.2f} steps, A_last {100 * bank['a_last'][0]:.1f} vs "
                           f"{100 * agg[rule]['a_last'][0]:.1f} % (paper: similarity {PAPER['similarity_steps']:.0f} "
                           f"vs {PAPER['learned_steps']} steps for a learned RL controller, equal accuracy)")
    return out


def key_cosines(seed: int, draws: int = 3) -> None:
    """Cosines of task keys (the mean LoRA-off feature of a probe's texts) between probes of new rows of one task,
    of two tasks that share a class, and of two that share none, on `seed`'s draws of the training split."""
    import torch

    from memcl_ops.arrow import schema as S
    from memcl_ops.data.datasets import load_dataset
    from memcl_ops.models.encoders import build_encoder
    from memcl_ops.nsr.task_bank import normalize

    cfg = load_config(CONFIG)
    dataset, tasks = load_dataset(cfg.data.dataset), [list(c) for c in cfg.stream.task_classes]
    encoder = build_encoder(cfg.encoder.spec, "text")
    rng, half = np.random.default_rng(seed), cfg.method.nsr.probe_size // 2
    keys = {}
    for t, classes in enumerate(tasks):
        rows = {c: rng.permutation(np.flatnonzero(dataset.train_y == c)) for c in classes}
        for d in range(draws):  # disjoint draws: new rows on every probe
            picked = np.concatenate([rows[c][d * half:(d + 1) * half] for c in classes])
            batch = S.raw_batch(picked.astype(np.int64), "text", dataset.train_x[picked], dataset.train_y[picked],
                                np.full(len(picked), t))
            with torch.no_grad():
                keys[t, d] = normalize(encoder.features(batch).float().mean(0).numpy())
    pairs = {"one task, new rows": [], "two tasks sharing a class": [], "two tasks sharing none": []}
    for (t, d), k in keys.items():
        for (u, e), other in keys.items():
            if (t, d) < (u, e):
                kind = ("one task, new rows" if t == u else "two tasks sharing a class"
                        if set(tasks[t]) & set(tasks[u]) else "two tasks sharing none")
                pairs[kind].append(float(k @ other))
    for kind, values in pairs.items():
        print(f"{kind}: cosine {min(values):.3f}-{max(values):.3f}, mean {np.mean(values):.3f} ({len(values)} pairs)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (rows, cycle order, adapter init)")
    parser.add_argument("--policy-seeds", type=int, nargs="+", default=[100],
                        help="seeds of the learned policy's training runs (never evaluated)")
    parser.add_argument("--policy-weights", help="a JSON list of trained weights: skip the policy's training")
    parser.add_argument("--cycles", type=int, default=3, help="times every task is visited (config: 3)")
    parser.add_argument("--train-per-class", type=int, help="training texts per class and visit (config: 64)")
    parser.add_argument("--test-per-class", type=int, help="test texts per class (config: 24)")
    parser.add_argument("--max-length", type=int, help="tokens per text (config: 32)")
    parser.add_argument("--probe", type=int, help="rows of a visit that make its task key (config: 64)")
    parser.add_argument("--out", default="runs/nsr_recovery", help="parent folder of the run folders")
    parser.add_argument("--json", help="also write the per-run rows (and the policy's weights) as JSON here")
    parser.add_argument("--from-json", nargs="+", help="print the table of the runs --json files hold; run nothing")
    parser.add_argument("--key-cosines", type=int, metavar="SEED", help="print task-key cosines of SEED's rows")
    args = parser.parse_args(argv)

    if args.key_cosines is not None:
        key_cosines(args.key_cosines)
        return 0
    if args.from_json:
        saved = [json.loads(Path(f).read_text()) for f in args.from_json]
        weights = next((s["policy_weights"] for s in saved if s["policy_weights"] is not None), None)
        rows = sorted((r for s in saved for r in s["rows"]), key=lambda r: (list(RULES).index(r["rule"]), r["seed"]))
    else:
        weights, rows = json.loads(args.policy_weights) if args.policy_weights else None, []
        if "learned" in args.rules and weights is None:
            weights = train_policy(args)
        for seed in args.seeds:
            for rule in args.rules:
                extra = {"method.nsr.policy.weights": weights} if rule == "learned" else None
                metrics, seconds = run(args, rule, seed, extra)
                rows.append(row(rule, seed, metrics, seconds))
                print(f"seed {seed} {rule}: done in {seconds:.0f} s ({metrics['run_dir']})", flush=True)
                if args.json:  # after every run: a long table's finished runs survive an interruption
                    files.write_json(args.json, {"policy_weights": weights, "rows": rows}, indent=1)
    agg = aggregate(rows)
    print()
    print(table(agg))
    print()
    for line in claims(agg):
        print(line)
    print("recovery cost per cycle, cumulative (mean over seeds; cycle 1 has no returning visit): "
          + "; ".join(f"{rule} " + " ".join(f"{c:.1f}" for c in a["cumulative_cost"]) for rule, a in agg.items()))
    banked = [r for r in rows if r["rule"] not in MEMORYLESS]
    own = [s for r in banked for s in r["own_similarity"]]
    other = [s for r in banked for s in r["other_similarity"]]
    if own:
        print(f"keys: a returning task's cosine to its own entry {min(own):.3f}-{max(own):.3f} (mean "
              f"{np.mean(own):.3f}), to other tasks' entries {min(other):.3f}-{max(other):.3f} (mean "
              f"{np.mean(other):.3f}); restore at >= tau_same")
    if weights is not None:
        print("learned policy weights (actions restore-1, restore-2, warm, fresh x features 1, s1, s2, age1, age2, "
              "loss1, loss2): " + " ".join(f"{w:.2f}" for w in weights))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
