"""What answering a query costs, side by side in one run: each prompt read whole (the decoder as it was) against the
task's shared prompt prefix read once and reused, for the frozen base and for MIITA, beside a floor (docs/methods.md,
"Answering cost"; benchmarks/RESULTS.md, "Answering at the cost of what differs").

    python -m benchmarks.lm_answer_cost                        # SmolLM2-135M, four SuperNI tasks, 16 queries each
    python -m benchmarks.lm_answer_cost --tasks 2 --queries 8   # smaller
    python -m benchmarks.lm_answer_cost --tiny                 # a tiny random LM (seconds; checks the script)
    python -m benchmarks.lm_answer_cost --scan                 # ms per row and decoding step at 1-64 rows a batch

Per SuperNI task of the shipped order-A subsample (its test prompts, its own answer-length cap), five ways to answer
the same queries, alternated over --repeats rounds (medians):

* base, before: the decoder as it was: every prompt read from its first token, 16 prompts a batch;
* base, now: the task's shared prefix (chat scaffold, definition) read once when the task starts, its key/value cache
  reused by every query, 32 prompts a batch, rows that stop leave the batch;
* miita, before / miita, now: the same with MIITA's position-aware memory (written from the task's training pairs,
  8 KiB) steering every step;
* floor: what any answer must cost, no memory: one forward over each query's own tokens (the prefix already read)
  plus one step per generated token, 32 prompts a batch.

Prints ms and prompt tokens per query, each figure as a multiple of the floor, the speed-up of now over before, and
whether both gave the same answers token for token.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from memcl_ops.data import superni
from memcl_ops.miita.answers import AnswerMemory, AnswerSteering
from memcl_ops.miita.directions import AdaptConfig, MemoryConfig
from memcl_ops.models.causal_lm import SMOLLM2, CausalLM, LMSpec, load_lm

WAYS = ("base, before", "base, now", "miita, before", "miita, now", "floor")
BEFORE, NOW = {"reuse_prefix": False, "micro_batch": 16}, {"reuse_prefix": True, "micro_batch": 32}


def steering(lm: CausalLM, task: superni.TextTask, budget: int) -> AnswerSteering:
    """MIITA's position-aware memory written from the task's training pairs."""
    memory = AnswerMemory(lm.hidden_size, lm.vocab_size, MemoryConfig(budget_bytes=budget))
    prompts, answers = [p.prompt for p in task.train], [p.answer for p in task.train]
    written = lm.teacher_forced(prompts, answers)
    for key, answer, own in zip(written.keys, answers, written.model_tokens):  # as the pipeline writes them
        memory.write(key, np.array([*lm.answer_ids(answer), lm.answer_end_id]), model_tokens=np.array(own))
    return AnswerSteering(memory, lm.weight, AdaptConfig())


def answer(lm: CausalLM, way: str, prompts: list[str], tokens: int, memory: AnswerSteering) -> tuple[float, list]:
    """Seconds to answer `prompts` one way, and the answers' tokens."""
    lm.spec = replace(lm.spec, **(BEFORE if way.endswith("before") else NOW))
    if way != "floor":
        lm.forget_prefixes()  # the prefix is read once per task, inside the timed call
    elif shared := lm.shared_prefix([lm.prompt_tokens(p) for p in prompts]):
        lm.prefix(tuple(lm.prompt_tokens(prompts[0]).ids[:shared]))  # read before the clock starts
    start = time.perf_counter()
    out = lm.generate(prompts, tokens, memory if way.startswith("miita") else None)
    return time.perf_counter() - start, out.tokens


@torch.inference_mode()
def step_scan(lm: CausalLM, sizes: tuple[int, ...] = (1, 8, 16, 32, 64), context: int = 160, steps: int = 8) -> None:
    """ms per decoding step and per row-step at each batch size (a `context`-token cache per row): why prompts are
    answered 32 a batch."""
    for rows in sizes:
        ids = torch.randint(2, lm.vocab_size, (rows, context))
        cache = lm.backbone(input_ids=ids, use_cache=True).cache
        token = torch.randint(2, lm.vocab_size, (rows, 1))
        lm.backbone(input_ids=token, cache=copy.deepcopy(cache), position_ids=torch.full((rows, 1), context))  # warm
        start = time.perf_counter()
        for step in range(steps):
            out = lm.backbone(input_ids=token, cache=cache, use_cache=True,
                              position_ids=torch.full((rows, 1), context + step))
            cache = out.cache
            lm.head(out.last_hidden_state[:, -1])
        took = 1000 * (time.perf_counter() - start) / steps
        print(f"{rows} rows: {took:.0f} ms a step, {took / rows:.1f} ms a row-step")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=4, help="the first N tasks of SuperNI order A")
    parser.add_argument("--queries", type=int, default=16, help="test prompts answered per task")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds; medians are reported")
    parser.add_argument("--budget", type=int, default=8192, help="MIITA's memory bytes")
    parser.add_argument("--tiny", action="store_true", help="a tiny random LM instead of SmolLM2 (checks the script)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--scan", action="store_true", help="only time one decoding step at 1-64 rows a batch")
    args = parser.parse_args(argv)
    lm = load_lm(LMSpec(name="tiny:llama" if args.tiny else SMOLLM2, threads=args.threads))
    if args.scan:
        step_scan(lm)
        return
    torch.manual_seed(0)
    rows = []
    for name in superni.available()[:args.tasks]:
        task = superni.load_task(name)
        prompts = [p.prompt for p in task.test[:args.queries]]
        memory = steering(lm, task, args.budget)
        seqs = [lm.prompt_tokens(p) for p in prompts]
        lm.spec = replace(lm.spec, **NOW)
        shared = lm.shared_prefix(seqs)
        seconds: dict[str, list[float]] = {w: [] for w in WAYS}
        answers: dict[str, list] = {}
        for _ in range(args.repeats):
            for way in WAYS:
                took, answers[way] = answer(lm, way, prompts, task.max_answer_tokens, memory)
                seconds[way].append(took)
        ms = {w: 1000 * statistics.median(s) / len(prompts) for w, s in seconds.items()}
        rows.append({"task": name, "queries": len(prompts), "read": sum(len(s.ids) for s in seqs) / len(seqs),
                     "own": sum(len(s.ids) - shared for s in seqs) / len(seqs), "cap": task.max_answer_tokens,
                     "generated": sum(map(len, answers["base, now"])) / len(prompts), "ms": ms,
                     "same": {k: answers[f"{k}, before"] == answers[f"{k}, now"] for k in ("base", "miita")}})
    print("| task | queries | prompt tokens (own) | answer cap (generated) | "
          + " | ".join(f"{w} ms (x floor)" for w in WAYS) + " | speed-up base / miita | same tokens |")
    print("|---" * (6 + len(WAYS)) + "|")
    for r in rows:
        ms, floor = r["ms"], r["ms"]["floor"]
        cells = " | ".join(f"{ms[w]:.0f} ({ms[w] / floor:.2f}x)" for w in WAYS)
        speed = f"{ms['base, before'] / ms['base, now']:.2f}x / {ms['miita, before'] / ms['miita, now']:.2f}x"
        same = "yes" if all(r["same"].values()) else ", ".join(k for k, v in r["same"].items() if not v) + " differ"
        print(f"| {r['task']} | {r['queries']} | {r['read']:.0f} ({r['own']:.0f}) | {r['cap']} ({r['generated']:.1f}) "
              f"| {cells} | {speed} | {same} |")
    total = {w: sum(r["ms"][w] * r["queries"] for r in rows) / sum(r["queries"] for r in rows) for w in WAYS}
    print("\nall tasks, ms per query: " + ", ".join(f"{w} {total[w]:.0f}" for w in WAYS))
    print(f"miita / base (now): {total['miita, now'] / total['base, now']:.2f}x; "
          f"base before / now: {total['base, before'] / total['base, now']:.2f}x; "
          f"miita before / now: {total['miita, before'] / total['miita, now']:.2f}x; "
          f"miita (now) / floor: {total['miita, now'] / total['floor']:.2f}x")


if __name__ == "__main__":
    main()
