"""MIITA's position-aware memory (docs/methods.md, "MIITA, position-aware"; [R] throughout).

The paper's memory (memcl_ops/miita/directions.py) keeps one correction per experience, averaged over the answer's
positions, and steers every decoding step with it. On a small LM that repeats the answer token and never stops
(benchmarks/RESULTS.md, "MIITA, position-aware"). Here each prototype keeps the correction of each of the first
`positions` answer positions, the end-of-answer token included when the answer fits:

* a direction is coded against the model's own LM-head rows. The closed-form correction of answer position t is
  R_t = Wᵀ(e_{y_t} − p_t) = W[y_t] − Wᵀp_t; W is the frozen head the model already holds and p_t is the model's own
  distribution at that step, so storing y_t (2 bytes at a vocabulary under 65,536) keeps R_t exactly: the read side
  recomputes it from the live logits. Prototypes with the same answer tokens merge (count-weighted, anchors pooled).
* keys can be centred (`MemoryConfig.centre_keys`, off by default): a running mean of the raw keys is subtracted
  before any cosine. Raw mid-layer keys of two prompts have cosine 0.93-0.998 (the prompt template dominates), so
  merging by key would merge everything; merging by answer tokens does not need centring, and anchors centred at
  write time drift from queries centred later (the dev grid chose raw keys, benchmarks/RESULTS.md). When on, the
  mean is stored (int8) and counted.
* anchors are stored compactly: sign bits (H/8 bytes), int8 (H bytes; a cosine needs no scale) or float16.
* repair, while over budget, applies the cheapest merge: two anchors of one prototype (cost 1 − cos) or two
  prototypes (cost λ_p·(1 − cos) of their closest anchors; the merged prototype keeps the answer of the larger
  count). So the budget holds after every write.
* read: the K prototypes of highest relevance r_j = max_a cos(k̄_q, a) per query; at answer position t the target
  token is the one the K prototypes vote for (weights softmax(r/τ_w)), its direction d_t = Norm(W[y] − Wᵀp_t), and
  the step is the smallest one that makes y the argmax (times 1 + margin; "flip"), capped at `max_step`·‖h‖: zero
  when the model already agrees, so a memory never moves an answer the model gets right by itself. The paper's
  gated relative step η·g·‖h‖·Δ stays available (`rule: relative`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.miita.directions import (
    COUNT_BYTES,
    Adaptation,
    AdaptConfig,
    DirectionMemory,
    MemoryConfig,
    WriteResult,
    entropy,
)
from memcl_ops.tensors import normalize

if TYPE_CHECKING:
    from memcl_ops.models.causal_lm import CausalLM

ANCHOR_COUNT_BYTES = 2  # |A_j| as uint16: the layout of the pooled anchor array
VOTE_BYTES = 2  # a prototype's recorded trials, and its and the model's hits per position: uint16 (saturating)
POOLED_VOTE_BYTES = 4  # the memory's pooled trials, and its and the model's hits per position: uint32
VOTE_CAP = np.iinfo(np.uint16).max
LENGTH_BYTES = 1  # stored answer positions per prototype, uint8 (positions <= 255)
CENTRE_HEADER_BYTES = 8  # the centre's float32 scale and int32 count
DEFAULT_MEMORY, DEFAULT_ADAPT = MemoryConfig(), AdaptConfig()


def anchor_width(hidden: int, code: str) -> int:
    """Bytes of one anchor: sign bits, int8 or float16 values."""
    return {"sign": -(-hidden // 8), "int8": hidden, "float16": 2 * hidden}[code]


def centre_bytes(hidden: int) -> int:
    """The stored key centre: int8 values, a float32 scale, the count."""
    return hidden + CENTRE_HEADER_BYTES


def answer_prototype_bytes(hidden: int, answer_len: int, anchors: int, anchor_code: str, token_bytes: int = 2,
                           votes: bool = False) -> int:
    """One prototype: its answer tokens, their count, the write count, the anchor count and the anchors, plus its
    vote record (trials; its and the model's hits per answer position) when `votes`."""
    return (answer_len * token_bytes + LENGTH_BYTES + COUNT_BYTES + ANCHOR_COUNT_BYTES
            + anchors * anchor_width(hidden, anchor_code) + (VOTE_BYTES * (1 + 2 * answer_len) if votes else 0))


def token_dtype(vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab <= 1 << 16 else np.dtype(np.int32)


def encode_anchor(unit: torch.Tensor, code: str) -> np.ndarray:
    """Rows of unit vectors (N, H) -> their stored codes (N, width)."""
    v = unit.detach().float().cpu().numpy()
    if code == "sign":
        return np.packbits(v >= 0, axis=-1)
    if code == "int8":
        scale = np.abs(v).max(axis=-1, keepdims=True)
        return np.round(127 * v / np.maximum(scale, 1e-12)).astype(np.int8)
    return v.astype(np.float16)


def decode_anchor(codes: np.ndarray, hidden: int, code: str) -> torch.Tensor:
    """Stored codes (N, width) -> unit vectors (N, H), float32."""
    if code == "sign":
        v = np.unpackbits(codes, axis=-1, count=hidden).astype(np.float32) * 2 - 1
    else:
        v = codes.astype(np.float32)
    return normalize(torch.from_numpy(v).reshape(len(codes), hidden))


class AnswerMemory:
    """Byte-budgeted prototypes of (answer tokens of the first positions, compact anchors, count), plus the key
    centre. `state()` is exactly what is stored; `nbytes()` is its size."""

    def __init__(self, hidden: int, vocab: int, config: MemoryConfig = DEFAULT_MEMORY):
        if not 1 <= config.positions <= 255:
            raise ValueError(f"positions must be in 1..255 for the position-aware memory, got {config.positions}")
        self.hidden, self.vocab, self.config = hidden, vocab, config
        self.tokens_dtype = token_dtype(vocab)
        smallest = self.fixed_bytes() + self.prototype_bytes(config.positions, 1)
        if config.budget_bytes < smallest:
            raise ValueError(f"budget_bytes {config.budget_bytes} cannot hold one prototype with one anchor and "
                             f"{config.positions} answer positions ({smallest} bytes at hidden {hidden}, "
                             f"{config.anchor_code} anchors)")
        self.answers: list[np.ndarray] = []  # answer token ids per prototype, first `positions` of them
        self.anchors: list[np.ndarray] = []  # (|A_j|, width) codes per prototype
        self.counts: list[int] = []
        self.centre = np.zeros(hidden, np.int8)
        self.centre_scale = 0.0
        self.centre_count = 0
        self.writes = self.repairs = 0
        self._by_answer: dict[bytes, int] = {}
        # the vote record (MemoryConfig.record_votes): per prototype, how often it was the nearest one to a new
        # experience, and at each answer position how often its token, and how often the frozen model's own token,
        # was that experience's token
        self.trials: list[int] = []
        self.hits: list[np.ndarray] = []
        self.model_hits: list[np.ndarray] = []
        self.pooled_trials = 0
        self.pooled_hits = np.zeros(config.positions, np.int64)
        self.pooled_model_hits = np.zeros(config.positions, np.int64)

    # ---------------------------------------------------------------- bytes
    def fixed_bytes(self) -> int:
        pooled = POOLED_VOTE_BYTES * (1 + 2 * self.config.positions) if self.config.record_votes else 0
        return (centre_bytes(self.hidden) if self.config.centre_keys else 0) + pooled

    def prototype_bytes(self, answer_len: int, anchors: int) -> int:
        return answer_prototype_bytes(self.hidden, answer_len, anchors, self.config.anchor_code,
                                      self.tokens_dtype.itemsize, self.config.record_votes)

    def nbytes(self) -> int:
        return self.fixed_bytes() + sum(self.prototype_bytes(len(t), len(a))
                                        for t, a in zip(self.answers, self.anchors))

    def __len__(self) -> int:
        return len(self.answers)

    @property
    def num_anchors(self) -> int:
        return sum(len(a) for a in self.anchors)

    # ---------------------------------------------------------------- keys
    def centre_vector(self) -> torch.Tensor:
        return torch.from_numpy(self.centre.astype(np.float32) * self.centre_scale)

    def centred(self, keys: torch.Tensor) -> torch.Tensor:
        """Unit keys with the running mean removed (unchanged when centring is off)."""
        keys = keys.float()
        if self.config.centre_keys:
            keys = keys - self.centre_vector().to(keys.device)
        return normalize(keys, self.config.eps)

    def update_centre(self, keys: torch.Tensor) -> None:
        """Fold raw keys (N, H) into the running mean (then stored in int8)."""
        mean = (self.centre_vector() * self.centre_count + keys.float().sum(dim=0)) / (self.centre_count + len(keys))
        self.centre_count += len(keys)
        self.centre_scale = float(mean.abs().max()) / 127 or 1.0
        self.centre = np.round(mean.numpy() / self.centre_scale).astype(np.int8)

    def anchor_units(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(all anchors as unit float32 rows (ΣA, H), the prototype each belongs to (ΣA,))."""
        if not self.anchors:
            return torch.zeros(0, self.hidden), torch.zeros(0, dtype=torch.long)
        units = decode_anchor(np.concatenate(self.anchors), self.hidden, self.config.anchor_code)
        owner = torch.cat([torch.full((len(a),), j, dtype=torch.long) for j, a in enumerate(self.anchors)])
        return units, owner

    # ---------------------------------------------------------------- write
    def write(self, key: torch.Tensor, answer_tokens: np.ndarray, centre: bool = True,
              model_tokens: np.ndarray | None = None) -> WriteResult:
        """One experience: its raw (unit) key and its answer's token ids (end-of-answer token last), and the frozen
        model's own token at each of those positions when known (for the vote record; unknown: never right). The key
        joins the running mean first unless `centre` is False (`write_batch` folds a whole batch in before writing
        it)."""
        key = torch.as_tensor(key).float().reshape(-1)
        if key.numel() != self.hidden or not torch.isfinite(key).all():
            raise ValueError(f"key must be {self.hidden} finite values, got {key.numel()} "
                             f"({'finite' if torch.isfinite(key).all() else 'with NaN or Inf'})")
        tokens = np.asarray(answer_tokens, dtype=np.int64)[:self.config.positions]
        if not len(tokens) or tokens.min() < 0 or tokens.max() >= self.vocab:
            raise ValueError(f"answer tokens must be 1+ ids in 0..{self.vocab - 1}, got {answer_tokens!r}")
        self.writes += 1
        if self.config.centre_keys and centre:
            self.update_centre(key.unsqueeze(0))
        unit = self.centred(key.unsqueeze(0))
        tokens = tokens.astype(self.tokens_dtype)
        nearest = self._record_vote(unit[0], tokens, model_tokens) if self.config.record_votes and len(self) else None
        j = self._by_answer.get(tokens.tobytes())
        if j is None and nearest is not None and self.config.admit == "ahead" and not self._ahead(nearest):
            return WriteResult("skipped", -1, False, 0)  # new, where the memory does no better than the model
        if j is None:
            self.answers.append(tokens)
            self.anchors.append(encode_anchor(unit, self.config.anchor_code))
            self.counts.append(1)
            self.trials.append(0)
            self.hits.append(np.zeros(len(tokens), np.int64))
            self.model_hits.append(np.zeros(len(tokens), np.int64))
            self._by_answer[tokens.tobytes()] = j = len(self.answers) - 1
            action, added = "new", True
        else:
            self.counts[j] += 1
            own = decode_anchor(self.anchors[j], self.hidden, self.config.anchor_code)
            sims = own @ unit[0]
            a = int(sims.argmax())
            added = float(sims[a]) < self.config.new_anchor
            if added:
                self.anchors[j] = np.concatenate([self.anchors[j], encode_anchor(unit, self.config.anchor_code)])
            else:  # absorb: a ← Norm(a + k)
                self.anchors[j][a] = encode_anchor(normalize(own[a] + unit[0]).unsqueeze(0), self.config.anchor_code)[0]
            action = "merged"
        repairs = self._repair()
        return WriteResult(action, self._by_answer.get(tokens.tobytes(), -1), added, repairs)

    def _record_vote(self, unit: torch.Tensor, tokens: np.ndarray, model_tokens: np.ndarray | None) -> int:
        """Test-then-write: position by position, would the nearest prototype's token have been this experience's,
        and was the model's own? Returns that prototype."""
        units, owner = self.anchor_units()
        j = int(owner[int((units @ unit).argmax())])
        stored = self.answers[j]
        agree, model_agrees = np.zeros(len(stored), np.int64), np.zeros(len(stored), np.int64)
        n = min(len(stored), len(tokens))
        agree[:n] = stored[:n] == tokens[:n]
        if model_tokens is not None:
            m = min(n, len(model_tokens))
            model_agrees[:m] = np.asarray(model_tokens[:m]) == tokens[:m]
        self.trials[j] = min(self.trials[j] + 1, VOTE_CAP)
        self.hits[j] = np.minimum(self.hits[j] + agree, VOTE_CAP)
        self.model_hits[j] = np.minimum(self.model_hits[j] + model_agrees, VOTE_CAP)
        self.pooled_trials += 1
        self.pooled_hits[:len(agree)] += agree
        self.pooled_model_hits[:len(agree)] += model_agrees
        return j

    def _ahead(self, j: int) -> bool:
        """Whether prototype j's record says the memory beats the model at the answer's first position."""
        ours, theirs = self._rates(j)
        return bool(ours[0] > theirs[0])

    def reliability(self) -> tuple[torch.Tensor, torch.Tensor]:
        """((J, positions), (J, positions)): per prototype and position, the estimated chance that its token, and
        that the model's own token, is a new query's there: the prototype's record shrunk toward the pooled one by
        `reliability_prior` pseudo-votes (pooled rates Laplace-smoothed). Without a record: the memory 1, the
        model 0."""
        memory, model = torch.ones(len(self), self.config.positions), torch.zeros(len(self), self.config.positions)
        if not self.config.record_votes:
            return memory, model
        for j, hits in enumerate(self.hits):
            ours, theirs = self._rates(j)
            memory[j, :len(hits)], model[j, :len(hits)] = torch.from_numpy(ours), torch.from_numpy(theirs)
        return memory, model

    def _rates(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Prototype j's shrunk rates per answer position: (its token was right, the model's own was)."""
        prior, trials = self.config.reliability_prior, self.trials[j]
        out = []
        for hits, pooled_hits in ((self.hits[j], self.pooled_hits), (self.model_hits[j], self.pooled_model_hits)):
            pooled = (pooled_hits[:len(hits)] + 1) / (self.pooled_trials + 2)
            out.append(((hits + prior * pooled) / (trials + prior) if trials + prior else pooled).astype(np.float32))
        return out[0], out[1]

    def write_batch(self, extracted: pa.RecordBatch) -> dict[str, int]:
        """WRITE every row of a key/answer-token batch, in stream order; returns what the writes did."""
        keys = torch.from_numpy(S.column_matrix(extracted, S.KEY).copy())
        if not torch.isfinite(keys).all():
            raise ValueError("a key of the batch contains NaN or Inf")
        own = (extracted.column(S.MODEL_TOKENS).to_pylist() if S.MODEL_TOKENS in extracted.schema.names
               else [None] * len(keys))
        if self.config.centre_keys:  # the batch's mean first: a stream's first key is not centred onto itself
            self.update_centre(keys)
        outcome = {"new": 0, "merged": 0, "skipped": 0, "repairs": 0}
        for k, tokens, model_tokens in zip(keys, extracted.column(S.ANSWER_TOKENS).to_pylist(), own):
            result = self.write(k, np.asarray(tokens), centre=False, model_tokens=model_tokens)
            outcome[result.action] += 1
            outcome["repairs"] += result.repairs
        return outcome

    # ---------------------------------------------------------------- repair
    def _repair(self) -> int:
        done = 0
        while self.nbytes() > self.config.budget_bytes:
            units, owner = self.anchor_units()
            if len(units) < 2:  # one prototype, one anchor: fits by construction
                raise AssertionError("memory over budget with nothing left to merge")
            cost = 1.0 - units @ units.T
            cost = torch.where(owner[:, None] == owner[None, :], cost, self.config.prototype_merge_cost * cost)
            cost.fill_diagonal_(math.inf)
            a, b = divmod(int(cost.argmin()), len(units))
            if owner[a] == owner[b]:
                self._merge_anchors(int(owner[a]), *sorted(int((owner[:x] == owner[x]).sum()) for x in (a, b)))
            else:
                self._merge_prototypes(*sorted((int(owner[a]), int(owner[b]))))
            done += 1
        self.repairs += done
        return done

    def _merge_anchors(self, j: int, a: int, b: int) -> None:
        own = decode_anchor(self.anchors[j], self.hidden, self.config.anchor_code)
        codes = self.anchors[j].copy()
        codes[a] = encode_anchor(normalize(own[a] + own[b]).unsqueeze(0), self.config.anchor_code)[0]
        self.anchors[j] = np.delete(codes, b, axis=0)

    def _merge_prototypes(self, i: int, j: int) -> None:
        keep, drop = (i, j) if self.counts[i] >= self.counts[j] else (j, i)  # the answer of the larger count
        self.counts[keep] += self.counts[drop]
        self.anchors[keep] = np.concatenate([self.anchors[keep], self.anchors[drop]])
        self.trials[keep] = min(self.trials[keep] + self.trials[drop], VOTE_CAP)
        n = min(len(self.hits[keep]), len(self.hits[drop]))
        # the dropped record's hits were for its own tokens: where the kept token differs they were its misses
        same = self.answers[keep][:n] == self.answers[drop][:n]
        self.hits[keep][:n] = np.minimum(self.hits[keep][:n] + np.where(same, self.hits[drop][:n], 0), VOTE_CAP)
        self.model_hits[keep][:n] = np.minimum(self.model_hits[keep][:n] + self.model_hits[drop][:n], VOTE_CAP)
        for parts in (self.answers, self.anchors, self.counts, self.trials, self.hits, self.model_hits):
            del parts[drop]
        self._by_answer = {t.tobytes(): n for n, t in enumerate(self.answers)}

    # ---------------------------------------------------------------- state
    def state(self) -> dict[str, np.ndarray]:
        """What is stored, as plain arrays (their bytes are `nbytes()`), plus 0-d write counters."""
        width = anchor_width(self.hidden, self.config.anchor_code)
        code_dtype = {"sign": np.uint8, "int8": np.int8, "float16": np.float16}[self.config.anchor_code]
        state = {
            "answer_tokens": np.concatenate(self.answers) if self.answers else np.zeros(0, self.tokens_dtype),
            "answer_lengths": np.array([len(t) for t in self.answers], np.uint8),
            "anchors": (np.concatenate(self.anchors) if self.anchors
                        else np.zeros((0, width // np.dtype(code_dtype).itemsize), code_dtype)),
            "anchor_counts": np.array([len(a) for a in self.anchors], np.uint16),
            "counts": np.array(self.counts, np.int32),
            "writes": np.array(self.writes), "repairs": np.array(self.repairs),
        }
        if self.config.centre_keys:
            state |= {"centre": self.centre.copy(),
                      "centre_header": np.array([self.centre_scale, self.centre_count], np.float32)}
        if self.config.record_votes:
            state |= {"vote_trials": np.array(self.trials, np.uint16),
                      "vote_hits": (np.concatenate(self.hits) if self.hits else np.zeros(0)).astype(np.uint16),
                      "model_hits": (np.concatenate(self.model_hits) if self.hits else np.zeros(0)).astype(np.uint16),
                      "pooled_votes": np.array([self.pooled_trials, *self.pooled_hits, *self.pooled_model_hits],
                                               np.uint32)}
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        lengths = np.asarray(state["answer_lengths"], np.int64)
        self.answers = [t.astype(self.tokens_dtype) for t in np.split(np.asarray(state["answer_tokens"]),
                                                                      np.cumsum(lengths)[:-1])] if len(lengths) else []
        sizes = np.asarray(state["anchor_counts"], np.int64)
        self.anchors = [a.copy() for a in np.split(np.asarray(state["anchors"]), np.cumsum(sizes)[:-1])] \
            if len(sizes) else []
        self.counts = [int(c) for c in state["counts"]]
        self.writes, self.repairs = int(state["writes"]), int(state["repairs"])
        if self.config.centre_keys:
            self.centre = np.asarray(state["centre"], np.int8).copy()
            self.centre_scale, count = (float(x) for x in state["centre_header"])
            self.centre_count = int(count)
        if self.config.record_votes and "vote_trials" in state:  # (a memory saved without its record starts one)
            self.trials = [int(t) for t in state["vote_trials"]]
            self.hits, self.model_hits = ([h.copy() for h in np.split(np.asarray(state[name], np.int64),
                                                                      np.cumsum(lengths)[:-1])] if len(lengths) else []
                                          for name in ("vote_hits", "model_hits"))
            pooled = np.asarray(state["pooled_votes"], np.int64)
            self.pooled_trials = int(pooled[0])
            self.pooled_hits, self.pooled_model_hits = pooled[1:1 + self.config.positions].copy(), pooled[
                1 + self.config.positions:].copy()
        else:
            self.trials = [0] * len(self.answers)
            self.hits, self.model_hits = ([np.zeros(len(t), np.int64) for t in self.answers] for _ in range(2))
            self.pooled_trials = 0
            self.pooled_hits, self.pooled_model_hits = (np.zeros(self.config.positions, np.int64) for _ in range(2))
        self._by_answer = {t.tobytes(): n for n, t in enumerate(self.answers)}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], hidden: int, vocab: int,
                   config: MemoryConfig = DEFAULT_MEMORY) -> AnswerMemory:
        memory = cls(hidden, vocab, config)
        memory.restore(state)
        return memory


# -------------------------------------------------------------------- read
def flip_step(logits: torch.Tensor, gain: torch.Tensor, target: torch.Tensor, margin: float) -> torch.Tensor:
    """The step α ≥ 0 along a direction whose logit change is `gain` (B, V) that makes `target` (B,) the argmax of
    logits + α·gain: the smallest such α times 1 + margin, kept below where another token would overtake. Tokens
    ahead that the direction does not close on are ignored (the caller re-linearises and steps again)."""
    l_y = logits.gather(1, target[:, None])
    g_y = gain.gather(1, target[:, None])
    ahead = logits - l_y  # > 0: tokens the target must overtake
    closing = g_y - gain  # how fast the target gains on each token
    others = torch.ones_like(logits, dtype=torch.bool).scatter_(1, target[:, None], False)
    lower = torch.where(others & (ahead >= 0) & (closing > 0), ahead / closing, 0.0).amax(dim=1)
    upper = torch.where(others & (ahead < 0) & (closing < 0), ahead / closing, math.inf).amin(dim=1)
    return torch.minimum(lower * (1 + margin), (lower + upper) / 2)


def flip(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, margin: float, iterations: int
         ) -> torch.Tensor:
    """h̃ near h whose argmax under W is `target`: flip steps along d = Norm(W[y] − Wᵀp) = the normalised
    −∂CE/∂h, re-linearised at each step (a token that the first direction does not close on is met by the next).
    Rows that do not flip within `iterations` steps come back as NaN."""
    h, w = hidden.float().clone(), weight.float()
    done = torch.zeros(len(h), dtype=torch.bool, device=h.device)
    for _ in range(iterations):
        logits = h @ w.T
        done = logits.argmax(dim=1) == target
        if bool(done.all()):
            return h
        direction = normalize(w[target] - torch.softmax(logits, dim=1) @ w)
        alpha = flip_step(logits, direction @ w.T, target, margin)
        h = torch.where(done[:, None], h, h + alpha[:, None] * direction)
    done = (h @ w.T).argmax(dim=1) == target
    return torch.where(done[:, None], h, math.nan)


class AnswerSteering:
    """Read side of the position-aware memory: per batch of queries, the K most relevant prototypes; per answer
    position, the step toward the token they vote for. Plugs into `CausalLM.generate(adapter=...)`."""

    def __init__(self, memory: AnswerMemory, weight: torch.Tensor, config: AdaptConfig = DEFAULT_ADAPT):
        self.memory, self.weight, self.config = memory, weight, config
        device = weight.device
        units, owner = memory.anchor_units()
        self.anchors, self.owner = units.to(device), owner.to(device)
        positions = memory.config.positions
        self.answers = torch.full((len(memory), positions), -1, dtype=torch.long)
        for j, t in enumerate(memory.answers):
            self.answers[j, :len(t)] = torch.from_numpy(t.astype(np.int64))
        self.answers = self.answers.to(device)
        memory_rate, model_rate = memory.reliability()  # (J, positions) each
        # what steering a position gains over the model's own token there (the vote gate compares it)
        self.advantage = (memory_rate - model_rate).to(device)

    def relevance(self, query_keys: torch.Tensor) -> torch.Tensor:
        """r_j = max_{a∈A_j} cos(k̄_q, a) over centred keys, shape (B, J)."""
        sims = self.memory.centred(query_keys.cpu()).to(self.weight.device) @ self.anchors.T
        out = torch.full((len(query_keys), len(self.memory)), -math.inf, device=sims.device)
        return out.scatter_reduce(1, self.owner.expand(len(query_keys), -1), sims, reduce="amax")

    def retrieve(self, query_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the K prototypes of highest relevance (B, K), their relevance (B, K))."""
        r = self.relevance(query_keys)
        top = r.topk(min(self.config.top_k, r.shape[1]), dim=1)
        return top.indices, top.values

    def nearest_answers(self, query_keys: torch.Tensor) -> list[list[int]]:
        """The stored answer tokens of the most relevant prototype per query (empty with an empty memory)."""
        if not len(self.memory):
            return [[] for _ in range(len(query_keys))]
        picked, _ = self.retrieve(query_keys)
        return [[t for t in row if t >= 0] for row in self.answers[picked[:, 0]].tolist()]

    def __call__(self, query_keys: torch.Tensor) -> PositionStep:
        if not len(self.memory):
            return PositionStep(self, torch.zeros(len(query_keys), 0, self.answers.shape[1], dtype=torch.long,
                                                  device=self.weight.device),
                                torch.zeros(len(query_keys), 0, device=self.weight.device))
        picked, relevance = self.retrieve(query_keys)
        return PositionStep(self, self.answers[picked], relevance, self.advantage[picked])


class PositionStep:
    """h̃_t = h_t + α_t·d_t for one batch of queries at answer position t (their prototypes fixed at construction)."""

    def __init__(self, steering: AnswerSteering, answers: torch.Tensor, relevance: torch.Tensor,
                 advantage: torch.Tensor | None = None):
        self.s, self.answers, self.relevance = steering, answers, relevance  # (B, K, P), (B, K)
        self.advantage = torch.ones(answers.shape, device=answers.device) if advantage is None else advantage
        self.last_gate: torch.Tensor | None = None
        cfg = steering.config
        keep = relevance >= cfg.min_relevance
        self.weights = torch.softmax(relevance / cfg.temperature, dim=1) * keep if relevance.shape[1] else relevance

    def select(self, rows: torch.Tensor) -> PositionStep:
        """The same steps for the queries `rows` of this batch only."""
        return PositionStep(self.s, self.answers[rows], self.relevance[rows], self.advantage[rows])

    def target(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the voted token at this position (B,), whether the memory steers there (B,)): some prototype votes and,
        with the vote gate, the voters' advantage there over the model's own token (weighted as their votes) exceeds
        `min_advantage`."""
        if position >= self.answers.shape[2] or not self.answers.shape[1]:
            n = len(self.answers)
            return torch.zeros(n, dtype=torch.long, device=self.answers.device), torch.zeros(
                n, dtype=torch.bool, device=self.answers.device)
        tokens = self.answers[:, :, position]  # (B, K), -1 where a stored answer is shorter
        weights = self.weights * (tokens >= 0)
        votes = torch.zeros(len(tokens), self.s.memory.vocab, device=tokens.device)
        votes.scatter_add_(1, tokens.clamp_min(0), weights)
        best = votes.max(dim=1)
        steer = best.values > 0
        if self.s.config.vote_gate:
            for_best = weights * (tokens == best.indices[:, None])
            advantage = (for_best * self.advantage[:, :, position]).sum(dim=1) / best.values.clamp_min(1e-12)
            steer &= advantage > self.s.config.min_advantage
        return best.indices, steer

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, position: int) -> torch.Tensor:
        cfg, weight = self.s.config, self.s.weight
        target, active = self.target(position)
        self.last_gate = active.float()
        if not bool(active.any()):
            return hidden
        norm = hidden.float().norm(dim=-1)
        if cfg.rule == "relative":
            p = torch.softmax(logits.float(), dim=-1)
            direction = normalize(weight[target].float() - p @ weight.float())  # Norm(R_t) from the live logits
            g = torch.sigmoid(cfg.entropy_slope * (entropy(logits) / math.log(logits.shape[-1])
                                                   - cfg.entropy_threshold))
            alpha = cfg.step * g * norm
            alpha = torch.where(active, alpha, 0.0)
            self.last_gate = (alpha > 0).float()
            return hidden + (alpha.unsqueeze(-1) * direction).to(hidden.dtype)
        flipped = flip(hidden, weight, target, cfg.flip_margin, cfg.flip_iterations)
        moved = (flipped - hidden.float()).norm(dim=-1)
        # not flipped, or only beyond the cap: the model keeps its own token
        keep = active & torch.isfinite(moved) & (moved <= cfg.max_step * norm)
        self.last_gate = keep.float()
        return torch.where(keep[:, None], flipped.to(hidden.dtype), hidden)


def copy_answers(lm: CausalLM, steering: AnswerSteering, prompts: list[str]) -> list[str]:
    """The nearest prototype's stored answer per prompt, decoded without its end-of-answer token (nearest-answer)."""
    tokens = steering.nearest_answers(lm.query_keys(prompts))
    return [lm.tokenizer.decode([t for t in row if t not in lm.stop_ids], skip_special_tokens=True) for row in tokens]


def is_position_aware(config: MemoryConfig) -> bool:
    return config.positions > 0


def build_memory(hidden: int, vocab: int, config: MemoryConfig) -> AnswerMemory | DirectionMemory:
    """The memory a MIITA configuration asks for: position-aware (positions ≥ 1) or the MIITA paper's averaged one."""
    return AnswerMemory(hidden, vocab, config) if is_position_aware(config) else DirectionMemory(hidden, hidden, config)


def memory_from_state(state: dict[str, np.ndarray], hidden: int, vocab: int, config: MemoryConfig
                      ) -> AnswerMemory | DirectionMemory:
    if is_position_aware(config):
        return AnswerMemory.from_state(state, hidden, vocab, config)
    return DirectionMemory.from_state(state, config)


def adaptation(memory: AnswerMemory | DirectionMemory, weight: torch.Tensor, config: AdaptConfig
               ) -> AnswerSteering | Adaptation:
    """The adapter factory for `CausalLM.generate` of either memory."""
    if isinstance(memory, AnswerMemory):
        return AnswerSteering(memory, weight, config)
    if config.rule != "relative":  # the MIITA paper's memory keeps no tokens to flip to or copy
        raise ValueError(f"adapt.rule {config.rule!r} needs the position-aware memory (memory.positions >= 1); the "
                         "paper's averaged memory takes rule 'relative'")
    return Adaptation(memory, weight, config)

