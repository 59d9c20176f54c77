"""MemoryManager actor: owns all persistent memory (MARS slots with their anchors here; MIITA prototypes and
the NSR LoRA bank sit beside them in the same byte report) and routes features through the slots."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import ray
import torch

from actors.clock import StageClock
from memcl_ops.analytic.ridge import RidgeStatistics
from memcl_ops.arrow import schema as S
from memcl_ops.baselines.text_replay import ReplayConfig, TextReplayBuffer, add_examples
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.mars.sgse import Expansion
from memcl_ops.miita.directions import DirectionMemory, MemoryConfig, write_directions
from memcl_ops.nsr.adapter import ArrivalPlan, Snapshot, plan_arrival
from memcl_ops.nsr.task_bank import BankConfig, BankEntry, TaskKnowledgeBank


@ray.remote
class MemoryManager:
    def __init__(self, feature_dim: int, router: RouterConfig, max_slots: int, seed: int, threads: int,
                 bank: BankConfig | None = None):
        self.reset(feature_dim, router, max_slots, seed, threads, bank)

    def reset(self, feature_dim: int, router: RouterConfig, max_slots: int, seed: int, threads: int,
              bank: BankConfig | None = None) -> None:
        torch.set_num_threads(threads)
        self.router = SlotRouter(feature_dim, router, seed=seed)
        self.bank = TaskKnowledgeBank(bank or BankConfig())  # NSR's LoRA bank (empty for other methods)
        self.statistics: RidgeStatistics | None = None  # an analytic head's sums, merged from the encoder replicas
        self.prototypes: DirectionMemory | None = None  # MIITA's direction memory (LM runs)
        self.replay: TextReplayBuffer | None = None  # the text-replay baseline's stored examples (LM runs)
        self.max_slots = max_slots
        self.routed = 0  # samples routed so far (the x axis of the slot history)
        self.slot_history: list[tuple[int, int]] = [(0, self.router.num_slots)]
        self.expansions: list[dict] = []
        self.refused_expansions = 0
        self.clock = StageClock()

    def route(self, batch: pa.RecordBatch | None, expansions: list[Expansion] | None = None) -> pa.RecordBatch | None:
        """Confidence and query per sample (for SGSE); also folds the batch into the anchor statistics.
        `expansions` (the monitor's verdict on the previous batch) are applied first, which saves the stream a
        separate call per batch. None (every row refused at the gate) passes through."""
        if expansions:
            self.expand(expansions)
        if batch is None:
            return None
        with self.clock.time("route"), torch.no_grad():
            h = S.features_to_torch(batch)
            q, probs = self.router.route(h)
            self.router.update_anchor_stats(h, probs)
            self.routed += batch.num_rows
            return pa.RecordBatch.from_arrays(
                [batch.column(S.SAMPLE_ID), pa.array(probs.max(dim=1).values.numpy()), S.matrix_to_arrow(q.numpy())],
                names=[S.SAMPLE_ID, "confidence", "query"])

    def expand(self, expansions: list[Expansion]) -> int:
        with self.clock.time("expand"):
            for e in expansions:
                if self.router.num_slots >= self.max_slots:
                    self.refused_expansions += 1
                    continue
                self.router.add_slot(e.key)
                self.expansions.append({"at_sample": self.routed, "test_step": e.step,
                                        "slots": self.router.num_slots,
                                        "successes": e.successes, "trials": e.trials,
                                        "lower_bound": float(e.lower_bound)})
                self.slot_history.append((self.routed, self.router.num_slots))
            return self.router.num_slots

    def memory_state(self) -> dict[str, np.ndarray]:
        return self.router.state()

    def load_memory(self, state: dict[str, np.ndarray]) -> None:
        """Take trained memory parameters (stage 1); the slot count must not have changed meanwhile."""
        if state["keys"].shape[0] != self.router.num_slots:
            raise ValueError(f"trained memory has {state['keys'].shape[0]} slots, the manager {self.router.num_slots}")
        self.router.load_state(state)

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

    def use_prototypes(self, hidden: int, key_dim: int, config: MemoryConfig) -> None:
        self.prototypes = DirectionMemory(hidden, key_dim, config)

    def write_prototypes(self, extracted: pa.RecordBatch) -> dict[str, int]:
        """MIITA WRITE (with repair) of every (key, direction) row, in stream order."""
        with self.clock.time("prototypes"):
            return write_directions(self.prototypes, extracted)

    def prototype_state(self) -> dict[str, np.ndarray]:
        return self.prototypes.state()

    def use_replay(self, key_dim: int, config: ReplayConfig) -> None:
        self.replay = TextReplayBuffer(key_dim, config)

    def write_replay(self, pairs: pa.RecordBatch, extracted: pa.RecordBatch) -> int:
        with self.clock.time("replay"):
            add_examples(self.replay, pairs, extracted)
            return len(self.replay)

    def demonstrations(self, query_keys: np.ndarray) -> list[list[tuple[str, str]]]:
        """The stored examples nearest to each query key (text replay in the prompt)."""
        with self.clock.time("replay"):
            return self.replay.nearest(torch.from_numpy(np.array(query_keys)))

    def merge_statistics(self, *partials: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add the encoder replicas' partial analytic statistics (exact integer sums: the order does not matter)
        to the total; returns the total's state, from which the head learner solves."""
        with self.clock.time("statistics"):
            for part in partials:
                if self.statistics is None:
                    self.statistics = RidgeStatistics.from_state(part)
                else:
                    self.statistics.merge(RidgeStatistics.from_state(part))
            return self.statistics.state()

    def memory_report(self) -> dict[str, int]:
        # A router without slots (NSR runs keep the bank only) holds no memory worth reporting.
        slots = self.router.nbytes() if self.router.num_slots else 0
        return {"slots": slots, "num_slots": self.router.num_slots,
                "prototypes": self.prototypes.nbytes() if self.prototypes is not None else 0,
                "replay_text": self.replay.nbytes() if self.replay is not None else 0, "bank": self.bank.nbytes(),
                "analytic_statistics": self.statistics.nbytes() if self.statistics is not None else 0}

    def history(self) -> dict:
        return {"slot_history": [list(p) for p in self.slot_history], "expansions": self.expansions,
                "refused_expansions": self.refused_expansions}

    def state(self) -> dict[str, np.ndarray]:
        out = {f"router.{k}": v for k, v in self.router.state().items()}
        out["slot_history"] = np.array(self.slot_history, dtype=np.int64).reshape(-1, 2)
        out["expansions"] = np.array(json.dumps(self.expansions))
        out["counters"] = np.array([self.routed, self.refused_expansions], dtype=np.int64)
        out.update({f"bank.{k}": v for k, v in self.bank.state().items()})
        for name, memory in (("prototypes", self.prototypes), ("replay", self.replay), ("statistics", self.statistics)):
            if memory is not None:
                out.update({f"{name}.{k}": v for k, v in memory.state().items()})
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.router.load_state({k[7:]: v for k, v in state.items() if k.startswith("router.")})
        self.slot_history = [tuple(int(x) for x in row) for row in state["slot_history"]]
        self.expansions = json.loads(str(state["expansions"]))
        self.routed, self.refused_expansions = (int(x) for x in state["counters"])
        bank = {k[5:]: v for k, v in state.items() if k.startswith("bank.")}
        if bank:  # checkpoints written before the bank existed have none
            self.bank.restore(bank)
        for name, memory in (("prototypes", self.prototypes), ("replay", self.replay)):
            part = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(f"{name}.")}
            if memory is not None and part:  # configured (use_*) before restoring, like the router
                memory.restore(part)
        statistics = {k[11:]: v for k, v in state.items() if k.startswith("statistics.")}
        self.statistics = RidgeStatistics.from_state(statistics) if statistics else None

    def timings(self) -> dict:
        return self.clock.report()
