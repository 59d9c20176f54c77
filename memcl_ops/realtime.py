"""The stream's clock (`stream.realtime`): when each batch arrives and when the consolidation running in the
background is published. Every batch is predicted and learned by the method's per-batch step as it arrives; what
the clock decides is which model version predicts it.

* "off" (the default): the stream waits for its learner. A consolidation starts when a round ends and is published
  before the next batch arrives.
* "simulated": the stream does not wait, on an event clock whose unit is one pass over a batch. Batch p arrives at
  p / rate. A consolidation starts when a round has ended and the trainers are free, takes the newest ended round's
  rows (the rounds the trainers missed wait in the buffer; after the stream they are consolidated oldest first),
  and keeps the trainers busy for its cost: `cost` passes per batch of rows it consolidates (the method's declared
  cost, memcl_ops/costs.py, unless `stream.realtime.cost` sets one). It is published at its start plus its cost, so
  the batches that arrive meanwhile are predicted by the version before it (Ghunaim et al., "Real-Time Evaluation
  in Online Continual Learning: A New Hope", CVPR 2023, with the learning moved to the background). The result
  depends on neither the machine nor its load.
* "wall": the stream does not wait and a consolidation is published as soon as the trainers have finished it,
  checked before each batch (machine-dependent; a replayed round may publish at other batches).

`StreamClock` is plain JSON state: the run state checkpoints it, with the consolidation in flight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RealtimeConfig:
    mode: Literal["off", "simulated", "wall"] = "off"
    rate: float = 1.0  # simulated: batches the stream delivers per pass over a batch
    cost: float | None = None  # simulated: passes per consolidated batch of rows (None: the method's declared cost)

    def __post_init__(self) -> None:
        if self.mode not in ("off", "simulated", "wall"):
            raise ValueError(f"realtime mode {self.mode!r}: one of off, simulated, wall")
        if self.rate <= 0 or (self.cost is not None and self.cost < 0):
            raise ValueError(f"realtime rate {self.rate} must be > 0 and cost {self.cost} >= 0")

    @property
    def on(self) -> bool:
        return self.mode != "off"


@dataclass
class StreamClock:
    """Where the trainers stand against the stream, in the stream's time (simulated: passes; "off" and "wall":
    batches delivered)."""

    mode: str = "off"
    rate: float = 1.0
    cost: float = 0.0  # trainer time per `batch_rows` rows consolidated
    batch_rows: int = 1
    free_at: float = 0.0  # when the trainers finished the last published consolidation
    job: dict | None = None  # the consolidation in flight: {"started", "publish_at" (None: when done), "rows"}
    published: int = 0  # consolidations published
    due: int = 0  # rounds ended since the last consolidation started: a consolidation is due while above 0
    busy: float = 0.0  # trainer time of the consolidations published

    @classmethod
    def start(cls, config: RealtimeConfig, cost: float, batch_rows: int) -> StreamClock:
        """`cost`: the method's declared passes per consolidated batch (`config.cost` wins when set)."""
        cost = config.cost if config.cost is not None else cost
        return cls(config.mode, config.rate if config.mode == "simulated" else 1.0,
                   cost if config.mode == "simulated" else 0.0, batch_rows)

    @property
    def waits(self) -> bool:
        return self.mode == "off"

    def arrival(self, position: float) -> float:
        """When the stream's batch at `position` arrives."""
        return float(position) / self.rate

    def begin(self, now: float, rows: int) -> None:
        """A consolidation of `rows` rows starts once the trainers are free (they are at `now` or later)."""
        started = max(self.free_at, now)
        duration = self.cost * rows / self.batch_rows
        self.job = {"started": started, "rows": rows,
                    "publish_at": None if self.mode == "wall" else started + duration}
        self.due = 0

    def publishes_by(self, now: float) -> bool:
        """Whether the consolidation in flight is published by `now` (never for "wall": its end is measured)."""
        return self.job is not None and self.job["publish_at"] is not None and self.job["publish_at"] <= now

    def end(self, now: float) -> None:
        """The consolidation in flight is published (at `now` when its end was not known ahead: "wall")."""
        end = self.job["publish_at"] if self.job["publish_at"] is not None else max(now, self.job["started"])
        self.busy += end - self.job["started"]
        self.free_at, self.job = end, None
        self.published += 1
