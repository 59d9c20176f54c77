"""`MIITALearner`: MIITA (docs/methods.md, "MIITA") as an in-process `StreamLearner`, as pipeline/lm.py
drives it: every observed text-pair batch is extracted by teacher forcing and written into the byte-budgeted
memory (position-aware, or the paper's averaged one for `miita-paper`); prompts are answered by generation with
the memory's temporary update (or, for `nearest-answer`, with the nearest stored answer)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from memcl_ops.baselines.lm_learners import FrozenLM
from memcl_ops.methods import LMMethodConfig, MethodSpec
from memcl_ops.miita.answers import adaptation, build_memory, copy_answers
from memcl_ops.miita.directions import extract_directions
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.tensors import array_bytes


class MIITALearner(FrozenLM):
    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, budget: int, max_new_tokens: int = 4,
                 seed: int = 0):
        config = spec.resolve_lm(config)
        super().__init__(spec, config, lm, max_new_tokens, seed)
        self.memory = build_memory(self.lm.hidden_size, self.lm.vocab_size,
                                   replace(config.memory, budget_bytes=budget))

    def observe(self, batch: pa.RecordBatch) -> None:
        self.memory.write_batch(extract_directions(self.lm, batch))

    def generate(self, prompts: list[str]) -> list[str]:
        adapter = adaptation(self.memory, self.lm.weight, self.config.adapt)
        if self.config.adapt.rule == "copy":
            return copy_answers(self.lm, adapter, prompts)
        return self.lm.generate(prompts, self.max_new_tokens, adapter).texts

    def state(self) -> dict[str, np.ndarray]:
        return self.memory.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.memory.restore(state)

    def memory_bytes(self) -> dict[str, int]:
        """Every stored byte (`nbytes`); what a checkpoint keeps beyond it is the write counters (0-d) and, for the
        paper's memory, the anchors' owner index (the layout its budget formula leaves implicit)."""
        state = self.memory.state()
        extra = {k: state[k] for k in ("anchor_owner", "counters") if k in state}
        return {"prototypes": self.memory.nbytes(), **({"bookkeeping": array_bytes(extra)} if extra else {})}
