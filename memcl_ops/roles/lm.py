"""The flow of an "lm" method (MIITA and its variants, text replay, sequential LoRA, the frozen base), written once:
the in-process learner (memcl_ops/learners/lm.py) runs it over roles in this process, `memcl lm` over actors
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

from memcl_ops.method_config import LMMethodConfig
from memcl_ops.miita.directions import MemoryConfig
from memcl_ops.miita.store import TextMemoryStore
from memcl_ops.roles.executor import Executor, store_call
from memcl_ops.roles.memory_manager import StoreSpec
from memcl_ops.spec import MethodSpec


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
