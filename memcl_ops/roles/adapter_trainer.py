"""The adapter trainer role (NSR): a frozen encoder carrying NSR's active LoRA adapter and head, trained on raw batches
(NSR learns inside the backbone, so it cannot work on cached features like the MARS trainers).

Several trainers can learn as one, data-parallel (`join`): every worker takes the calls that change what is learned
(REPLICATED), each learning its share of every step's rows with DDP all-reducing the gradients; worker 0 alone
answers the rest (keys, evaluation, compression, its state stands for the group's).

Test-then-train: worker 0 predicts every training batch with the active capacity as it stands (after the visit's
arrival decision, which reads no label) before the batch is learned: each optimizer step's rows before that step
learns them, from the step's own forward (a data-parallel worker 0, whose forward holds only its share, in one of
their own); and with the capacity of `near_future` batches back. `end_task` hands the visit's predictions over
(memcl_ops/prequential.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.clock import StageClock
from memcl_ops.data_parallel import join_group
from memcl_ops.models.encoders import EncoderSpec, build_encoder
from memcl_ops.models.lora import backbone_parameters
from memcl_ops.nsr.adapter import AdapterLearner, ArrivalPlan, NSRConfig, RecoveryTracker, Snapshot, TaskHead
from memcl_ops.nsr.task_bank import BankEntry
from memcl_ops.prequential import PREDICTIONS, NearFutureModels, PrequentialConfig, prediction_table
from memcl_ops.tensors import SampleIds, prefixed, state_part

# the calls every data-parallel worker takes (they change what the workers learn); the others go to worker 0
REPLICATED = frozenset({"begin_task", "train"})


class AdapterTrainer:
    """`threads`: the hosting process's torch threads (None: leave them)."""

    def __init__(self, spec: EncoderSpec, payload: str, config: NSRConfig, n_way: int, seed: int,
                 threads: int | None = None, near_future: int = PrequentialConfig.near_future):
        self.reset(spec, payload, config, n_way, seed, threads, near_future)

    def reset(self, spec: EncoderSpec, payload: str, config: NSRConfig, n_way: int, seed: int,
              threads: int | None = None, near_future: int = PrequentialConfig.near_future) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        if getattr(self, "encoder_args", None) != (spec, payload):  # same frozen encoder: keep the loaded weights
            self.encoder = build_encoder(spec, payload)
            self.encoder_args = (spec, payload)
        elif hasattr(self, "learner"):
            self.learner.adapters.remove()
        self.learner = AdapterLearner(self.encoder, config, n_way, seed)
        self.config = config
        self.rank = 0
        self.tracker: RecoveryTracker | None = None
        self.compressed: Snapshot | None = None
        self.eval_batches: tuple[pa.RecordBatch, ...] = ()
        self.learned = SampleIds()  # sample ids trained on, for exactly-once accounting
        self.predictions: list[pa.Table] = []  # the visit's training batches as predicted before they were learned
        # earlier capacities (their states) for the near-future predictions
        self.earlier: NearFutureModels[dict[str, np.ndarray]] = NearFutureModels(near_future)
        self.clock = StageClock()

    @property
    def device(self) -> torch.device:
        """Where the adapter trains."""
        return self.learner.device

    def join(self, address: str, rank: int, world: int, whole_gpus: bool = False) -> None:
        """Become worker `rank` of `world` trainers learning as one (after every reset): join their process group at
        `address` (worker 0's `rendezvous_address`) and wrap the learner in DDP. The group all-reduces over NCCL when
        every worker has a GPU of its own (`whole_gpus`), else over gloo (CPUs, or workers sharing a GPU, which NCCL
        refuses)."""
        join_group(address, rank, world, nccl=whole_gpus and self.learner.device.type == "cuda")
        self.rank = rank
        if rank:  # only worker 0 predicts: the others keep no earlier capacity
            self.earlier = NearFutureModels(1)
        self.learner.learn_data_parallel(rank, world)

    def info(self) -> dict:
        a = self.learner.adapters
        return {"encoder": self.encoder.id, "dim": self.encoder.dim, "sites": list(a.sites),
                "adapter_parameters": a.num_parameters(),
                "backbone_parameters": sum(p.numel() for p in backbone_parameters(self.encoder.model).values())}

    def key(self, *batches: pa.RecordBatch) -> np.ndarray:
        with self.clock.time("key"):
            return self.learner.key(batches)

    def probe_losses(self, candidates: list[BankEntry], classes: list[int], *probe: pa.RecordBatch) -> list[float]:
        """The probe loss of each candidate entry (its adapter and head) on the first `policy.probe_rows` probe rows,
        over ln(n_way): what the learned allocation policy reads (the probe's labels)."""
        with self.clock.time("probe_losses"):
            rows, left = [], self.config.policy.probe_rows
            for b in probe:
                if b is not None and left > 0:
                    rows.append(b.slice(0, left))
                    left -= rows[-1].num_rows
            return [self.learner.loss_with(entry, classes, rows) for entry in candidates]

    def start_accuracies(self, plans: list[ArrivalPlan], classes: list[int], *tests: pa.RecordBatch) -> list[float]:
        """The accuracy on `tests` of the start each plan would give, before any step (a learning policy's
        rewards)."""
        with self.clock.time("start_accuracies"):
            return [self.learner.start_accuracy(plan, classes, tests) for plan in plans]

    def begin_task(self, classes: list[int], plan: ArrivalPlan, previous_best: float | None,
                   *eval_batches: pa.RecordBatch) -> None:
        """Start a visit; with `previous_best` (a returning task) accuracy on `eval_batches` is tracked after the
        arrival decision and after every step until the task is back (or `recovery_max_steps`)."""
        with self.clock.time("begin_task"):
            self.learner.begin_task(classes, plan)
            self.tracker, self.eval_batches = None, eval_batches
            if previous_best is not None and self.rank == 0:  # worker 0 reports the group's recovery
                cfg = self.config
                self.tracker = RecoveryTracker(previous_best, cfg.recovery_tolerance, cfg.recovery_max_steps,
                                               cfg.recovery_fraction)
                self._track()

    def _track(self) -> None:
        if self.tracker is not None and not self.tracker.done:
            with self.clock.time("recovery_eval"):
                self.tracker.record(self.learner.steps, self.learner.accuracy(self.eval_batches))

    def train(self, batch: pa.RecordBatch | None) -> list[float]:
        """Predict one batch, then train on it (None: every row was refused at the gate)."""
        if batch is None:
            return []
        predicts = self.rank == 0  # worker 0 predicts for a data-parallel group
        near = self._near_future(batch) if predicts else None
        version = self.learner.visits - 1
        self.earlier.predicted()
        self.earlier.changing(self.learner.state)  # learning the batch changes the capacity: keep it for those to come
        steps: list[tuple[np.ndarray, np.ndarray]] = []

        def predict(rows: pa.RecordBatch, logits: torch.Tensor | None) -> None:
            """A step's rows, before it learns them: from its own forward, or (a data-parallel worker's forward
            holds only its share) from one of their own."""
            steps.append(self.learner.scored(rows) if logits is None else self.learner.answers(logits))

        with self.clock.time("train"):
            losses = self.learner.train_batch(batch, after_step=self._track, before_step=predict if predicts else None)
            self.learned.add(batch.column("sample_id").to_numpy())
        if predicts:
            prediction, score = (np.concatenate(part) for part in zip(*steps, strict=True))
            self.predictions.append(prediction_table(batch, prediction, score, prediction if near is None else near,
                                                     version))
        return losses

    def _near_future(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """`batch` as the capacity of `near_future` batches back predicts it (None: that is the active one)."""
        old = self.earlier.for_next()
        if old is None:
            return None
        with self.clock.time("prequential"), self.learner.as_of(old):
            return self.learner.scored(batch)[0]

    def end_task(self, compress: bool, *test_batches: pa.RecordBatch) -> dict:
        """The visit's report: steps, recovery (returning tasks), the live adapter's accuracy on `test_batches`,
        with `compress` the accuracy of its compressed snapshot (kept for `snapshot`), and the visit's training
        batches as predicted before they were learned ("prequential", memcl_ops/prequential.py)."""
        with self.clock.time("end_task"):
            predicted, self.predictions = self.predictions, []
            out = {"steps": self.learner.steps, "recovery": self.tracker.report() if self.tracker else None,
                   "acc_live": self.learner.accuracy(test_batches), "acc_stored": None,
                   "prequential": pa.concat_tables(predicted) if predicted else PREDICTIONS.empty_table()}
            self.compressed = self.learner.snapshot() if compress else None
            if self.compressed is not None:
                out["acc_stored"] = self.learner.accuracy_with(self.compressed, self.learner.classes, test_batches)
                out["ranks"] = sorted({d.rank for d in self.compressed.deltas.values()})
                out["energy_kept"] = float(np.mean([d.energy_kept for d in self.compressed.deltas.values()]))
            return out

    def snapshot(self) -> Snapshot:
        """The active adapter as compressed by the last `end_task`."""
        if self.compressed is None:
            raise RuntimeError("end_task(compress=True) must come before snapshot")
        return self.compressed

    def head_state(self) -> dict[str, np.ndarray]:
        """The active head (a memoryless rule with task_heads keeps it under the task)."""
        return self.learner.head_state()

    def evaluate_entry(self, entry: BankEntry | TaskHead | None, classes: list[int], *batches: pa.RecordBatch) -> float:
        """Accuracy of a bank entry (or a kept head over the active adapter) on its task (None: of the active
        capacity)."""
        with self.clock.time("evaluate"):
            if entry is None:
                return self.learner.accuracy(batches, classes)
            return self.learner.accuracy_with(entry, classes, batches)

    @torch.no_grad()
    def predict_with(self, entry: BankEntry | TaskHead | None, classes: list[int], batch: pa.RecordBatch) -> np.ndarray:
        """The global class of every row of one task's batch through a bank entry (None: the active capacity);
        -1 for a head output beyond the task's classes."""
        with self.clock.time("evaluate"):
            if entry is None:
                return self.learner.scored(batch, classes)[0]
            with self.learner.holding(entry):
                return self.learner.scored(batch, classes)[0]

    def answer_routed(self, entry: BankEntry | None, task_classes: dict[int, list[int]],
                      batch: pa.RecordBatch) -> tuple[np.ndarray, int]:
        """A batch without its task id answered through the entry its key was routed to: (the global class of every
        row, the entry's task); -1 and -1 without an entry."""
        if entry is None:
            return np.full(batch.num_rows, -1, np.int64), -1
        return self.predict_with(entry, task_classes[entry.task], batch), entry.task

    def learned_counts(self) -> tuple[int, int]:
        """(rows trained on, distinct sample ids among them)."""
        return self.learned.added, len(self.learned)

    def state(self) -> dict[str, np.ndarray]:
        return {**prefixed("learner", self.learner.state()), **prefixed("learned", self.learned.state()),
                **prefixed("versions", self.earlier.state(lambda capacity: prefixed("learner", capacity)))}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.learner.restore(state_part(state, "learner"))
        self.learned.restore(state_part(state, "learned"))
        self.earlier.restore(state_part(state, "versions"), lambda arrays: state_part(arrays, "learner"))
        self.predictions = []

    def timings(self) -> dict:
        return self.clock.report()
