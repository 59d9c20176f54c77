"""`MIITALearner`: MIITA (docs/methods.md, "MIITA") as an in-process `StreamLearner`, as pipeline/lm.py
drives it: every observed text-pair batch is extracted by teacher forcing and written into the byte-budgeted
direction memory; prompts are answered by generation with the memory's gated temporary update."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from memcl_ops.baselines.lm_learners import FrozenLM
from memcl_ops.methods import LMMethodConfig, MethodSpec
from memcl_ops.miita.directions import Adaptation, DirectionMemory, extract_directions, write_directions
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.tensors import array_bytes


class MIITALearner(FrozenLM):
    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, budget: int, max_new_tokens: int = 4,
                 seed: int = 0):
        super().__init__(spec, config, lm, max_new_tokens, seed)
        hidden = self.lm.hidden_size
        self.memory = DirectionMemory(hidden, hidden, replace(config.memory, budget_bytes=budget))

    def observe(self, batch: pa.RecordBatch) -> None:
        write_directions(self.memory, extract_directions(self.lm, batch))

    def generate(self, prompts: list[str]) -> list[str]:
        adaptation = Adaptation(self.memory, self.lm.weight, self.config.adapt)
        return self.lm.generate(prompts, self.max_new_tokens, adaptation).texts

    def state(self) -> dict[str, np.ndarray]:
        return self.memory.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.memory.restore(state)

    def memory_bytes(self) -> dict[str, int]:
        """The budgeted prototypes, plus what a checkpoint keeps beside them: the anchors' owner index (the layout
        the budget formula leaves implicit) and the write counters."""
        state = self.memory.state()
        return {"prototypes": self.memory.nbytes(),
                "bookkeeping": array_bytes({k: state[k] for k in ("anchor_owner", "counters")})}
