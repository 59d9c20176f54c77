"""NSR's registered methods: NSR, and its memoryless baselines (the same learner with the fresh / keep allocation
rule). Found by name through the registry (memcl_ops/methods.py)."""

from __future__ import annotations

from memcl_ops.spec import MethodSpec

TAGS = frozenset({"trains-backbone"})  # task-aware: the bank is keyed at task arrival

METHODS = [
    MethodSpec("nsr", "NSR: LoRA in the frozen encoder, compressed into a task bank, recalled at task arrival",
               family="nsr", tags=TAGS),
    MethodSpec("nsr-fresh", "NSR's learner without a bank: a fresh adapter for every visit (memoryless)",
               family="nsr", tags=TAGS, fixed={"nsr": {"allocation": "fresh"}}, role="baseline"),
    MethodSpec("nsr-keep", "NSR's learner without a bank: one adapter kept training across visits (memoryless)",
               family="nsr", tags=TAGS, fixed={"nsr": {"allocation": "keep"}}, role="baseline"),
]
