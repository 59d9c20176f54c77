"""NSR (Neural Subspace Reallocation; docs/methods.md, "NSR"): one active LoRA adapter inside a frozen encoder,
reallocated at each task arrival from a bank of compressed past adapters (memcl_ops/nsr/task_bank.py).

The *active capacity* is one rank-r adapter plus one head with `n_way` outputs over task-local labels (label =
position of the class in its task's class list; tasks are evaluated task-incrementally). At a task
arrival the allocation rule decides what the active capacity starts from:

| allocation | start of a visit |
|---|---|
| `bank` (NSR) | the similarity rule on the bank: restore an entry (adapter and head) / warm start from a mix / fresh |
| `round-robin` | the same bank, key-blind: restore its entries in turn (fresh while it is empty) |
| `learned` | the same bank: a learned policy picks restore (one of the top-m) / warm mix / fresh (policy.py) |
| `fresh` (memoryless) | a fresh adapter (B = 0) and a zero head |
| `keep` (memoryless) | whatever the previous visit left (adapter and head) |

A warm or fresh start from the bank keeps the arriving task's own head when the bank holds its entry (a returning task
whose key fell below τ_same does not start at chance). With `task_heads` the memoryless rules keep every task's head
(a few KB each, the memory manager's head store) and start and answer a task with its own head, so what they lose
is the adapter alone.

Training is `CE` on the task's labels plus, after a restore or a warm start, the LwF term
`λ_KD · T² · KL(p_teacher^T ‖ p_student^T)`: the teacher is the retrieved adapter before adaptation, and both
teacher and student are read through the (frozen) heads of the tasks that adapter served [R].

`AdapterLearner` is Ray-free; the AdapterTrainer actor wraps it and the MemoryManager actor owns the bank.

Data-parallel (`learn_data_parallel`): N learners, one per process of a torch.distributed group, each learn their
share of every optimizer step's rows (memcl_ops/data_parallel.py): the same learning as one learner on the same steps,
up to the order of float sums.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from memcl_ops.arrow import schema as S
from memcl_ops.data_parallel import DataParallel, data_parallel
from memcl_ops.losses import kd_loss
from memcl_ops.models.lora import LoRAAdapters, LoRAConfig
from memcl_ops.models.lowrank import CompressedDelta, compress
from memcl_ops.nsr.policy import PolicyConfig
from memcl_ops.nsr.task_bank import BankConfig, BankEntry, Retrieval, TaskKnowledgeBank, normalize

Allocation = Literal["bank", "round-robin", "learned", "fresh", "keep"]
BANKED = ("bank", "round-robin", "learned")  # the rules that keep the bank; fresh and keep are memoryless


@dataclass(frozen=True)
class NSRConfig:
    allocation: Allocation = "bank"  # the arrival rule; "fresh" and "keep" are the memoryless baselines
    task_heads: bool = False  # fresh / keep: keep each task's head and answer the task through it
    lora: LoRAConfig = LoRAConfig()
    bank: BankConfig = BankConfig()
    policy: PolicyConfig = PolicyConfig()  # the learned allocation rule
    lr: float = 1e-3  # Adam on the adapter and the head [R]
    batch_size: int = 16  # rows per optimizer step; each row is learned once, in stream order [R]
    kd_weight: float = 1.0  # λ_KD [R]
    kd_temperature: float = 2.0  # T [R]
    probe_size: int = 256  # the task key is the mean LoRA-off feature of the visit's first rows [R]
    recovery_tolerance: float = 0.01  # a returning task is back when within this of its previous best [R]
    recovery_fraction: float = 0.0  # ... or at this fraction of it (METHODS [R]: 0.95); 0: the tolerance alone
    recovery_max_steps: int = 100  # steps tracked per returning visit; a task not back by then is censored

    @property
    def banked(self) -> bool:
        return self.allocation in BANKED

    def __post_init__(self) -> None:
        if self.allocation not in (*BANKED, "fresh", "keep"):
            raise ValueError(f"nsr.allocation must be one of {(*BANKED, 'fresh', 'keep')}, got {self.allocation!r}")
        if self.task_heads and self.allocation in BANKED:
            raise ValueError(f"nsr.task_heads is for the memoryless rules; {self.allocation} keeps every head in "
                             "its bank")
        if self.probe_size < 1 or self.batch_size < 1:
            raise ValueError(f"nsr.probe_size and nsr.batch_size must be >= 1, got {self.probe_size}, "
                             f"{self.batch_size}")


class TrainableEncoder(Protocol):
    """A frozen encoder whose torch model can carry LoRA (memcl_ops.models.encoders text and torch image encoders)."""

    model: nn.Module
    dim: int
    device: torch.device

    def features(self, batch: pa.RecordBatch) -> torch.Tensor: ...


@dataclass
class ArrivalPlan:
    """What the active capacity starts from at a task arrival (made by the bank's owner, applied by the learner)."""

    kind: Literal["restore", "warm", "fresh", "keep"]
    deltas: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # per site (B, A), scale in B
    head: dict[str, np.ndarray] | None = None  # restored head
    teacher_heads: list[dict[str, np.ndarray]] = field(default_factory=list)  # heads the loaded adapter served
    retrieval: Retrieval | None = None


def plan_arrival(bank: TaskKnowledgeBank, key: np.ndarray, rank: int, task: int | None = None) -> ArrivalPlan:
    """The bank's similarity rule turned into a plan (restore / warm-start mix / fresh)."""
    return plan_for(bank, bank.retrieve(key), rank, task)


def plan_for(bank: TaskKnowledgeBank, r: Retrieval, rank: int, task: int | None = None) -> ArrivalPlan:
    """A decision on the bank turned into a plan: restore an entry (its adapter and head) / warm-start from a mix /
    fresh; a warm or fresh start of `task` keeps the task's own head when the bank holds its entry."""
    if r.kind == "restore":
        entry = bank.entries[r.tasks[0]]
        return ArrivalPlan("restore", entry.delta_factors(), entry.head, [entry.head], r)
    own = bank.entries[task].head if task in bank.entries else None
    if r.kind == "warm":
        return ArrivalPlan("warm", bank.warm_start(r, rank), own, [bank.entries[t].head for t in r.tasks], r)
    return ArrivalPlan("fresh", head=own, retrieval=r)


@dataclass
class TaskHead:
    """A memoryless rule's kept head of one task: the task is answered through the active adapter and this head."""

    head: dict[str, np.ndarray]
    deltas: None = None  # no adapter of its own


RECOVERY_EPS = 1e-9  # accuracies are ratios of counts; absorbs float error in "best - tolerance"


@dataclass
class RecoveryTracker:
    """Optimizer steps until a returning task is back within `tolerance` of its previous best accuracy, or at
    `fraction` of it (docs/methods.md, "NSR"): step 0 is the accuracy right after the arrival decision, before any
    training."""

    previous_best: float
    tolerance: float
    max_steps: int
    fraction: float = 0.0  # also back at this fraction of the previous best
    curve: list[tuple[int, float]] = field(default_factory=list)
    recovered_at: int | None = None

    @property
    def target(self) -> float:
        within = self.previous_best - self.tolerance
        return (min(within, self.fraction * self.previous_best) if self.fraction > 0 else within) - RECOVERY_EPS

    @property
    def done(self) -> bool:
        return self.recovered_at is not None or bool(self.curve and self.curve[-1][0] >= self.max_steps)

    def record(self, step: int, accuracy: float) -> None:
        if self.done:
            return
        self.curve.append((step, accuracy))
        if accuracy >= self.target:
            self.recovered_at = step

    def report(self) -> dict:
        return {"previous_best": self.previous_best, "target": self.target, "recovered_at": self.recovered_at,
                "censored": self.recovered_at is None, "curve": [list(p) for p in self.curve]}


@dataclass
class Snapshot:
    """The active adapter compressed for the bank, and the active head."""

    deltas: dict[str, CompressedDelta]
    head: dict[str, np.ndarray]

    def entry(self, task: int, key: np.ndarray, accuracy: float = float("nan")) -> BankEntry:
        return BankEntry(task, normalize(key), self.deltas, self.head, accuracy)


@torch.no_grad()
def _copy_head(head: nn.Linear, state: Mapping[str, np.ndarray]) -> None:
    head.weight.copy_(torch.from_numpy(np.array(state["weight"], dtype=np.float32)))
    head.bias.copy_(torch.from_numpy(np.array(state["bias"], dtype=np.float32)))


def probe_full(rows_held: int, probe_size: int) -> bool:
    """Whether a visit's first batches hold enough rows to take the task key: rows that passed the gate are counted,
    not batches, so short batches (a file's end) and refused rows do not shrink the probe."""
    return rows_held >= probe_size


class _Student(nn.Module):
    """The trained forward of a step as one module, what DDP wraps: the frozen encoder with its LoRA sites, then
    the head."""

    def __init__(self, encoder: TrainableEncoder, head: nn.Linear):
        super().__init__()
        self.model, self.head = encoder.model, head
        self.encoder = encoder  # not a module: its model is registered above

    def forward(self, batch: pa.RecordBatch) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder.features(batch).float()
        return h, self.head(h)


class AdapterLearner:
    def __init__(self, encoder: TrainableEncoder, config: NSRConfig, n_way: int, seed: int = 0):
        if n_way < 2:
            raise ValueError(f"a task needs at least 2 classes, got n_way={n_way}")
        self.encoder, self.config, self.n_way, self.seed = encoder, config, n_way, seed
        self.adapters = LoRAAdapters(encoder.model, config.lora)
        self.device = encoder.device
        self.head = nn.Linear(encoder.dim, n_way).to(self.device)
        self.classes: list[int] = []
        self.teacher: tuple[dict[str, np.ndarray], list[nn.Linear]] | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.visits = 0  # arrivals seen (seeds fresh adapters and minibatch order)
        self.steps = 0  # optimizer steps in the current visit
        self.parallel: DataParallel | None = None
        self._reset_head()

    def learn_data_parallel(self, rank: int, world: int) -> None:
        """Learn as worker `rank` of `world` in the default torch.distributed group, which every worker has joined;
        the workers start from the same state (they restore the same checkpoint) and take the same calls."""
        # an encoder may carry LoRA sites its features never pass through (open_clip's text tower under an image)
        self.parallel = data_parallel(_Student(self.encoder, self.head), rank, world, find_unused=True)

    @torch.no_grad()
    def _reset_head(self) -> None:
        self.head.weight.zero_()
        self.head.bias.zero_()

    # --- task arrival -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def key(self, batches: Sequence[pa.RecordBatch]) -> np.ndarray:
        """Norm(mean feature) of the first `probe_size` rows, frozen backbone with LoRA off (keys never drift)."""
        feats, rows = [], 0
        with self.adapters.disabled():
            for b in batches:
                if probe_full(rows, self.config.probe_size):
                    break
                if b is None:  # every row refused at the gate
                    continue
                b = b.slice(0, self.config.probe_size - rows)
                feats.append(self.encoder.features(b).float().cpu())
                rows += b.num_rows
        if not rows:
            raise ValueError("the task key needs at least one probe row")
        return normalize(torch.cat(feats).mean(0).numpy())

    def begin_task(self, classes: Sequence[int], plan: ArrivalPlan) -> None:
        """Start a visit of the task with global `classes` from `plan` (its `kind` "keep" keeps the adapter, and the
        head unless the plan brings one)."""
        if not 1 <= len(classes) <= self.n_way:
            raise ValueError(f"a task with {len(classes)} classes does not fit a head of {self.n_way} outputs")
        self.visits += 1
        self.classes = [int(c) for c in classes]
        self._start(plan)
        self.teacher = None
        if plan.kind in ("restore", "warm") and self.config.kd_weight > 0:
            self.teacher = (self.adapters.factors(), [self._frozen_head(h) for h in plan.teacher_heads])
        params = [*self.adapters.parameters(), *self.head.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=self.config.lr)
        self.steps = 0

    def _start(self, plan: ArrivalPlan, visit: int | None = None) -> None:
        """Set the active capacity as `plan` starts a visit (a fresh adapter seeded by the visit's number)."""
        visit = self.visits if visit is None else visit
        if plan.kind != "keep":
            self.adapters.load_deltas(plan.deltas, seed=self.seed * 1_000_003 + visit)
            self._load_head(plan.head)
        elif plan.head is not None:
            self._load_head(plan.head)

    def start_accuracy(self, plan: ArrivalPlan, classes: Sequence[int], batches: Sequence[pa.RecordBatch]) -> float:
        """Accuracy on `batches` of the start `plan` would give the next visit, before any step; the active
        capacity is left exactly as it was."""
        with self._active_kept():
            self._start(plan, self.visits + 1)
            return self.accuracy(batches, classes)

    @torch.no_grad()
    def loss_with(self, stored: BankEntry, classes: Sequence[int], batches: Sequence[pa.RecordBatch]) -> float:
        """Mean cross-entropy of a stored adapter and head on rows of the task with `classes`, over ln(n_way) (1:
        chance); the active capacity is left exactly as it was."""
        rows = [b for b in batches if b is not None]
        with self.holding(stored):
            losses = [F.cross_entropy(self.logits(b), self.local_labels(b, classes).to(self.device), reduction="sum")
                      for b in rows]
        return float(torch.stack(losses).sum()) / sum(b.num_rows for b in rows) / float(np.log(self.n_way))

    def _load_head(self, state: Mapping[str, np.ndarray] | None) -> None:
        if state is None:
            self._reset_head()
        else:
            _copy_head(self.head, state)

    def _frozen_head(self, state: Mapping[str, np.ndarray]) -> nn.Linear:
        head = nn.Linear(self.encoder.dim, self.n_way).requires_grad_(False).to(self.device)
        _copy_head(head, state)
        return head

    # --- training -----------------------------------------------------------------------------------------------

    def local_labels(self, batch: pa.RecordBatch, classes: Sequence[int] | None = None) -> torch.Tensor:
        """Labels as positions in `classes` (default: the active task's)."""
        classes = self.classes if classes is None else classes
        lookup = {int(c): i for i, c in enumerate(classes)}
        y = S.labels_to_numpy(batch)
        bad = sorted({int(c) for c in y} - set(lookup))
        if bad:
            raise ValueError(f"labels {bad[:5]} are not classes of the task {list(classes)}")
        return torch.tensor([lookup[int(c)] for c in y], dtype=torch.long)

    def train_batch(self, batch: pa.RecordBatch, after_step: Callable[[], None] | None = None,
                    before_step: Callable[[pa.RecordBatch, torch.Tensor | None], None] | None = None) -> list[float]:
        """One optimizer step per `batch_size` rows of `batch`; `after_step` runs after each step; `before_step`
        gets each step's rows and their logits as the step's forward computed them, before the step learns them
        (None for a data-parallel worker, whose forward holds only its share of the rows)."""
        if self.optimizer is None:
            raise RuntimeError("begin_task must come before training")
        losses = []
        size = self.config.batch_size
        for start in range(0, batch.num_rows, size):
            losses.append(self._step(batch.slice(start, size), before_step))
            if after_step is not None:
                after_step()
        return losses

    def _step(self, batch: pa.RecordBatch,
              before_step: Callable[[pa.RecordBatch, torch.Tensor | None], None] | None) -> float:
        loss, logits = self.loss(batch)
        if before_step is not None:
            before_step(batch, logits.detach() if self.parallel is None else None)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        if self.parallel is None:
            return float(loss.detach())
        return float(self.parallel.group_mean(loss.detach()))

    def loss(self, batch: pa.RecordBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """One step's loss on `batch`: its mean over the rows, or, data-parallel, this worker's rows weighed so that
        the workers' average is that mean; and the logits of the rows the loss read."""
        weight = None
        if self.parallel is not None:
            rows, weight = self.parallel.rows(batch.num_rows)
            batch = batch.take(pa.array(rows))
        y = self.local_labels(batch).to(self.device)
        # The teacher pass swaps the factors in place, so it must come before the student pass records them.
        teacher = self._teacher_features(batch) if self.teacher is not None else None
        if self.parallel is None:
            h = self.encoder.features(batch).float()
            logits = self.head(h)
        else:
            h, logits = self.parallel.module(batch)
        rows = None if weight is None else torch.full((len(y),), weight, device=self.device)
        loss = F.cross_entropy(logits, y) if rows is None else F.cross_entropy(logits, y, reduction="none") @ rows
        if teacher is not None:
            t = self.config.kd_temperature
            heads = self.teacher[1]
            loss = loss + self.config.kd_weight * torch.stack([kd_loss(g(h), g(teacher), t, rows)
                                                               for g in heads]).mean()
        return loss, logits

    @torch.no_grad()
    def _teacher_features(self, batch: pa.RecordBatch) -> torch.Tensor:
        with self.swapped(self.teacher[0]):
            return self.encoder.features(batch).float()

    @contextmanager
    def swapped(self, factors: Mapping[str, np.ndarray]):
        """Inside the block the adapter holds `factors`; the active ones come back after (exactly)."""
        active = self.adapters.factors()
        self.adapters.load_factors(factors)
        try:
            yield
        finally:
            self.adapters.load_factors(active)

    # --- evaluation and storage ---------------------------------------------------------------------------------

    @torch.no_grad()
    def logits(self, batch: pa.RecordBatch) -> torch.Tensor:
        return self.head(self.encoder.features(batch).float())

    @torch.no_grad()
    def correct(self, batch: pa.RecordBatch, classes: Sequence[int] | None = None) -> tuple[int, int]:
        """(correct, total) of the active adapter and head on a batch of the task with `classes` (default: active);
        the head's output j stands for `classes[j]`."""
        pred = self.logits(batch).argmax(1).cpu()
        return int((pred == self.local_labels(batch, classes)).sum()), batch.num_rows

    def accuracy(self, batches: Sequence[pa.RecordBatch], classes: Sequence[int] | None = None) -> float:
        """Accuracy over the rows of `batches` (None: a batch the gate refused whole); NaN without a row."""
        counts = np.array([self.correct(b, classes) for b in batches if b is not None]).reshape(-1, 2).sum(0)
        return float(counts[0] / counts[1]) if counts[1] else float("nan")

    def accuracy_with(self, stored: BankEntry | Snapshot | TaskHead, classes: Sequence[int],
                      batches: Sequence[pa.RecordBatch]) -> float:
        """Accuracy of a stored adapter and head on its task; the active capacity is left exactly as it was."""
        with self.holding(stored):
            return self.accuracy(batches, classes)

    @torch.no_grad()
    def scored(self, batch: pa.RecordBatch, classes: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(the global class, the head's score of it) of every row, by the active capacity, its head's output j
        standing for `classes[j]` (default: the active task's); -1 for an output beyond them."""
        return self.answers(self.logits(batch), classes)

    def answers(self, logits: torch.Tensor, classes: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`scored` of rows whose logits are known."""
        best, position = logits.max(dim=1)
        answers = np.array([*(self.classes if classes is None else classes), *[-1] * self.n_way])
        return answers[position.cpu().numpy()], best.float().cpu().numpy()

    @contextmanager
    def holding(self, stored: BankEntry | Snapshot | TaskHead):
        """Inside the block a stored adapter and head are the active capacity; the active one comes back after
        (exactly)."""
        with self._active_kept():
            self.load_stored(stored)
            yield

    @contextmanager
    def as_of(self, state: Mapping[str, np.ndarray]):
        """Inside the block the active capacity is the one `state` took (its classes too); the active one comes back
        after (exactly)."""
        with self._active_kept():
            self._load_active(state)
            yield

    @contextmanager
    def _active_kept(self):
        active = self.state()
        try:
            yield
        finally:
            self._load_active(active)

    def snapshot(self) -> Snapshot:
        """The active adapter compressed (QR-SVD, energy rank, storage dtype) and the head."""
        deltas = {site: compress(*self.adapters.factor_pair(site), self.config.bank.compression)
                  for site in self.adapters.sites}
        return Snapshot(deltas, self.head_state())

    def head_state(self) -> dict[str, np.ndarray]:
        """A copy of the active head."""
        return {"weight": self.head.weight.detach().cpu().numpy().copy(),
                "bias": self.head.bias.detach().cpu().numpy().copy()}

    def load_stored(self, stored: BankEntry | Snapshot | TaskHead) -> None:
        """Make a stored adapter and head the active capacity (what a restore does); a kept head alone replaces
        only the head."""
        if stored.deltas is not None:
            self.adapters.load_deltas({site: d.factors() for site, d in stored.deltas.items()})
        self._load_head(stored.head)

    # --- state --------------------------------------------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray]:
        """The active capacity between visits (a visit's optimizer does not outlive it)."""
        return {**{f"lora.{k}": v for k, v in self.adapters.factors().items()},
                **{f"head.{k}": v for k, v in self.head_state().items()},
                "classes": np.array(self.classes, dtype=np.int64), "visits": np.array(self.visits)}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        self._load_active(state)
        self.visits = int(state["visits"])
        self.optimizer, self.teacher = None, None

    def _load_active(self, state: Mapping[str, np.ndarray]) -> None:
        self.adapters.load_factors({k[5:]: v for k, v in state.items() if k.startswith("lora.")})
        self._load_head({"weight": state["head.weight"], "bias": state["head.bias"]})
        self.classes = [int(c) for c in state["classes"]]
