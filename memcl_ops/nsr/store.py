"""NSR's stores of the memory manager (memcl_ops/roles/memory_manager.py): the compressed LoRA bank, which makes the
arrival plans by the run's allocation rule and stores each visit's compressed adapter, and the head store of the
memoryless rules that keep every task's head (`nsr.task_heads`).

The bank's rules (docs/methods.md, "NSR"), all on the same bank, entries stored under their task:

* similarity (`bank`): restore / warm mix / fresh by the key's cosine to the entries (task_bank.py);
* round-robin: key-blind, each arrival restores the next entry in the order they were first stored (the classic
  memoryless scheduler over the bank's slots; fresh while the bank is empty);
* learned: the allocation policy of policy.py picks among restore top-1..m / warm mix / fresh, from the top-m
  similarities, ages and probe losses.
"""

from __future__ import annotations

import numpy as np

from memcl_ops.nsr.adapter import ArrivalPlan, NSRConfig, Snapshot, TaskHead, plan_for
from memcl_ops.nsr.policy import AllocationPolicy, allowed, arrival_features
from memcl_ops.nsr.task_bank import BankEntry, TaskKnowledgeBank
from memcl_ops.tensors import array_bytes, prefixed, state_part


class BankStore(TaskKnowledgeBank):
    def __init__(self, config: NSRConfig):
        super().__init__(config.bank)
        self.rule = config.allocation
        self.policy = AllocationPolicy(config.policy)
        self.turn = 0  # round-robin: arrivals that restored an entry in turn
        self.decision: tuple[np.ndarray, np.ndarray, list[ArrivalPlan]] | None = None  # the last learned arrival

    def candidates(self, key: np.ndarray) -> list[BankEntry]:
        """The entries the learned policy may restore: the top-m by similarity to `key` (none for the other
        rules, which read no probe loss)."""
        if self.rule != "learned":
            return []
        _, ranked = self.ranked(key)
        return [self.entries[t] for t in ranked[:self.policy.config.top_m]]

    def arrive(self, key: np.ndarray, rank: int, task: int | None = None,
               probe_losses: list[float] | None = None) -> ArrivalPlan:
        """NSR task arrival by the run's rule (`probe_losses`: of the `candidates`, for the learned policy)."""
        if self.rule == "round-robin":
            return plan_for(self, self._in_turn(key), rank, task)
        if self.rule == "learned":
            return self._learned(key, rank, task, probe_losses or [])
        return plan_for(self, self.retrieve(key), rank, task)

    def _in_turn(self, key: np.ndarray):
        sims, _ = self.ranked(key)
        if not self.entries:
            return self.take("fresh", [], sims, "round-robin")
        order = sorted(self.entries, key=lambda t: (self.entries[t].created_at, t))
        self.turn += 1
        return self.take("restore", [order[(self.turn - 1) % len(order)]], sims, "round-robin")

    def _learned(self, key: np.ndarray, rank: int, task: int | None, losses: list[float]):
        sims, ranked = self.ranked(key)
        m = self.policy.config.top_m
        top = ranked[:m]
        if len(losses) != len(top):
            raise ValueError(f"the learned policy needs the probe loss of each of its {len(top)} candidates, got "
                             f"{len(losses)}")
        ages = [min(1.0, (self.clock - self.entries[t].last_used) / len(self.entries)) for t in top]
        phi = arrival_features([sims[t] for t in top], ages, losses, m)
        mask = allowed(len(top), m)
        p = self.policy.probabilities(phi, mask)
        action = self.policy.choose(phi, mask, self.clock)
        plans = []
        if self.policy.config.learn:  # every allowed action's start, for its reward (a copy of the bank: no use)
            plans = [self._plan(a, top, sims, rank, task) if mask[a] else ArrivalPlan("fresh") for a in range(len(p))]
        self.decision = (phi, mask, plans)
        kind, tasks = self._action(action, top)
        return plan_for(self, self.take(kind, tasks, sims, "learned", p.tolist()), rank, task)

    def _action(self, action: int, top: list[int]) -> tuple[str, list[int]]:
        m = self.policy.config.top_m
        if action < m:
            return "restore", [top[action]]
        return ("warm", top[:self.config.top_k]) if action == m else ("fresh", [])

    def _plan(self, action: int, top: list[int], sims: dict[int, float], rank: int, task: int | None) -> ArrivalPlan:
        """The plan of `action` without recording it (for its reward)."""
        kind, tasks = self._action(action, top)
        clock, uses = self.clock, {t: (e.last_used, e.use_count) for t, e in self.entries.items()}
        plan = plan_for(self, self.take(kind, tasks, sims, "learned"), rank, task)
        self.clock = clock
        for t, (last, count) in uses.items():
            self.entries[t].last_used, self.entries[t].use_count = last, count
        return plan

    def action_plans(self) -> list[ArrivalPlan]:
        """The start every action of the last learned arrival would give (a disallowed one: fresh, never played)."""
        if self.decision is None:
            raise RuntimeError("action_plans follows an arrival of the learned policy with policy.learn on")
        return self.decision[2]

    def reward(self, rewards: list[float]) -> None:
        """The rewards of the last learned arrival's actions: the policy learns from them."""
        phi, mask, _ = self.decision
        self.policy.learn(phi, mask, np.asarray(rewards, dtype=np.float64))
        self.decision = None

    def store_task(self, task: int, key: np.ndarray, snapshot: Snapshot, accuracy: float) -> list[int]:
        """Store (or overwrite) a task's compressed adapter; returns the tasks evicted by the top-K cap."""
        return self.store(snapshot.entry(task, key, accuracy))

    def entry(self, task: int) -> BankEntry | None:
        return self.entries.get(task)

    def bank_summary(self) -> dict:
        out = {"entries": self.summary(), "evicted": self.evicted, "arrivals": self.clock, "rule": self.rule}
        if self.rule == "learned":
            out["policy"] = self.policy.summary()
        return out

    def state(self) -> dict[str, np.ndarray]:
        policy = prefixed("policy", self.policy.state()) if self.rule == "learned" else {}
        return {**super().state(), "turn": np.array(self.turn), **policy}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        super().restore({k: v for k, v in state.items() if not k.startswith("policy.")})
        self.turn = int(state["turn"])
        if self.rule == "learned":
            self.policy.restore(state_part(state, "policy"))
        self.decision = None

    def report(self) -> dict[str, int]:
        """The entries' bytes; the learned rule's policy (its weights and the arrivals it learned from) beside."""
        policy = {"policy": array_bytes(self.policy.state())} if self.rule == "learned" else {}
        return {"bank": self.nbytes(), **policy}


class HeadStore:
    """Every task's head, kept by a memoryless rule with `nsr.task_heads` (no adapter, no key)."""

    def __init__(self) -> None:
        self.heads: dict[int, dict[str, np.ndarray]] = {}

    def store_head(self, task: int, head: dict[str, np.ndarray]) -> None:
        self.heads[task] = {k: np.array(v, dtype=np.float32) for k, v in head.items()}

    def entry(self, task: int) -> TaskHead | None:
        return TaskHead(self.heads[task]) if task in self.heads else None

    def head(self, task: int) -> dict[str, np.ndarray] | None:
        return self.heads.get(task)

    def state(self) -> dict[str, np.ndarray]:
        return {"tasks": np.array(sorted(self.heads), dtype=np.int64),
                **{f"head{t}.{k}": v for t, h in self.heads.items() for k, v in h.items()}}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.heads = {int(t): {k: np.asarray(state[f"head{int(t)}.{k}"]) for k in ("weight", "bias")}
                      for t in state["tasks"]}

    def report(self) -> dict[str, int]:
        return {"heads": sum(v.nbytes for h in self.heads.values() for v in h.values())}
