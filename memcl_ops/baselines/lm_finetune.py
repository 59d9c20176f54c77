"""Sequential LoRA fine-tuning of a causal LM, task after task: the LM stream's forgetting reference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.models.lora import TARGET_PRESETS, LoRAAdapters, LoRAConfig
from memcl_ops.training import OptimConfig, optimize

if TYPE_CHECKING:
    from memcl_ops.models.causal_lm import CausalLM


@dataclass(frozen=True)
class FinetuneConfig:
    """Sequential LoRA fine-tuning [R]: rank 8, α 16 on q_proj/v_proj (docs/methods.md, "MIITA"),
    a few epochs per task at a LoRA-typical learning rate."""

    lora: LoRAConfig = LoRAConfig(targets=TARGET_PRESETS["llama_qv"])
    optim: OptimConfig = OptimConfig(epochs=3, lr=1e-3, batch_size=8)


def finetune(lm: CausalLM, adapters: LoRAAdapters, batches: Sequence[pa.RecordBatch], config: OptimConfig,
             seed: int) -> list[float]:
    """Teacher-forced cross-entropy on the answer tokens of the text pairs of `batches`, LoRA factors only (the
    backbone stays frozen); the model is in training mode only meanwhile. Returns the loss per epoch."""
    prompts, answers = [], []
    for batch in batches:
        p, a = S.text_pairs(batch)
        prompts += p
        answers += a
    lm.model.train()
    try:
        return optimize(adapters.parameters(),
                        lambda idx: lm.answer_loss([prompts[i] for i in idx], [answers[i] for i in idx]),
                        len(prompts), config, seed)
    finally:
        lm.model.eval()
