"""The LM family's baselines as in-process `StreamLearner`s, driven the way pipeline/lm.py drives the
LMEncoder, MemoryManager and LMTrainer actors: `FrozenLM` (the frozen base), `TextReplay` (stored examples as
demonstrations) and `SequentialLoRA` (LoRA fine-tuning task after task). `predict` answers a text-pair batch with
the generated answer strings (greedy, `max_new_tokens`); each learner loads its own copy of the LM."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.baselines.lm_finetune import finetune
from memcl_ops.baselines.text_replay import TextReplayBuffer, add_examples
from memcl_ops.learner import Round
from memcl_ops.methods import LMMethodConfig, MethodSpec
from memcl_ops.miita.directions import extract_directions
from memcl_ops.models.causal_lm import LMSpec, load_lm
from memcl_ops.models.lora import LoRAAdapters
from memcl_ops.tensors import array_bytes, parameter_bytes, prefixed, state_part


class FrozenLM:
    """`base`: the frozen causal LM; it learns nothing. The other LM learners add their memory to it."""

    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, max_new_tokens: int = 4,
                 seed: int = 0):
        self.tags, self.config, self.seed, self.max_new_tokens = spec.tags, config, seed, max_new_tokens
        self.lm = load_lm(lm)

    def begin_round(self, round: Round) -> None:
        del round  # what a visit holds is in its batches (task ids included)

    def observe(self, batch: pa.RecordBatch) -> None:
        del batch

    def consolidate(self) -> dict[str, object]:
        return {}

    def predict(self, batch: pa.RecordBatch) -> list[str]:
        prompts, _ = S.text_pairs(batch)
        return self.generate(prompts)

    def generate(self, prompts: list[str]) -> list[str]:
        return self.lm.generate(prompts, self.max_new_tokens).texts

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        del state

    def memory_bytes(self) -> dict[str, int]:
        return {}


class TextReplay(FrozenLM):
    """`replay`: every observed pair is offered to a byte-budgeted buffer with its teacher-forced key; a prompt is
    answered after the stored examples nearest to its query key."""

    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, budget: int, max_new_tokens: int = 4,
                 seed: int = 0):
        super().__init__(spec, config, lm, max_new_tokens, seed)
        self.buffer = TextReplayBuffer(self.lm.hidden_size, replace(config.replay, budget_bytes=budget))

    def observe(self, batch: pa.RecordBatch) -> None:
        add_examples(self.buffer, batch, extract_directions(self.lm, batch))

    def generate(self, prompts: list[str]) -> list[str]:
        shown = self.buffer.nearest(self.lm.query_keys(prompts))
        return self.lm.generate(prompts, self.max_new_tokens, demonstrations=shown).texts

    def state(self) -> dict[str, np.ndarray]:
        return self.buffer.state()

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.buffer.restore(state)

    def memory_bytes(self) -> dict[str, int]:
        """The budgeted UTF-8 text, plus what a checkpoint keeps beside it: the cached keys (recomputable from the
        text, so outside the budget) and the task ids and counters."""
        state = self.buffer.state()
        return {"replay_text": self.buffer.nbytes(), "replay_keys": state["keys"].nbytes,
                "bookkeeping": array_bytes({k: state[k] for k in ("tasks", "counters")})}


class SequentialLoRA(FrozenLM):
    """`lora`: LoRA on the LM's q/v projections, fine-tuned on each round's pairs at `consolidate`."""

    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, max_new_tokens: int = 4,
                 seed: int = 0):
        super().__init__(spec, config, lm, max_new_tokens, seed)
        self.adapters = LoRAAdapters(self.lm.model, config.finetune.lora)
        self.block: list[pa.RecordBatch] = []
        self.rounds = 0  # seeds each round's minibatch order (the LMTrainer's counter)

    def observe(self, batch: pa.RecordBatch) -> None:
        self.block.append(batch)

    def consolidate(self) -> dict[str, object]:
        history = finetune(self.lm, self.adapters, self.block, self.config.finetune.optim,
                           seed=self.seed * 100_003 + self.rounds)
        self.block = []
        self.rounds += 1
        return {"epoch_losses": history}

    def state(self) -> dict[str, np.ndarray]:
        return {**prefixed("lora", self.adapters.factors()), "rounds": np.array(self.rounds)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.adapters.load_factors(state_part(state, "lora"))
        self.rounds = int(state["rounds"])

    def memory_bytes(self) -> dict[str, int]:
        """The LoRA factors: trained weights, not memory of past data, but all a checkpoint of it holds and what
        it adds to the frozen model (reported as the LMTrainer reports them)."""
        return {"adapter": parameter_bytes(self.adapters.parameters())}


LM_BASELINES = {"base": FrozenLM, "replay": TextReplay, "lora": SequentialLoRA}
