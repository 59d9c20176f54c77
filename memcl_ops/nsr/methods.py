"""NSR's registered methods: NSR (the similarity rule on the bank), round-robin on the same bank, and the memoryless
baselines (the same learner with the fresh / keep allocation rule, without and with each task's own head). Found by
name through the registry (memcl_ops/methods.py). The learned allocation policy is `nsr.allocation: learned` with the
weights a training run gave (memcl_ops/nsr/policy.py); untrained it is no method of its own."""

from __future__ import annotations

from memcl_ops.spec import MethodSpec

TAGS = frozenset({"trains-backbone"})  # task-aware: the bank is keyed at task arrival


def _memoryless(allocation: str, heads: bool) -> dict:
    return {"nsr": {"allocation": allocation, "task_heads": heads}}


METHODS = [
    MethodSpec("nsr", "NSR: LoRA in the frozen encoder, compressed into a task bank, recalled at task arrival",
               family="nsr", tags=TAGS),
    MethodSpec("nsr-round-robin", "NSR's bank with a key-blind rule: each arrival restores the next entry in turn",
               family="nsr", tags=TAGS, fixed={"nsr": {"allocation": "round-robin"}}, role="baseline"),
    MethodSpec("nsr-fresh", "NSR's learner without a bank: a fresh adapter for every visit (memoryless)",
               family="nsr", tags=TAGS, fixed=_memoryless("fresh", False), role="baseline"),
    MethodSpec("nsr-keep", "NSR's learner without a bank: one adapter kept training across visits (memoryless)",
               family="nsr", tags=TAGS, fixed=_memoryless("keep", False), role="baseline"),
    MethodSpec("nsr-fresh-heads", "nsr-fresh keeping each task's head (a few KB): only the adapter is forgotten",
               family="nsr", tags=TAGS, fixed=_memoryless("fresh", True), role="baseline"),
    MethodSpec("nsr-keep-heads", "nsr-keep keeping each task's head (a few KB): only the adapter is shared",
               family="nsr", tags=TAGS, fixed=_memoryless("keep", True), role="baseline"),
]
