"""Sequential LoRA fine-tuning of a causal LM, task after task: the LM stream's forgetting reference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.data_parallel import DataParallel
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
             seed: int, parallel: DataParallel | None = None) -> list[float]:
    """Teacher-forced cross-entropy on the answer tokens of the text pairs of `batches` (per minibatch, the mean
    over its pairs), LoRA factors only (the backbone stays frozen); the model is in training mode only meanwhile.
    `parallel` (DDP around `lm.backbone`): this worker learns its share of every minibatch's pairs, the group as
    one (memcl_ops/data_parallel.py). Returns the loss per epoch, the same on every worker."""
    prompts, answers = [], []
    for batch in batches:
        p, a = S.text_pairs(batch)
        prompts += p
        answers += a

    def loss_on(idx: torch.Tensor) -> torch.Tensor:
        loss = minibatch_loss(lm, [prompts[i] for i in idx], [answers[i] for i in idx], parallel)
        return loss if parallel is None else parallel.group_mean(loss)

    lm.model.train()
    try:
        return optimize(adapters.parameters(), loss_on, len(prompts), config, seed)
    finally:
        lm.model.eval()


def minibatch_loss(lm: CausalLM, prompts: Sequence[str], answers: Sequence[str],
                   parallel: DataParallel | None = None) -> torch.Tensor:
    """One minibatch's mean answer loss over its pairs; data-parallel, this worker's share of the pairs, each weighed
    so that the workers' average is that mean (memcl_ops/data_parallel.py)."""
    if parallel is None:
        return lm.answer_losses(prompts, answers).mean()
    own, weight = parallel.rows(len(prompts))
    losses = lm.answer_losses([prompts[i] for i in own], [answers[i] for i in own], through=parallel.module)
    return losses.sum() * weight
