"""Continual-learning methods for a frozen small LM on (prompt, answer) streams, compared at one byte budget.

| method | persistent memory (counted against C_mem) | learning | inference |
|---|---|---|---|
| `base` | none | none | greedy decoding of the frozen model |
| `miita` | direction prototypes (fp16 tensor bytes) | WRITE of each (k_m, R_m) | gated pre-LM-head update per step |
| `replay` | stored examples (UTF-8 bytes) | add, evict to stay in budget | nearest examples as demonstrations |
| `lora` | none (the forgetting reference) | sequential LoRA fine-tuning per task | decoding with the adapter |

All knobs live in `LMMethodConfig`; the runner sets the budget of the memory methods per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import torch

from memcl_ops import schema as S
from memcl_ops.causal_lm import CausalLM
from memcl_ops.lora import TARGET_PRESETS, LoRAAdapters, LoRAConfig
from memcl_ops.miita import AdaptConfig, DirectionMemory, MemoryConfig
from memcl_ops.text_replay import ReplayConfig, TextReplayBuffer
from memcl_ops.training import OptimConfig, optimize

LM_METHODS = {
    "base": "the frozen model, no memory",
    "miita": "MIITA: direction prototypes + gated temporary pre-LM-head update",
    "replay": "text replay: stored examples, nearest by key, as demonstrations in the prompt (UTF-8 budget)",
    "lora": "sequential LoRA fine-tuning of q/v projections, no memory (forgetting reference)",
}
MEMORY_METHODS = ("miita", "replay")  # the methods that take a byte budget


@dataclass(frozen=True)
class FinetuneConfig:
    """Sequential LoRA fine-tuning [R]: rank 8, α 16 on q_proj/v_proj (docs/methods.md, "MIITA"),
    a few epochs per task at a LoRA-typical learning rate."""

    lora: LoRAConfig = LoRAConfig(targets=TARGET_PRESETS["llama_qv"])
    optim: OptimConfig = OptimConfig(epochs=3, lr=1e-3, batch_size=8)


@dataclass(frozen=True)
class LMMethodConfig:
    memory: MemoryConfig = MemoryConfig()
    adapt: AdaptConfig = AdaptConfig()
    replay: ReplayConfig = ReplayConfig()
    finetune: FinetuneConfig = FinetuneConfig()


def check_method(name: str) -> str:
    if name not in LM_METHODS:
        raise ValueError(f"unknown LM method {name!r}; known: {sorted(LM_METHODS)}")
    return name


def write_directions(memory: DirectionMemory, extracted: pa.RecordBatch) -> dict[str, int]:
    """WRITE every row of a key/direction batch, in stream order; returns what the writes did."""
    keys = torch.from_numpy(S.column_matrix(extracted, S.KEY).copy())
    corrections = torch.from_numpy(S.column_matrix(extracted, S.DIRECTION).copy())
    outcome = {"new": 0, "merged": 0, "skipped": 0, "repairs": 0}
    for k, r in zip(keys, corrections):
        result = memory.write(k, r)
        outcome[result.action] += 1
        outcome["repairs"] += result.repairs
    return outcome


def add_examples(buffer: TextReplayBuffer, pairs: pa.RecordBatch, extracted: pa.RecordBatch) -> None:
    """Offer every pair of a batch to the replay buffer, with the key the LM extracted for it."""
    if not (S.sample_ids_to_numpy(pairs) == S.sample_ids_to_numpy(extracted)).all():
        raise S.BatchError("the key batch does not match the text-pair batch row for row", column=S.SAMPLE_ID,
                           sample_ids=S.sample_ids_to_numpy(pairs).tolist(), reason="mismatch")
    prompts, answers = S.text_pairs(pairs)
    keys = torch.from_numpy(S.column_matrix(extracted, S.KEY).copy())
    for prompt, answer, task, key in zip(prompts, answers, S.task_ids_to_numpy(pairs), keys):
        buffer.add(prompt, answer, int(task), key)


def finetune(lm: CausalLM, adapters: LoRAAdapters, prompts: list[str], answers: list[str], config: OptimConfig,
             seed: int) -> list[float]:
    """Teacher-forced cross-entropy on the answer tokens, LoRA factors only (the backbone stays frozen)."""
    return optimize(adapters.parameters(),
                    lambda idx: lm.answer_loss([prompts[i] for i in idx], [answers[i] for i in idx]),
                    len(prompts), config, seed)


PREDICTION = "prediction"
ANSWER_NLL = "answer_nll"


def with_predictions(pairs: pa.RecordBatch, texts: list[str], answer_nll: torch.Tensor) -> pa.RecordBatch:
    """The text-pair batch with each row's generated text and the teacher-forced NLL of its answer appended."""
    out = pairs.append_column(pa.field(PREDICTION, pa.string(), nullable=False), pa.array(texts, pa.string()))
    return out.append_column(pa.field(ANSWER_NLL, pa.float32(), nullable=False),
                             pa.array(answer_nll.numpy().astype("float32")))
