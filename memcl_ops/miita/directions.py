"""MIITA direction memory and its inference-time use (docs/methods.md, "MIITA"; [R] throughout).

Memory `B = {(d_j, A_j, n_j)}`: unit correction directions in the pre-LM-head space, each with a set of
semantic anchor keys (retrieval only) and the number of experiences merged into it.

* write (1.2 b): merge by *direction* (cos ≥ τ_d) into a count-weighted spherical mean, and add the key as a
  new anchor unless an anchor of that prototype is already within τ_a (then absorb it); else a new prototype.
* bytes (1.2 c): directions and anchors are stored at the storage dtype (fp16 by default) and counted as
  ``Σ_j [H·b_d + |A_j|·H_k·b_k + b_n]`` from the stored tensors themselves.
* repair (1.2 d): while over budget, apply the cheapest merge: anchor pair within a prototype (cost 1 − cos)
  or prototype pair (cost λ_p·(1 − cos), anchors unioned then de-duplicated at τ_a). Merges never go below
  one prototype with one anchor, and the budget is checked to hold that much, so the budget holds after
  every write. (The spec's last-resort "drop the oldest anchor" is unreachable: an anchor merge is always
  available while a prototype has two anchors.)
* read (1.2 e-g): `Adaptation.for_queries(keys)` ranks prototypes by anchor relevance r_j once per query;
  each decoding step then scores the candidates by r_j + λ_u·cos(u_t, d_j), with the label-free uncertainty
  direction u_t = Norm(Wᵀ[p ⊙ (log p + H)]) = Norm(−∂H/∂h), aggregates Δ_t = Σ softmax(s/τ_w) d_j (not
  renormalised: its norm damps disagreeing neighbours) and returns h̃ = h + η·g·‖h‖·Δ_t with the gate
  g = σ(κ_H(H/log V − θ_H))·σ(κ_r(max r − θ_r)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from memcl_ops.arrow import schema as S
from memcl_ops.tensors import normalize

if TYPE_CHECKING:
    from memcl_ops.models.causal_lm import CausalLM

STORAGE_DTYPES = {"float16": torch.float16, "float32": torch.float32}
COUNT_BYTES = 4  # b_n: n_j is an int32


@dataclass(frozen=True)
class MemoryConfig:
    """Write, budget and repair of the direction memory; all [R] (docs/methods.md, "MIITA")."""

    budget_bytes: int = 256 * 1024  # C_mem; the MIITA paper reports robustness across budgets, values unknown
    eps: float = 1e-8  # ε of Norm(·)
    # answer positions kept per prototype, the end-of-answer token included (memcl_ops/miita/answers.py); 0: the
    # paper's memory, one correction averaged over the answer (this module; `miita-paper`)
    positions: int = 8
    # position-aware: cosines on keys minus their running mean. Off: anchors centred at write time drift from
    # queries centred at read time once later tasks move the mean (1-NN on a dev split 54 % against 62-71 % on raw
    # keys, benchmarks/RESULTS.md); merging by answer tokens, not by key, already avoids what centring was for
    centre_keys: bool = False
    # position-aware: each prototype records, write by write (test-then-write), whether its answer token at each
    # position was the token of a new experience it was the nearest prototype of, and whether the frozen model's own
    # token was; the read side steers a position only where the memory's record beats the model's
    # (AdaptConfig.vote_gate). Costs 2 + 4·(answer positions) bytes per prototype and 4 + 8·positions pooled
    record_votes: bool = True
    reliability_prior: float = 2.0  # pseudo-votes of the pooled record added to each prototype's own when read
    # which experiences become prototypes: "all"; "ahead": a new answer only where the nearest prototype's record
    # shows the memory beating the model at the answer's first position (or the memory is empty), so a
    # budget shared with demonstrations is not spent on answers the memory cannot give (`miita-replay`)
    admit: Literal["all", "ahead"] = "all"
    anchor_code: Literal["sign", "int8", "float16"] = "sign"  # position-aware: H/8, H or 2H bytes per anchor
    min_correction_norm: float = 0.0  # ρ_min: skip writes whose ‖R_m‖ is below it (0: off)
    direction_merge: float = 0.8  # τ_d: merge into the nearest prototype when cos(d_m, d_j) ≥ τ_d
    # τ_a: add the key as an anchor when no anchor of the prototype is this close (the MIITA paper's 0.9 is on raw keys,
    # where any two prompts are that close; on centred keys 0.99 keeps one anchor per distinct prompt)
    new_anchor: float = 0.99
    storage_dtype: Literal["float16", "float32"] = "float16"  # the MIITA paper's memory: b_d = b_k = 2 bytes at fp16
    prototype_merge_cost: float = 2.0  # λ_p: prototype merges cost λ_p·(1 − cos), so anchor merges go first

    def __post_init__(self) -> None:
        if self.storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype {self.storage_dtype!r} is not one of {sorted(STORAGE_DTYPES)}")
        if self.anchor_code not in ("sign", "int8", "float16"):
            raise ValueError(f"anchor_code {self.anchor_code!r} is not one of sign, int8, float16")
        if not 0 <= self.positions <= 255:
            raise ValueError(f"positions must be in 0..255 (0: MIITA's averaged memory), got {self.positions}")
        if self.budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive, got {self.budget_bytes}")
        if self.admit not in ("all", "ahead") or self.reliability_prior < 0:
            raise ValueError(f"admit must be all or ahead ({self.admit!r}) and reliability_prior >= 0 "
                             f"({self.reliability_prior})")
        for name in ("direction_merge", "new_anchor"):
            if not -1.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} is a cosine threshold in [-1, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class AdaptConfig:
    """Retrieval, aggregation, gate and step size at inference; [R] (docs/methods.md, "MIITA")."""

    # "flip": the smallest step that makes the memory's token the argmax (position-aware memory only); "relative":
    # the MIITA paper's h + η·g·‖h‖·Δ
    rule: Literal["flip", "relative", "copy"] = "flip"  # "copy": answer with the stored tokens (nearest-answer)
    flip_margin: float = 0.1  # flip: the step is (1 + margin) times the smallest flipping one
    max_step: float = 1.0  # flip: no step longer than this times ‖h‖ (beyond it the model keeps its own token)
    flip_iterations: int = 8  # flip: re-linearised steps before giving up (the model then keeps its token)
    min_relevance: float = -1.0  # position-aware: prototypes below this centred-key cosine do not vote (-1: all vote)
    # position-aware with recorded votes: steer a position only where the voters' estimated chance that their token
    # is the query's exceeds the estimated chance that the model's own token is, by more than `min_advantage` (both
    # from the voters' records shrunk toward the pooled ones); off: steer wherever the memory has a token
    vote_gate: bool = True
    min_advantage: float = 0.0
    candidates: int = 8  # K_s: prototypes kept per query by anchor relevance (the MIITA paper's memory)
    top_k: int = 1  # K: prototypes aggregated per decoding step (the MIITA paper's K = 3 averages other answers in)
    uncertainty_weight: float = 0.5  # λ_u in s_j = r_j + λ_u·cos(u_t, d_j) (the MIITA paper's memory)
    temperature: float = 0.05  # τ_w of the aggregation softmax
    entropy_slope: float = 10.0  # κ_H
    entropy_threshold: float = 0.15  # θ_H, on the entropy normalised by log V
    relevance_slope: float = 20.0  # κ_r
    relevance_threshold: float = 0.5  # θ_r
    step: float = 0.1  # η, relative to ‖h‖; sweep {0.02, 0.05, 0.1, 0.2, 0.5}

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.top_k < 1:
            raise ValueError(f"candidates ({self.candidates}) and top_k ({self.top_k}) must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not -1.0 <= self.min_advantage < 1.0:
            raise ValueError(f"min_advantage must be in [-1, 1), got {self.min_advantage}")
        if self.rule not in ("flip", "relative", "copy"):
            raise ValueError(f"rule {self.rule!r} is not one of flip, relative, copy")


# The paper's memory and read rule (`miita-paper`): one averaged correction, raw fp16 keys merged at τ_a = 0.9,
# K = 3 by relevance plus uncertainty, the gated relative step.
PAPER_MEMORY = {"positions": 0, "centre_keys": False, "anchor_code": "float16", "new_anchor": 0.9}
PAPER_ADAPT = {"rule": "relative", "top_k": 3, "uncertainty_weight": 0.5}


@dataclass(frozen=True)
class WriteResult:
    action: Literal["new", "merged", "skipped"]
    prototype: int  # index written to (-1 when skipped)
    anchor_added: bool
    repairs: int  # repair operations the write triggered


def prototype_bytes(hidden: int, key_dim: int, anchors: int, storage_dtype: str = "float16") -> int:
    """H·b_d + |A|·H_k·b_k + b_n: the bytes one prototype with `anchors` anchors takes."""
    b = STORAGE_DTYPES[storage_dtype].itemsize
    return hidden * b + anchors * key_dim * b + COUNT_BYTES


class DirectionMemory:
    """The byte-budgeted prototype memory B. Directions and anchors live at the storage dtype; every
    computation on them runs in float32 on cached unit-norm copies (kept in step with the stored tensors)."""

    def __init__(self, hidden: int, key_dim: int, config: MemoryConfig = MemoryConfig()):
        self.hidden, self.key_dim, self.config = hidden, key_dim, config
        self.dtype = STORAGE_DTYPES[config.storage_dtype]
        smallest = prototype_bytes(hidden, key_dim, 1, config.storage_dtype)
        if config.budget_bytes < smallest:
            raise ValueError(f"budget_bytes {config.budget_bytes} cannot hold one prototype with one anchor "
                             f"({smallest} bytes at hidden {hidden}, key dim {key_dim}, {config.storage_dtype})")
        self.directions: list[torch.Tensor] = []  # (H,) each, at the storage dtype
        self.anchors: list[torch.Tensor] = []  # (|A_j|, H_k) each, oldest first
        self.counts: list[int] = []
        self._units = torch.zeros(0, hidden)  # float32 unit directions (J, H)
        self._anchor_units: list[torch.Tensor] = []
        self._anchor_pair: list[tuple[float, int, int] | None] = []  # closest anchor pair per prototype
        self.writes = 0
        self.repairs = 0

    def __len__(self) -> int:
        return len(self.directions)

    @property
    def num_anchors(self) -> int:
        return sum(len(a) for a in self.anchors)

    def nbytes(self) -> int:
        """Bytes of the stored tensors at their storage dtype (directions, anchors, int32 counts)."""
        tensors = sum(t.numel() * t.element_size() for t in (*self.directions, *self.anchors))
        return int(tensors + COUNT_BYTES * len(self.counts))

    # ---------------------------------------------------------------- storage (stored tensors + caches)
    def _store(self, v: torch.Tensor) -> torch.Tensor:
        return normalize(v.float(), self.config.eps).to(self.dtype)

    def _unit(self, stored: torch.Tensor) -> torch.Tensor:
        return normalize(stored.float(), self.config.eps)

    def _set_direction(self, j: int, v: torch.Tensor) -> None:
        self.directions[j] = self._store(v)
        self._units[j] = self._unit(self.directions[j])

    def _set_anchors(self, j: int, stored: torch.Tensor) -> None:
        self.anchors[j] = stored
        self._anchor_units[j] = self._unit(stored)
        self._anchor_pair[j] = _closest_pair(self._anchor_units[j]) if len(stored) > 1 else None

    def _append(self, d: torch.Tensor, k: torch.Tensor) -> None:
        self.directions.append(self._store(d))
        self._units = torch.cat([self._units, self._unit(self.directions[-1]).unsqueeze(0)])
        self.anchors.append(torch.zeros(0))
        self._anchor_units.append(torch.zeros(0))
        self._anchor_pair.append(None)
        self._set_anchors(len(self.anchors) - 1, self._store(k).unsqueeze(0))
        self.counts.append(1)

    def _delete(self, j: int) -> None:
        for parts in (self.directions, self.anchors, self.counts, self._anchor_units, self._anchor_pair):
            del parts[j]
        self._units = torch.cat([self._units[:j], self._units[j + 1:]])

    # ---------------------------------------------------------------- write
    def write(self, key: torch.Tensor, correction: torch.Tensor) -> WriteResult:
        """WRITE(B, k_m, d_m) with d_m = Norm(R_m), then REPAIR while over budget."""
        key, correction = self._checked(key, self.key_dim, "key"), self._checked(correction, self.hidden, "correction")
        self.writes += 1
        if float(correction.norm()) < self.config.min_correction_norm:
            return WriteResult("skipped", -1, False, 0)
        d, k = normalize(correction, self.config.eps), normalize(key, self.config.eps)
        sims = self._units @ d
        j = int(sims.argmax()) if len(sims) else -1
        if j < 0 or float(sims[j]) < self.config.direction_merge:
            self._append(d, k)
            action, j, added = "new", len(self.directions) - 1, True
        else:
            n = self.counts[j]
            self._set_direction(j, n * self.directions[j].float() + d)  # count-weighted spherical mean
            self.counts[j] = n + 1
            anchor_sims = self._anchor_units[j] @ k
            a = int(anchor_sims.argmax())
            added = float(anchor_sims[a]) < self.config.new_anchor
            if added:
                self._set_anchors(j, torch.cat([self.anchors[j], self._store(k).unsqueeze(0)]))
            else:  # absorb: a* ← Norm(a* + k_m)
                anchors = self.anchors[j].clone()
                anchors[a] = self._store(anchors[a].float() + k)
                self._set_anchors(j, anchors)
            action = "merged"
        repairs = self._repair()
        return WriteResult(action, j, added, repairs)

    def write_batch(self, extracted: pa.RecordBatch) -> dict[str, int]:
        """WRITE every row of a key/direction batch, in stream order; returns what the writes did."""
        keys = torch.from_numpy(S.column_matrix(extracted, S.KEY).copy())
        corrections = torch.from_numpy(S.column_matrix(extracted, S.DIRECTION).copy())
        outcome = {"new": 0, "merged": 0, "skipped": 0, "repairs": 0}
        for k, r in zip(keys, corrections):
            result = self.write(k, r)
            outcome[result.action] += 1
            outcome["repairs"] += result.repairs
        return outcome

    def _checked(self, v: torch.Tensor, dim: int, name: str) -> torch.Tensor:
        v = torch.as_tensor(v).float().reshape(-1)
        if v.numel() != dim:
            raise ValueError(f"{name} has {v.numel()} values, the memory expects {dim}")
        if not torch.isfinite(v).all():
            raise ValueError(f"{name} contains NaN or Inf")
        return v

    # ---------------------------------------------------------------- repair
    def _repair(self) -> int:
        done = 0
        while self.nbytes() > self.config.budget_bytes:
            anchor_cost, anchor_at = math.inf, None
            for p, pair in enumerate(self._anchor_pair):
                if pair is not None and 1.0 - pair[0] < anchor_cost:
                    anchor_cost, anchor_at = 1.0 - pair[0], (p, pair[1], pair[2])
            proto_cost, proto_at = math.inf, None
            if len(self.directions) > 1:
                cos, i, j = _closest_pair(self._units)
                proto_cost, proto_at = self.config.prototype_merge_cost * (1.0 - cos), (i, j)
            if anchor_at is None and proto_at is None:  # one prototype, one anchor: fits by construction
                raise AssertionError("memory over budget with nothing left to merge")
            if proto_at is None or (anchor_at is not None and anchor_cost <= proto_cost):
                self._merge_anchors(*anchor_at)
            else:
                self._merge_prototypes(*proto_at)
            done += 1
        self.repairs += done
        return done

    def _merge_anchors(self, p: int, a: int, b: int) -> None:
        anchors = self.anchors[p].clone()
        anchors[a] = self._store(anchors[a].float() + anchors[b].float())  # takes the older one's place
        self._set_anchors(p, torch.cat([anchors[:b], anchors[b + 1:]]))

    def _merge_prototypes(self, i: int, j: int) -> None:
        ni, nj = self.counts[i], self.counts[j]
        self._set_direction(i, ni * self.directions[i].float() + nj * self.directions[j].float())
        self.counts[i] = ni + nj
        self._set_anchors(i, torch.cat([self.anchors[i], self.anchors[j]]))
        self._delete(j)
        # re-deduplicate the union with rule 1 (anchor merge), down to τ_a
        while self._anchor_pair[i] is not None and self._anchor_pair[i][0] >= self.config.new_anchor:
            self._merge_anchors(i, *self._anchor_pair[i][1:])

    # ---------------------------------------------------------------- state
    def state(self) -> dict[str, np.ndarray]:
        """Plain numpy arrays: directions (J, H), anchors (ΣA, H_k) with their owner index, counts (J,)."""
        dtype = np.float16 if self.dtype == torch.float16 else np.float32
        empty = np.zeros((0, self.hidden), dtype), np.zeros((0, self.key_dim), dtype)
        return {
            "directions": torch.stack(self.directions).numpy() if self.directions else empty[0],
            "anchors": torch.cat(self.anchors).numpy() if self.anchors else empty[1],
            "anchor_owner": np.concatenate([np.full(len(a), j, np.int32) for j, a in enumerate(self.anchors)])
            if self.anchors else np.zeros(0, np.int32),
            "counts": np.array(self.counts, dtype=np.int32),
            "counters": np.array([self.writes, self.repairs], dtype=np.int64),
        }

    def restore(self, state: dict[str, np.ndarray]) -> None:
        directions = torch.from_numpy(np.array(state["directions"])).to(self.dtype)
        anchors = torch.from_numpy(np.array(state["anchors"])).to(self.dtype)
        owner = np.asarray(state["anchor_owner"])
        self.directions = list(directions)
        self._units = self._unit(directions) if len(directions) else torch.zeros(0, self.hidden)
        self.anchors, self._anchor_units, self._anchor_pair = [], [], []
        for j in range(len(directions)):
            self.anchors.append(torch.zeros(0))
            self._anchor_units.append(torch.zeros(0))
            self._anchor_pair.append(None)
            self._set_anchors(j, anchors[torch.from_numpy(np.flatnonzero(owner == j))])
        self.counts = [int(c) for c in state["counts"]]
        self.writes, self.repairs = (int(x) for x in state["counters"])

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], config: MemoryConfig = MemoryConfig()) -> DirectionMemory:
        memory = cls(int(state["directions"].shape[1]), int(state["anchors"].shape[1]), config)
        memory.restore(state)
        return memory


def _closest_pair(units: torch.Tensor) -> tuple[float, int, int]:
    """(cosine, i, j) of the most similar pair of rows of a unit-norm matrix, i < j."""
    sims = units @ units.T
    sims.fill_diagonal_(-math.inf)
    i, j = divmod(int(sims.argmax()), len(units))
    return float(sims[i, j]), min(i, j), max(i, j)


# -------------------------------------------------------------------- inference
def uncertainty_direction(logits: torch.Tensor, weight: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """u = Norm(Wᵀ[p ⊙ (log p + H)]) = Norm(−∂H/∂h) for logits = W h (+ b); rows of `logits` are steps."""
    log_p = F.log_softmax(logits.float(), dim=-1)
    p = log_p.exp()
    entropy = -(p * log_p).sum(dim=-1, keepdim=True)
    return normalize((p * (log_p + entropy)) @ weight.float(), eps)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = F.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


class Adaptation:
    """Read side of the memory: per batch of queries, the candidates by anchor relevance; per decoding step,
    the gated temporary update of the final hidden state. Plugs into `CausalLM.generate(adapter=...)`."""

    def __init__(self, memory: DirectionMemory, weight: torch.Tensor, config: AdaptConfig = AdaptConfig()):
        # The memory is kept on the CPU (its byte budget, its checkpoints); the read side is copied once to where
        # the LM head lives, so each decoding step touches no host memory.
        self.config, self.weight = config, weight
        self.eps = memory.config.eps
        device = weight.device
        self.directions = (torch.stack(memory.directions).float().to(device) if len(memory)
                           else torch.zeros(0, memory.hidden, device=device))
        self.unit_directions = normalize(self.directions, self.eps)
        self.anchors = normalize(torch.cat(memory.anchors).float().to(device), self.eps) if len(memory) else None
        self.owner = (torch.cat([torch.full((len(a),), j) for j, a in enumerate(memory.anchors)]).to(device)
                      if len(memory) else None)

    def relevance(self, query_keys: torch.Tensor) -> torch.Tensor:
        """r_j = max_{a∈A_j} cos(k_q, a), shape (B, J)."""
        sims = normalize(query_keys.float(), self.eps) @ self.anchors.T  # (B, ΣA)
        out = torch.full((len(query_keys), len(self.directions)), -math.inf, device=sims.device)
        return out.scatter_reduce(1, self.owner.expand(len(query_keys), -1), sims, reduce="amax")

    def __call__(self, query_keys: torch.Tensor) -> StepUpdate:
        if not len(self.directions):
            device = query_keys.device
            return StepUpdate(self, torch.zeros(len(query_keys), 0, dtype=torch.long, device=device),
                              torch.zeros(len(query_keys), 0, device=device))
        r = self.relevance(query_keys)
        top = r.topk(min(self.config.candidates, r.shape[1]), dim=1)
        return StepUpdate(self, top.indices, top.values)


class StepUpdate:
    """h̃ = h + η·g·‖h‖·Δ for one batch of queries (their candidate prototypes fixed at construction)."""

    def __init__(self, adaptation: Adaptation, candidates: torch.Tensor, relevance: torch.Tensor):
        self.a, self.candidates, self.relevance = adaptation, candidates, relevance
        self.last_gate: torch.Tensor | None = None  # (B,) gate of the latest step, for diagnostics

    def select(self, rows: torch.Tensor) -> StepUpdate:
        """The same updates for the queries `rows` of this batch only."""
        return StepUpdate(self.a, self.candidates[rows], self.relevance[rows])

    def correction(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Δ_t (B, H), max relevance among the aggregated prototypes (B,))."""
        cfg = self.a.config
        u = uncertainty_direction(logits, self.a.weight, self.a.eps)  # (B, H)
        agreement = torch.einsum("bkh,bh->bk", self.a.unit_directions[self.candidates], u)
        score = self.relevance + cfg.uncertainty_weight * agreement
        chosen = score.topk(min(cfg.top_k, score.shape[1]), dim=1)
        weights = torch.softmax(chosen.values / cfg.temperature, dim=1)
        picked = self.candidates.gather(1, chosen.indices)
        delta = torch.einsum("bk,bkh->bh", weights, self.a.directions[picked])
        return delta, self.relevance.gather(1, chosen.indices).max(dim=1).values

    def gate(self, logits: torch.Tensor, max_relevance: torch.Tensor) -> torch.Tensor:
        cfg = self.a.config
        normalised = entropy(logits) / math.log(logits.shape[-1])
        return (torch.sigmoid(cfg.entropy_slope * (normalised - cfg.entropy_threshold))
                * torch.sigmoid(cfg.relevance_slope * (max_relevance - cfg.relevance_threshold)))

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, position: int) -> torch.Tensor:
        del position  # the MIITA paper's update is the same at every step
        if self.candidates.shape[1] == 0:  # empty memory: nothing to add
            self.last_gate = torch.zeros(len(hidden), device=hidden.device)
            return hidden
        delta, max_relevance = self.correction(logits)
        g = self.gate(logits, max_relevance)
        self.last_gate = g
        scale = self.a.config.step * g * hidden.float().norm(dim=-1)
        return hidden + (scale.unsqueeze(-1) * delta).to(hidden.dtype)


def extract_directions(lm: CausalLM, pairs: pa.RecordBatch) -> pa.RecordBatch:
    """Teacher-forced (k_m, R_m, ‖R_m‖) of every pair of a text-pair batch, no autograd, with each answer's token
    ids and the end-of-answer token (what the position-aware memory keeps)."""
    prompts, answers = S.text_pairs(pairs)
    out = lm.teacher_forced(prompts, answers)
    keys, corrections = out.keys.cpu(), out.corrections.cpu()  # Arrow holds host memory
    tokens = [[*lm.answer_ids(a), lm.answer_end_id] for a in answers]
    return S.direction_batch(S.sample_ids_to_numpy(pairs), keys.numpy(), corrections.numpy(),
                             corrections.norm(dim=1).numpy(), pairs.column(S.TASK_ID), encoder=lm.spec.name,
                             answer_tokens=tokens, answer_nll=out.loss.cpu().numpy(), model_tokens=out.model_tokens)
