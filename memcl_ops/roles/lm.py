"""The flow of an "lm" method (MIITA and its variants, text replay, sequential LoRA, the frozen base), written once:
the in-process learner (`LMLearner`, here) runs it over roles in this process, `memcl lm` over actors
(pipeline/lm.py).

Per training batch of text pairs:
    lm_encoder.extract (teacher-forced key and correction) -> text.write_prototypes          (MIITA)
                                                    └─────> text.write_replay                (text replay)
                                                    └─────> text.write_both                  (MIITA + replay)
Per task:   lm_trainer.train on the task's batches                                           (LoRA)
Answering:  text.prototype_state -> lm_encoder.generate(adapted)                             (MIITA)
            lm_encoder.query_keys -> text.demonstrations -> lm_encoder.generate(shown)       (replay)
(`text` is the memory manager's store of the method's prototypes and demonstrations, memcl_ops/miita/store.py.)
            lm_trainer.generate (LoRA); lm_encoder.generate (the frozen base)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round
from memcl_ops.method_config import LMMethodConfig
from memcl_ops.miita.directions import MemoryConfig
from memcl_ops.miita.store import TextMemoryStore
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.roles.executor import Executor, InProcess, store_call
from memcl_ops.roles.lm_encoder import LMEncoder
from memcl_ops.roles.lm_trainer import LMTrainer
from memcl_ops.roles.memory_manager import MemoryManager, StoreSpec
from memcl_ops.spec import MethodSpec
from memcl_ops.tensors import array_bytes, prefixed, state_part


class LMFlow:
    """One (method, budget) run's flow over its roles. `method`: the config with the method's fixed settings."""

    def __init__(self, executor: Executor, spec: MethodSpec, method: LMMethodConfig, budget: int | None):
        self.x, self.spec, self.method, self.budget = executor, spec, method, budget
        self.prototypes = "direction-memory" in spec.tags
        self.demonstrations = "demonstrations" in spec.tags
        self.trains = "trains-backbone" in spec.tags

    @property
    def memory_config(self) -> MemoryConfig:
        """The prototype memory's settings: its share of the budget (all of it, without demonstrations)."""
        both = self.prototypes and self.demonstrations
        budget = self.method.hybrid.budgets(self.budget)[0] if both else self.budget
        return replace(self.method.memory, budget_bytes=budget)

    def stores(self, hidden: int, vocab: int) -> dict[str, StoreSpec]:
        """The memory manager's stores (none: the method keeps no memory); the budget caps both parts together.
        `hidden`, `vocab`: the LM's hidden size and vocabulary."""
        if not (self.prototypes or self.demonstrations):
            return {}
        shown = self.method.hybrid.budgets(self.budget)[1] if self.prototypes else self.budget
        return {"text": StoreSpec(TextMemoryStore, (
            hidden, vocab, self.memory_config if self.prototypes else None,
            replace(self.method.replay, budget_bytes=shown) if self.demonstrations else None))}

    def extract(self, pairs: Any) -> Any:
        return self.x.call("lm_encoder", "extract", pairs)

    def learn_batch(self, pairs: Any, extracted: Any) -> Any:
        """Write one batch into the memory (its report), or None for a method without one."""
        if self.prototypes and self.demonstrations:
            return store_call(self.x, "text", "write_both", pairs, extracted, self.method.hybrid, self.budget)
        if self.prototypes:
            return store_call(self.x, "text", "write_prototypes", extracted)
        if self.demonstrations:
            return store_call(self.x, "text", "write_replay", pairs, extracted)
        return None

    def learn_task(self, batches: list[Any]) -> Any:
        """Fine-tune on one task's batches (the epochs' losses), or None for a method that does not train."""
        return self.x.call("lm_trainer", "train", *batches) if self.trains else None

    def query_keys(self, pairs: Any) -> Any:
        return self.x.call("lm_encoder", "query_keys", pairs)

    def answer(self, pairs: Any, max_new_tokens: int, query_keys: Any = None) -> Any:
        """The pairs with the method's generated answers (`S.with_predictions`); `query_keys`: the prompts' keys
        (`query_keys`), for a method showing demonstrations (computed here when not given)."""
        x = self.x
        if self.trains:
            return x.call("lm_trainer", "generate", pairs, max_new_tokens)
        if self.demonstrations and query_keys is None:
            query_keys = self.query_keys(pairs)
        shown = store_call(x, "text", "demonstrations", query_keys) if self.demonstrations else None
        if self.prototypes:
            state = store_call(x, "text", "prototype_state")
            if shown is None:
                return x.call("lm_encoder", "generate", pairs, max_new_tokens, state, self.memory_config,
                              self.method.adapt)
            return x.call("lm_encoder", "generate", pairs, max_new_tokens, state, self.memory_config,
                          self.method.adapt, shown, query_keys)
        if shown is not None:
            return x.call("lm_encoder", "generate", pairs, max_new_tokens, demonstrations=shown)
        return x.call("lm_encoder", "generate", pairs, max_new_tokens)

    def memory_report(self) -> dict[str, int]:
        """Bytes of the method's memory (stores) or, for LoRA, of its adapter."""
        if self.x.has("memory"):
            return self.x.get(self.x.call("memory", "memory_report"))
        if self.trains:
            return self.x.get(self.x.call("lm_trainer", "memory_bytes"))
        return {}


class LMLearner:
    """Any "lm" method as one in-process `StreamLearner`: its roles as plain objects (each with its own copy of the
    LM where the pipeline's actors have one), `predict` answers a text-pair batch with the generated strings."""

    def __init__(self, spec: MethodSpec, config: LMMethodConfig, lm: LMSpec, budget: int | None = None,
                 max_new_tokens: int = 4, seed: int = 0):
        self.tags, self.max_new_tokens = spec.tags, max_new_tokens
        flow = LMFlow(InProcess({}), spec, spec.resolve_lm(config), budget)
        roles: dict[str, object] = {}
        if flow.trains:
            roles["lm_trainer"] = LMTrainer(lm, flow.method.finetune, seed)
        else:
            roles["lm_encoder"] = encoder = LMEncoder(lm)
            info = encoder.info()
            stores = flow.stores(info["hidden"], info["vocab"])
            if stores:
                roles["memory"] = MemoryManager(stores)
        self.roles = roles
        self.flow = LMFlow(InProcess(roles), spec, flow.method, budget)
        self.block: list[pa.RecordBatch] = []  # the round's batches (LoRA trains on them at `consolidate`)

    def begin_round(self, round: Round) -> None:
        del round  # what a visit holds is in its batches (task ids included)

    def observe(self, batch: pa.RecordBatch) -> None:
        if self.flow.trains:
            self.block.append(batch)
        elif "memory" in self.roles:
            self.flow.learn_batch(batch, self.flow.extract(batch))

    def consolidate(self) -> dict[str, object]:
        block, self.block = self.block, []
        return {"epoch_losses": self.flow.learn_task(block)} if self.flow.trains else {}

    def predict(self, batch: pa.RecordBatch) -> list[str]:
        return self.answer(batch).column(S.PREDICTION).to_pylist()

    def answer(self, batch: pa.RecordBatch, max_new_tokens: int | None = None) -> pa.RecordBatch:
        """The batch with the generated answers (at most `max_new_tokens`, default the learner's), the NLL of each
        reference answer and the prompt tokens read (`S.with_predictions`)."""
        return self.flow.answer(batch, max_new_tokens or self.max_new_tokens)

    def state(self) -> dict[str, np.ndarray]:
        return {k: v for name, role in self.roles.items() for k, v in prefixed(name, role.state()).items()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        for name, role in self.roles.items():
            role.restore(state_part(state, name))

    def memory_bytes(self) -> dict[str, int]:
        """The pipeline's figure (the budgeted store bytes, or LoRA's adapter) and what else a checkpoint holds: the
        sample ids kept for exactly-once accounting and each store's bookkeeping beyond its budgeted bytes (the
        paper's anchor owner index and counters, replay's cached keys and task ids)."""
        out = self.flow.memory_report()
        for name, role in self.roles.items():
            if hasattr(role, "learned_ids"):
                out[f"{name}.sample_ids"] = int(role.learned_ids().nbytes)
            if name == "memory":
                state = role.state()
                for part, reported in (("prototypes", "prototypes"), ("replay", "replay_text")):
                    if reported in out:
                        out[f"{part}.bookkeeping"] = array_bytes(state_part(state, f"text.{part}")) - out[reported]
        return out
