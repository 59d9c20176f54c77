"""Text replay in the prompt under a byte budget: the memory baseline beside MIITA
(docs/methods.md, "MIITA").

Stored (prompt, answer) examples count their UTF-8 bytes against the same `C_mem` MIITA's prototypes count
their tensor bytes against. At inference the stored examples nearest to the query by semantic key (the same
frozen-LM key as MIITA's anchors, Eq. 1) are shown as demonstrations before the query.

The keys are not counted: they are a function of the stored text and the frozen model, so they can be
recomputed from the text at any time; they are cached only to save that forward pass.

Eviction when a write exceeds the budget [R]: drop a random example of the task holding the most bytes, so the
buffer stays balanced over tasks (class-balanced rehearsal buffers in the style of GDumb/ER); an example larger
than the budget is not stored (`too_large`). Beside MIITA's prototypes (`miita-replay`) the budget is what the
prototypes leave (`limit`), so there an example can also be refused because the prototypes took the room.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.tensors import normalize


@dataclass(frozen=True)
class ReplayConfig:
    budget_bytes: int = 256 * 1024  # C_mem, in UTF-8 bytes of stored text
    demonstrations: int = 3  # stored examples shown before each query, nearest by key
    seed: int = 0  # eviction draws

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0 or self.demonstrations < 1:
            raise ValueError(f"budget_bytes ({self.budget_bytes}) and demonstrations ({self.demonstrations}) "
                             "must be positive")


def text_bytes(prompt: str, answer: str) -> int:
    return len(prompt.encode("utf-8")) + len(answer.encode("utf-8"))


class TextReplayBuffer:
    def __init__(self, key_dim: int, config: ReplayConfig = ReplayConfig()):
        self.key_dim, self.config = key_dim, config
        self.budget = config.budget_bytes  # bytes of text it may hold now (`limit` lowers it beside prototypes)
        self.prompts: list[str] = []
        self.answers: list[str] = []
        self.tasks: list[int] = []
        self.keys = torch.zeros(0, key_dim)
        self.rng = np.random.default_rng(config.seed)
        self.seen = 0
        self.evicted = 0
        self.too_large = 0

    def __len__(self) -> int:
        return len(self.prompts)

    def nbytes(self) -> int:
        return sum(text_bytes(p, a) for p, a in zip(self.prompts, self.answers))

    def add(self, prompt: str, answer: str, task: int, key: torch.Tensor) -> None:
        self.seen += 1
        if text_bytes(prompt, answer) > self.budget:
            self.too_large += 1
            return
        key = torch.as_tensor(key, dtype=torch.float32).reshape(1, -1)
        if key.shape[1] != self.key_dim:
            raise ValueError(f"key has {key.shape[1]} values, the buffer expects {self.key_dim}")
        self.prompts.append(prompt)
        self.answers.append(answer)
        self.tasks.append(int(task))
        self.keys = torch.cat([self.keys, normalize(key)])
        while self.nbytes() > self.budget:
            self._evict()

    def limit(self, budget: int) -> None:
        """Hold at most `budget` bytes (at most the configured budget) from now on, evicting until it fits."""
        self.budget = max(0, min(int(budget), self.config.budget_bytes))
        while self.nbytes() > self.budget:
            self._evict()

    def _evict(self) -> None:
        per_task: dict[int, int] = {}
        for p, a, t in zip(self.prompts, self.answers, self.tasks):
            per_task[t] = per_task.get(t, 0) + text_bytes(p, a)
        fullest = max(per_task, key=lambda t: (per_task[t], t))
        rows = [i for i, t in enumerate(self.tasks) if t == fullest]
        i = int(self.rng.choice(rows))
        del self.prompts[i], self.answers[i], self.tasks[i]
        self.keys = torch.cat([self.keys[:i], self.keys[i + 1:]])
        self.evicted += 1

    def nearest(self, query_keys: torch.Tensor) -> list[list[tuple[str, str]]]:
        """Per query, up to `demonstrations` stored (prompt, answer) pairs, least similar first (the nearest
        example sits right before the query)."""
        if not len(self):
            return [[] for _ in range(len(query_keys))]
        sims = normalize(torch.as_tensor(query_keys, dtype=torch.float32)) @ self.keys.T
        top = sims.topk(min(self.config.demonstrations, len(self)), dim=1).indices.flip(1)
        return [[(self.prompts[i], self.answers[i]) for i in row] for row in top.tolist()]

    def state(self) -> dict[str, np.ndarray]:
        return {"prompts": np.array(self.prompts, dtype=np.str_), "answers": np.array(self.answers, dtype=np.str_),
                "tasks": np.array(self.tasks, dtype=np.int64), "keys": self.keys.numpy().copy(),
                "rng": np.array(json.dumps(self.rng.bit_generator.state)),
                "counters": np.array([self.seen, self.evicted, self.too_large], dtype=np.int64),
                "budget": np.array(self.budget, dtype=np.int64)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.prompts = [str(p) for p in state["prompts"]]
        self.answers = [str(a) for a in state["answers"]]
        self.tasks = [int(t) for t in state["tasks"]]
        self.keys = torch.from_numpy(np.array(state["keys"], dtype=np.float32)).reshape(-1, self.key_dim)
        self.rng.bit_generator.state = json.loads(str(state["rng"]))
        self.seen, self.evicted, self.too_large = (int(x) for x in state["counters"])
        self.budget = int(state["budget"])


def add_examples(buffer: TextReplayBuffer, pairs: pa.RecordBatch, extracted: pa.RecordBatch,
                 above_nll: float | None = None) -> None:
    """Offer every pair of a batch to the replay buffer, with the key the LM extracted for it; with `above_nll`, only
    the pairs whose answer the frozen model finds harder than that (mean NLL)."""
    if not (S.sample_ids_to_numpy(pairs) == S.sample_ids_to_numpy(extracted)).all():
        raise S.BatchError("the key batch does not match the text-pair batch row for row", column=S.SAMPLE_ID,
                           sample_ids=S.sample_ids_to_numpy(pairs).tolist(), reason="mismatch")
    prompts, answers = S.text_pairs(pairs)
    keys = torch.from_numpy(S.column_matrix(extracted, S.KEY).copy())
    hard = (np.asarray(extracted.column(S.ANSWER_NLL)) > above_nll if above_nll is not None
            else np.ones(len(prompts), dtype=bool))
    for prompt, answer, task, key, kept in zip(prompts, answers, S.task_ids_to_numpy(pairs), keys, hard):
        if kept:
            buffer.add(prompt, answer, int(task), key)
