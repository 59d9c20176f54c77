"""MIITA's registered methods: position-aware MIITA, MIITA as its paper writes it, the copy of the nearest stored
answer (the retrieval's ceiling) and MIITA with replay in one budget. Found by name through the registry
(memcl_ops/methods.py)."""

from __future__ import annotations

from memcl_ops.miita.directions import PAPER_ADAPT, PAPER_MEMORY
from memcl_ops.spec import MethodSpec

METHODS = [
    MethodSpec("miita", "MIITA, position-aware: answer-position prototypes on centred compact keys, the smallest "
               "pre-LM-head step that flips each position to the memory's token", family="lm",
               tags=frozenset({"generative", "byte-budget", "direction-memory"})),
    # MIITA as its paper writes it: one correction averaged over the answer, fp16 raw-key anchors merged at 0.9,
    # K = 3 by relevance + uncertainty, the gated relative step (benchmarks/RESULTS.md, "MIITA, position-aware")
    MethodSpec("miita-paper", "MIITA as written: averaged direction prototypes + gated temporary update", family="lm",
               tags=frozenset({"generative", "byte-budget", "direction-memory"}),
               fixed={"memory": PAPER_MEMORY, "adapt": PAPER_ADAPT}),
    MethodSpec("nearest-answer", "the stored answer of the nearest key in MIITA's memory, copied (no LM decoding; "
               "the retrieval's ceiling)", family="lm", tags=frozenset({"generative", "byte-budget",
                                                                          "direction-memory"}),
               fixed={"adapt": {"rule": "copy"}}, role="baseline"),
    # a new answer becomes a prototype only where the memory beats the model (its vote record): the rest of the
    # budget holds demonstrations, which carry what a memory of answer tokens cannot (benchmarks/RESULTS.md)
    MethodSpec("miita-replay", "MIITA + replay in one budget: position-aware prototypes steer, replayed examples "
               "shown in the prompt", family="lm",
               tags=frozenset({"generative", "byte-budget", "direction-memory", "demonstrations"}),
               fixed={"memory": {"admit": "ahead"}}),
]
