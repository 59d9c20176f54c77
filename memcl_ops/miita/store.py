"""The LM family's memory as a store of the memory manager (memcl_ops/roles/memory_manager.py): MIITA's prototype
memory, text replay's demonstrations, or both in one byte budget (`miita-replay`), and the sample ids written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.baselines.text_replay import ReplayConfig, TextReplayBuffer, add_examples
from memcl_ops.miita.answers import build_memory
from memcl_ops.miita.directions import MemoryConfig
from memcl_ops.tensors import SampleIds, prefixed, state_part


@dataclass(frozen=True)
class HybridConfig:
    """`miita-replay`: one byte budget, split between MIITA's prototypes and replayed demonstrations [R]."""

    # "prototypes-first": the prototypes may take the whole budget (repair keeps them inside it) and the
    # demonstrations hold what they leave, re-limited after every write, so at a tight budget miita-replay is miita
    # and demonstrations come in as the budget loosens; "share": a fixed `direction_share` of the budget each.
    split: Literal["prototypes-first", "share"] = "prototypes-first"
    direction_share: float = 0.5  # "share": of the budget for the prototypes; the rest holds demonstrations
    # an example is also kept as a demonstration only when the frozen model's mean answer NLL exceeds this (what it
    # cannot do; 0: every example); every example is written as a prototype (~90 bytes)
    demonstrate_above_nll: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.direction_share < 1.0:
            raise ValueError(f"direction_share must be in (0, 1), got {self.direction_share}")

    def budgets(self, total: int) -> tuple[int, int]:
        """(prototype bytes, the most demonstration bytes) of a total budget."""
        if self.split == "prototypes-first":
            return total, total
        prototypes = int(total * self.direction_share)
        return prototypes, total - prototypes

    def demonstration_room(self, total: int, prototype_bytes: int) -> int:
        """What the demonstrations may hold beside `prototype_bytes` of prototypes (after each write)."""
        return total - prototype_bytes if self.split == "prototypes-first" else self.budgets(total)[1]


class TextMemoryStore:
    """`hidden`: the LM's hidden size (the keys' width); `vocab`: its vocabulary (position-aware prototypes store
    answer token ids)."""

    def __init__(self, hidden: int, vocab: int, prototypes: MemoryConfig | None, replay: ReplayConfig | None):
        self.prototypes = build_memory(hidden, vocab, prototypes) if prototypes is not None else None
        self.replay = TextReplayBuffer(hidden, replay) if replay is not None else None
        self.learned = SampleIds()  # sample ids written, for exactly-once accounting

    def write_prototypes(self, extracted: pa.RecordBatch) -> dict[str, int]:
        """MIITA WRITE (with repair) of every (key, direction) row, in stream order."""
        self.learned.add(S.sample_ids_to_numpy(extracted))
        return self.prototypes.write_batch(extracted)

    def write_replay(self, pairs: pa.RecordBatch, extracted: pa.RecordBatch) -> int:
        add_examples(self.replay, pairs, extracted)
        self.learned.add(S.sample_ids_to_numpy(pairs))
        return len(self.replay)

    def write_both(self, pairs: pa.RecordBatch, extracted: pa.RecordBatch, hybrid: HybridConfig,
                   total_budget: int) -> dict[str, int]:
        """`miita-replay`: every row as a prototype, the rows the frozen model finds hard also as demonstrations,
        which hold what `hybrid` leaves them of `total_budget` beside the prototypes."""
        outcome = self.prototypes.write_batch(extracted)
        self.replay.limit(hybrid.demonstration_room(total_budget, self.prototypes.nbytes()))
        add_examples(self.replay, pairs, extracted, hybrid.demonstrate_above_nll)
        self.learned.add(S.sample_ids_to_numpy(pairs))
        return {**outcome, "stored": len(self.replay)}

    def prototype_state(self) -> dict[str, np.ndarray]:
        return self.prototypes.state()

    def demonstrations(self, query_keys: np.ndarray) -> list[list[tuple[str, str]]]:
        """The stored examples nearest to each query key (text replay in the prompt)."""
        return self.replay.nearest(torch.from_numpy(np.array(query_keys)))

    def learned_counts(self) -> tuple[int, int]:
        """(pairs written, distinct sample ids among them)."""
        return self.learned.added, len(self.learned)

    def report(self) -> dict[str, int]:
        out = {}
        if self.prototypes is not None:
            out["prototypes"] = self.prototypes.nbytes()
        if self.replay is not None:
            out["replay_text"] = self.replay.nbytes()
        return out

    def state(self) -> dict[str, np.ndarray]:
        out = prefixed("learned", self.learned.state())
        for name, part in (("prototypes", self.prototypes), ("replay", self.replay)):
            if part is not None:
                out.update(prefixed(name, part.state()))
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        for name, part in (("prototypes", self.prototypes), ("replay", self.replay)):
            if part is not None:
                part.restore(state_part(state, name))
        self.learned.restore(state_part(state, "learned"))
