"""NSR's TaskKnowledgeBank: compressed LoRA deltas of past tasks, recalled by task-embedding similarity
(docs/methods.md, "NSR").

An entry holds the task's key e_τ = Norm(mean f_base(x)) over its first samples (frozen backbone, LoRA off, so
keys never drift), its compressed per-site deltas, its head and usage statistics. At most `capacity` entries
are kept (top-K retention); the one evicted is the least recently used (or the least used).

Retrieval at task arrival, with s_i = cos(e_new, e_i):

    max s ≥ τ_same (and ≥ the second s + margin)   restore the best entry exactly (a returning task: 0 recovery steps)
    some s ≥ τ_rel            warm-start from ΔW0 = Σ_{top-k, s ≥ τ_rel} w_i ΔW_i, w = softmax(s / T_mix)
    else                      fresh adapter

That is the similarity rule (`retrieve`); the other rules on the same bank (round-robin, the learned policy:
memcl_ops/nsr/store.py) decide elsewhere and record their decision through `take`. A retrieval counts as a use of
the entries it returns (last_used, use_count). `route` finds the entry nearest a key without counting a use
(task-agnostic inference). The state is a flat dict of numpy arrays, so the bank checkpoints like any other actor
state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from memcl_ops.models.lowrank import CompressedDelta, CompressionConfig, mix_and_refactor


@dataclass(frozen=True)
class BankConfig:
    capacity: int = 16  # K_ret: entries kept at most [R]
    eviction: Literal["lru", "least_used"] = "lru"  # which entry goes when full [R]
    tau_same: float = 0.95  # restore threshold on cos(e_new, e_i) [R]
    tau_related: float = 0.5  # warm-start threshold [R]
    restore_margin: float = 0.0  # a restore also needs the best s this far above the second best [R]
    top_k: int = 3  # entries mixed for a warm start [R]
    mix_temperature: float = 0.1  # w = softmax(s / T_mix) [R]
    compression: CompressionConfig = CompressionConfig()

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.top_k < 1:
            raise ValueError(f"bank capacity and top_k must be >= 1, got {self.capacity} and {self.top_k}")
        if not -1.0 <= self.tau_related <= self.tau_same <= 1.0:
            raise ValueError(f"need -1 <= tau_related <= tau_same <= 1, got {self.tau_related}, {self.tau_same}")
        if self.mix_temperature <= 0:
            raise ValueError(f"mix_temperature must be > 0, got {self.mix_temperature}")
        if self.restore_margin < 0:
            raise ValueError(f"restore_margin must be >= 0, got {self.restore_margin}")


@dataclass
class BankEntry:
    task: int
    key: np.ndarray  # (D,) float32, unit norm
    deltas: dict[str, CompressedDelta]  # per LoRA site
    head: dict[str, np.ndarray]  # the task's head state (float32)
    accuracy: float = float("nan")  # accuracy with the stored (compressed) adapter when stored
    created_at: int = 0  # bank clock (arrivals) when first stored
    last_used: int = 0
    use_count: int = 0

    @property
    def nbytes(self) -> int:
        """Stored tensor bytes: key, factors at their storage dtype, head (usage counters not counted)."""
        return (self.key.nbytes + sum(d.nbytes for d in self.deltas.values())
                + sum(np.asarray(v).nbytes for v in self.head.values()))

    def delta_factors(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """float32 (B, A) per site, exactly as stored (fp16 rounding included)."""
        return {site: d.factors() for site, d in self.deltas.items()}


@dataclass
class Retrieval:
    kind: Literal["restore", "warm", "fresh"]
    tasks: list[int]  # entries used (the restored one, or the mixed ones, best first)
    weights: list[float]
    similarities: dict[int, float] = field(default_factory=dict)  # to every entry
    rule: str = "similarity"  # the rule that decided: similarity, round-robin, learned
    probabilities: list[float] = field(default_factory=list)  # the learned policy's, over its actions


def normalize(v: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / (np.linalg.norm(v) + eps)


class TaskKnowledgeBank:
    def __init__(self, config: BankConfig = BankConfig()):
        self.config = config
        self.entries: dict[int, BankEntry] = {}
        self.clock = 0  # arrivals seen
        self.evicted: list[int] = []

    def __len__(self) -> int:
        return len(self.entries)

    def similarities(self, key: np.ndarray) -> dict[int, float]:
        k = normalize(key)
        return {t: float(k @ e.key) for t, e in self.entries.items()}

    def ranked(self, key: np.ndarray) -> tuple[dict[int, float], list[int]]:
        """Cosine of `key` to every entry, and the entries' tasks most similar first."""
        if not np.isfinite(key).all():
            raise ValueError("task key has non-finite values")
        sims = self.similarities(key)
        return sims, sorted(sims, key=lambda t: -sims[t])

    def retrieve(self, key: np.ndarray) -> Retrieval:
        """The similarity rule's arrival decision for a task with key `key` (ticks the clock, counts the use)."""
        sims, ranked = self.ranked(key)
        cfg = self.config
        second = sims[ranked[1]] if len(ranked) > 1 else -1.0
        if ranked and sims[ranked[0]] >= cfg.tau_same and sims[ranked[0]] - second >= cfg.restore_margin:
            return self.take("restore", ranked[:1], sims)
        return self.take("warm", [t for t in ranked[:cfg.top_k] if sims[t] >= cfg.tau_related], sims)

    def take(self, kind: str, tasks: list[int], sims: dict[int, float], rule: str = "similarity",
             probabilities: list[float] | None = None) -> Retrieval:
        """Record an arrival decision: `kind` from the entries of `tasks` (best first; a warm start without one is
        fresh), weighted softmax(s / T_mix) for a warm mix. Ticks the clock and counts a use of each."""
        self.clock += 1
        if kind == "fresh" or not tasks:
            return Retrieval("fresh", [], [], sims, rule, probabilities or [])
        if kind == "restore":
            tasks, weights = tasks[:1], [1.0]
        else:
            s = np.array([sims[t] for t in tasks]) / self.config.mix_temperature
            w = np.exp(s - s.max())
            weights = (w / w.sum()).tolist()
        for t in tasks:
            self.entries[t].last_used = self.clock
            self.entries[t].use_count += 1
        return Retrieval(kind, tasks, weights, sims, rule, probabilities or [])

    def route(self, key: np.ndarray) -> BankEntry | None:
        """The entry nearest `key` (None: an empty bank); no use is counted."""
        _, ranked = self.ranked(key)
        return self.entries[ranked[0]] if ranked else None

    def warm_start(self, retrieval: Retrieval, rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Rank-`rank` factors of the similarity-weighted mix of the retrieved deltas."""
        return mix_and_refactor([(w, self.entries[t].deltas) for t, w in zip(retrieval.tasks, retrieval.weights)],
                                rank)

    def store(self, entry: BankEntry) -> list[int]:
        """Add (or overwrite) the entry of `entry.task`; returns the tasks evicted to stay within capacity."""
        old = self.entries.get(entry.task)
        entry.created_at = old.created_at if old else self.clock
        entry.use_count = max(entry.use_count, old.use_count if old else 0)
        entry.last_used = self.clock
        self.entries[entry.task] = entry
        evicted = []
        while len(self.entries) > self.config.capacity:
            victim = min((t for t in self.entries if t != entry.task), key=self._eviction_order)
            del self.entries[victim]
            evicted.append(victim)
        self.evicted.extend(evicted)
        return evicted

    def _eviction_order(self, task: int) -> tuple:
        e = self.entries[task]
        if self.config.eviction == "lru":
            return (e.last_used, e.use_count, e.created_at)
        return (e.use_count, e.last_used, e.created_at)

    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def summary(self) -> list[dict]:
        return [{"task": t, "ranks": {s: d.rank for s, d in e.deltas.items()}, "bytes": e.nbytes,
                 "accuracy": e.accuracy, "created_at": e.created_at, "last_used": e.last_used,
                 "use_count": e.use_count} for t, e in sorted(self.entries.items())]

    def state(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {
            "clock": np.array(self.clock), "evicted": np.array(self.evicted, dtype=np.int64),
            "tasks": np.array(sorted(self.entries), dtype=np.int64)}
        for t, e in self.entries.items():
            p = f"entry{t}."
            out[p + "key"] = e.key
            out[p + "meta"] = np.array(json.dumps({"accuracy": e.accuracy, "created_at": e.created_at,
                                                   "last_used": e.last_used, "use_count": e.use_count,
                                                   "sites": sorted(e.deltas)}))
            for s, d in e.deltas.items():
                out[f"{p}delta.{s}.B"], out[f"{p}delta.{s}.A"] = d.B, d.A
                out[f"{p}delta.{s}.energy"] = np.array(d.energy_kept)
            out.update({f"{p}head.{k}": np.asarray(v) for k, v in e.head.items()})
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.clock = int(state["clock"])
        self.evicted = [int(t) for t in state["evicted"]]
        self.entries = {}
        for t in (int(x) for x in state["tasks"]):
            p = f"entry{t}."
            meta = json.loads(str(state[p + "meta"]))
            deltas = {s: CompressedDelta(np.asarray(state[f"{p}delta.{s}.B"]), np.asarray(state[f"{p}delta.{s}.A"]),
                                         float(state[f"{p}delta.{s}.energy"])) for s in meta["sites"]}
            head = {k[len(p + "head."):]: np.asarray(v) for k, v in state.items() if k.startswith(p + "head.")}
            self.entries[t] = BankEntry(t, np.asarray(state[p + "key"]), deltas, head, meta["accuracy"],
                                        meta["created_at"], meta["last_used"], meta["use_count"])
