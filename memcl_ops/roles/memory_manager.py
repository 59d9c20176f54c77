"""The memory manager role: owns all persistent memory of a run, one store per kind, each its own object from
memcl_ops (only the stores the method uses exist):

* `slots`: MARS's slot memory (memcl_ops/mars/slots.py), routing every feature batch;
* `statistics`: an analytic head's sums, merged from the encoder replicas (memcl_ops/analytic/ridge.py);
* `bank`: NSR's compressed LoRA bank (memcl_ops/nsr/task_bank.py);
* `prototypes`: MIITA's direction memory (memcl_ops/miita/directions.py);
* `replay`: the text-replay baseline's stored examples (memcl_ops/baselines/text_replay.py).

`memory_report` is the one byte report of all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.analytic.ridge import RidgeStatistics
from memcl_ops.arrow import schema as S
from memcl_ops.baselines.text_replay import ReplayConfig, TextReplayBuffer, add_examples
from memcl_ops.clock import StageClock
from memcl_ops.mars.router import RouterConfig
from memcl_ops.mars.sgse import Expansion
from memcl_ops.mars.slots import SlotMemory
from memcl_ops.methods import HybridConfig
from memcl_ops.miita.answers import build_memory
from memcl_ops.miita.directions import MemoryConfig
from memcl_ops.nsr.adapter import ArrivalPlan, Snapshot, plan_arrival
from memcl_ops.nsr.task_bank import BankConfig, BankEntry, TaskKnowledgeBank
from memcl_ops.tensors import prefixed, state_part


@dataclass(frozen=True)
class Stores:
    """Which stores a run's memory manager holds, and their settings."""

    slots: RouterConfig | None = None
    max_slots: int = 0  # the slot cap (SGSE's max_slots)
    bank: BankConfig | None = None
    prototypes: MemoryConfig | None = None  # with key_dim = hidden size of the LM
    vocab: int = 0  # the LM's vocabulary size (position-aware prototypes store answer token ids)
    replay: ReplayConfig | None = None


class MemoryManager:
    """Hosted in-process (memcl_ops/roles/executor.py) or as an actor (actors/memory_manager.py). `threads`: the
    torch threads of the hosting process (None: leave them, as an in-process host must); `device`: where the slots
    route."""

    def __init__(self, dim: int, stores: Stores, seed: int, threads: int | None = None, device: str = "cpu"):
        self.reset(dim, stores, seed, threads, device)

    def reset(self, dim: int, stores: Stores, seed: int, threads: int | None = None, device: str = "cpu") -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.slots = (SlotMemory(dim, stores.slots, stores.max_slots, seed).to(self.device)
                      if stores.slots is not None else None)
        self.statistics: RidgeStatistics | None = None  # created from the first merged partial
        self.bank = TaskKnowledgeBank(stores.bank) if stores.bank is not None else None
        self.prototypes = (build_memory(dim, stores.vocab, stores.prototypes) if stores.prototypes is not None
                           else None)
        self.replay = TextReplayBuffer(dim, stores.replay) if stores.replay is not None else None
        self.learned: list[np.ndarray] = []  # sample ids written into the LM stores, for exactly-once accounting
        self.kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # the round's features (`keep`)
        self.clock = StageClock()

    def route(self, batch: pa.RecordBatch | None, expansions: list[Expansion] | None = None, keep: bool = False
              ) -> pa.RecordBatch | None:
        """The routing confidence per sample (for SGSE); also folds the batch into the anchor statistics.
        `expansions` (the monitor's verdict on the previous batch) are applied first, which saves the stream a
        separate call per batch. None (every row refused at the gate) passes through. `keep`: also keep the batch
        for `take_block` (the compiled chain, whose batches never reach the driver as object refs)."""
        if expansions:
            self.expand(expansions)
        if batch is None:
            return None
        if keep:  # copied: a compiled graph's input lives in a channel buffer that the next batch overwrites
            self.kept.append((S.sample_ids_to_numpy(batch).copy(), np.array(S.features_to_numpy(batch)),
                              S.labels_to_numpy(batch)))
        with self.clock.time("route"):
            probs = self.slots.route(S.features_to_torch(batch).to(self.device))
            confidence = probs.max(dim=1).values.cpu().numpy()
            return pa.RecordBatch.from_arrays([batch.column(S.SAMPLE_ID), pa.array(confidence)],
                                              names=[S.SAMPLE_ID, "confidence"])

    def expand(self, expansions: list[Expansion]) -> int:
        with self.clock.time("expand"):
            return self.slots.expand(expansions)

    def take_block(self) -> pa.RecordBatch | None:
        """The batches kept since the last take, as one feature batch in stream order (None: none kept): sample ids,
        features and labels, what the trainers read (S.labelled_block); task ids and schema metadata are not kept."""
        kept, self.kept = self.kept, []
        if not kept:
            return None
        ids, feats, labels = (np.concatenate(part) for part in zip(*kept))
        return S.feature_batch(ids, feats, labels)

    def memory_state(self) -> dict[str, np.ndarray]:
        return self.slots.router.state()

    def load_memory(self, state: dict[str, np.ndarray]) -> None:
        self.slots.load_trained(state)

    def history(self) -> dict:
        return self.slots.history()

    def merge_statistics(self, *partials: dict[str, np.ndarray], half_life: int = 0) -> dict[str, np.ndarray]:
        """Add the encoder replicas' partial analytic statistics of one round (exact integer sums: the order does
        not matter) to the total, after forgetting the total by the round's size (`AnalyticConfig.half_life`);
        returns the total's state, from which the head learner solves."""
        with self.clock.time("statistics"):
            block = RidgeStatistics.from_state(partials[0])
            for part in partials[1:]:
                block.merge(RidgeStatistics.from_state(part))
            if self.statistics is None:
                self.statistics = block
            else:
                self.statistics.absorb(block, half_life)
            return self.statistics.state()

    def arrive(self, key: np.ndarray, rank: int) -> ArrivalPlan:
        """NSR task arrival: the bank's retrieval (restore / warm-start mix of rank `rank` / fresh)."""
        with self.clock.time("bank"):
            return plan_arrival(self.bank, key, rank)

    def store_task(self, task: int, key: np.ndarray, snapshot: Snapshot, accuracy: float) -> list[int]:
        """Store (or overwrite) a task's compressed adapter; returns the tasks evicted by the top-K cap."""
        with self.clock.time("bank"):
            return self.bank.store(snapshot.entry(task, key, accuracy))

    def bank_entry(self, task: int) -> BankEntry | None:
        return self.bank.entries.get(task)

    def bank_summary(self) -> dict:
        return {"entries": self.bank.summary(), "evicted": self.bank.evicted, "arrivals": self.bank.clock}

    def write_prototypes(self, extracted: pa.RecordBatch) -> dict[str, int]:
        """MIITA WRITE (with repair) of every (key, direction) row, in stream order."""
        with self.clock.time("prototypes"):
            self.learned.append(S.sample_ids_to_numpy(extracted))
            return self.prototypes.write_batch(extracted)

    def prototype_state(self) -> dict[str, np.ndarray]:
        return self.prototypes.state()

    def write_replay(self, pairs: pa.RecordBatch, extracted: pa.RecordBatch) -> int:
        with self.clock.time("replay"):
            add_examples(self.replay, pairs, extracted)
            self.learned.append(S.sample_ids_to_numpy(pairs))
            return len(self.replay)

    def write_both(self, pairs: pa.RecordBatch, extracted: pa.RecordBatch, hybrid: HybridConfig,
                   total_budget: int) -> dict[str, int]:
        """`miita-replay`: every row as a prototype, the rows the frozen model finds hard also as demonstrations,
        which hold what `hybrid` leaves them of `total_budget` beside the prototypes."""
        with self.clock.time("prototypes"):
            outcome = self.prototypes.write_batch(extracted)
        with self.clock.time("replay"):
            self.replay.limit(hybrid.demonstration_room(total_budget, self.prototypes.nbytes()))
            add_examples(self.replay, pairs, extracted, hybrid.demonstrate_above_nll)
        self.learned.append(S.sample_ids_to_numpy(pairs))
        return {**outcome, "stored": len(self.replay)}

    def demonstrations(self, query_keys: np.ndarray) -> list[list[tuple[str, str]]]:
        """The stored examples nearest to each query key (text replay in the prompt)."""
        with self.clock.time("replay"):
            return self.replay.nearest(torch.from_numpy(np.array(query_keys)))

    def learned_ids(self) -> np.ndarray:
        return np.concatenate(self.learned) if self.learned else np.zeros(0, np.int64)

    def _stores(self) -> dict[str, object]:
        stores = {"slots": self.slots, "statistics": self.statistics, "bank": self.bank,
                  "prototypes": self.prototypes, "replay": self.replay}
        return {name: store for name, store in stores.items() if store is not None}

    def memory_report(self) -> dict[str, int]:
        names = {"statistics": "analytic_statistics", "replay": "replay_text"}
        report = {names.get(name, name): store.nbytes() for name, store in self._stores().items()}
        if self.slots is not None:
            report["num_slots"] = self.slots.num_slots
        return report

    def state(self) -> dict[str, np.ndarray]:
        out = {k: v for name, store in self._stores().items() for k, v in prefixed(name, store.state()).items()}
        out["learned"] = self.learned_ids()
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        statistics = state_part(state, "statistics")
        self.statistics = RidgeStatistics.from_state(statistics) if statistics else None
        for name, store in self._stores().items():
            if name != "statistics":
                store.restore(state_part(state, name))
        if self.slots is not None:
            self.slots.to(self.device)
        self.learned = [np.asarray(state["learned"])]

    def timings(self) -> dict:
        return self.clock.report()
