"""`LMLearner`: any "lm" method (MIITA, its ablations, text replay, sequential LoRA, the frozen base) as one
in-process `StreamLearner`: the family's one flow (memcl_ops/roles/lm.py) over its roles held here as plain
objects, each with its own copy of the LM where the pipeline's actors have one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.learner import Round
from memcl_ops.method_config import LMMethodConfig
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.roles.executor import InProcess
from memcl_ops.roles.lm import LMFlow
from memcl_ops.roles.lm_encoder import LMEncoder
from memcl_ops.roles.lm_trainer import LMTrainer
from memcl_ops.roles.memory_manager import MemoryManager
from memcl_ops.spec import MethodSpec
from memcl_ops.tensors import array_bytes, prefixed, state_part


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
            learned = role.stores["text"].learned if name == "memory" else getattr(role, "learned", None)
            if learned is not None:
                out[f"{name}.sample_ids"] = int(learned.ranges.nbytes)
            if name == "memory":
                state = role.state()
                for part, reported in (("prototypes", "prototypes"), ("replay", "replay_text")):
                    if reported in out:
                        out[f"{part}.bookkeeping"] = array_bytes(state_part(state, f"text.{part}")) - out[reported]
        return out
