"""`MIITALearner`: MIITA (docs/methods.md, "MIITA") as an in-process `StreamLearner`, as pipeline/lm.py
drives it: every observed text-pair batch is extracted by teacher forcing and written into the byte-budgeted
memory (position-aware, or the paper's averaged one for `miita-paper`); prompts are answered by generation with
the memory's temporary update (or, for `nearest-answer`, with the nearest stored answer)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from memcl_ops.baselines.lm_learners import FrozenLM
from memcl_ops.baselines.text_replay import TextReplayBuffer, add_examples
from memcl_ops.methods import LMMethodConfig, MethodSpec
from memcl_ops.miita.answers import adaptation, build_memory, copy_answers
from memcl_ops.miita.directions import extract_directions
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.tensors import array_bytes, prefixed, state_part


class MIITALearner(FrozenLM):
    """`miita`, `miita-paper`, `nearest-answer` and, with a demonstration buffer in the same budget, `miita-replay`."""

    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, budget: int, max_new_tokens: int = 4,
                 seed: int = 0):
        config = spec.resolve_lm(config)
        super().__init__(spec, config, lm, max_new_tokens, seed)
        self.replay, self.budget = None, budget
        if "demonstrations" in spec.tags:
            budget, shown = config.hybrid.budgets(budget)
            self.replay = TextReplayBuffer(self.lm.hidden_size, replace(config.replay, budget_bytes=shown))
        self.memory = build_memory(self.lm.hidden_size, self.lm.vocab_size,
                                   replace(config.memory, budget_bytes=budget))

    def observe(self, batch: pa.RecordBatch) -> None:
        extracted = extract_directions(self.lm, batch)
        self.memory.write_batch(extracted)
        if self.replay is not None:
            self.replay.limit(self.config.hybrid.demonstration_room(self.budget, self.memory.nbytes()))
            add_examples(self.replay, batch, extracted, self.config.hybrid.demonstrate_above_nll)

    def generate(self, prompts: list[str]) -> list[str]:
        adapter = adaptation(self.memory, self.lm.weight, self.config.adapt)
        if self.config.adapt.rule == "copy":
            return copy_answers(self.lm, adapter, prompts)
        if self.replay is None:
            return self.lm.generate(prompts, self.max_new_tokens, adapter).texts
        keys = self.lm.query_keys(prompts)
        return self.lm.generate(prompts, self.max_new_tokens, adapter, self.replay.nearest(keys),
                                query_keys=keys).texts

    def state(self) -> dict[str, np.ndarray]:
        if self.replay is None:
            return self.memory.state()
        return {**prefixed("prototypes", self.memory.state()), **prefixed("replay", self.replay.state())}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        if self.replay is None:
            self.memory.restore(state)
            return
        self.memory.restore(state_part(state, "prototypes"))
        self.replay.restore(state_part(state, "replay"))

    def memory_bytes(self) -> dict[str, int]:
        """Every stored byte (`nbytes`); what a checkpoint keeps beyond it is bookkeeping (the paper's anchor owner
        index, the layout its budget formula leaves implicit; replay's task ids and counters) and replay's cached
        keys (recomputable from the text, outside the budget)."""
        state = self.memory.state()
        extra = {k: state[k] for k in ("anchor_owner", "counters") if k in state}
        report = {"prototypes": self.memory.nbytes()}
        if self.replay is not None:
            replay = self.replay.state()
            extra |= {f"replay.{k}": replay[k] for k in ("tasks", "counters")}
            report |= {"replay_text": self.replay.nbytes(), "replay_keys": replay["keys"].nbytes}
        return {**report, **({"bookkeeping": array_bytes(extra)} if extra else {})}
