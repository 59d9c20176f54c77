"""A stream that does not wait for its learner (`stream.realtime`; Ghunaim et al., "Real-Time Evaluation in Online
Continual Learning: A New Hope", CVPR 2023).

The stream delivers `rate` batches per unit of the learner's time; learning one batch occupies the learner for
`cost` units. A batch that arrives while the learner is still busy is **skipped**: predicted by the last
consolidated model (test-then-train) and never learned. So a method twice as slow learns half of a stream that
only one of them keeps up with. Two clocks:

* "simulated" (deterministic, the default when on): the unit is one pass over a batch's features, and a method's
  cost is what it declares (`declared_cost`: its training passes per batch), or `stream.realtime.cost`;
* "wall": the unit is a second, and the cost of a learned batch is measured: the learner's wall time over the
  last round (streaming, stage 1, stage 2) per batch it learned. Each round's admissions are decided from the
  rounds committed before it and kept in the run state, so a replayed or resumed round admits the same batches.

`StreamClock` is the plain state both the runner and `stream_in_process` fold rounds into."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the stream's config (memcl_ops/data/streams.py) holds RealtimeConfig: no method imports here
    from memcl_ops.method_config import MethodConfig
    from memcl_ops.spec import MethodSpec


@dataclass(frozen=True)
class RealtimeConfig:
    mode: Literal["off", "simulated", "wall"] = "off"
    rate: float = 1.0  # batches the stream delivers per unit: per pass over a batch (simulated), per second (wall)
    cost: float | None = None  # simulated: passes per learned batch (None: the method's declared cost)

    def __post_init__(self) -> None:
        if self.mode not in ("off", "simulated", "wall"):
            raise ValueError(f"realtime mode {self.mode!r}: one of off, simulated, wall")
        if self.rate <= 0 or (self.cost is not None and self.cost < 0):
            raise ValueError(f"realtime rate {self.rate} must be > 0 and cost {self.cost} >= 0")

    @property
    def on(self) -> bool:
        return self.mode != "off"


def declared_cost(spec: MethodSpec, method: MethodConfig) -> float:
    """Passes over a batch's features that learning it takes: each training epoch of DCDA stage 1 and of a trained
    head is one (DER++'s replayed minibatch doubles its epochs); a head of sums (the analytic heads, SLDA, the
    nearest means, the blind baseline) makes one."""
    method = spec.resolve(method)
    passes = float(method.stage1.optim.epochs) if spec.stage1 else 0.0
    if spec.head in ("distill", "ewc", "joint"):
        passes += method.stage2.optim.epochs
    elif spec.head == "derpp":
        passes += 2 * method.stage2.optim.epochs
    else:
        passes += 1.0
    return passes


@dataclass
class StreamClock:
    """Where the learner stands against the stream (JSON-able; the run state keeps it)."""

    cost: float = 0.0  # the learner's time per batch it learns (wall: measured so far; 0 before any)
    busy_until: float = 0.0  # when the learner is free again, in the stream's time
    learned_batches: int = 0
    skipped_batches: int = 0

    def admit(self, position: int, rate: float) -> bool:
        """Whether the batch at `position` (0-based, in the whole stream) is learned; it arrives at position / rate."""
        arrival = position / rate
        if arrival >= self.busy_until:
            self.busy_until = arrival + self.cost
            self.learned_batches += 1
            return True
        self.skipped_batches += 1
        return False

    def measured(self, learner_seconds: float, learned: int) -> None:
        """Wall mode: the cost of the rounds to come is the last round's learner seconds per batch it learned."""
        if learned:
            self.cost = learner_seconds / learned


def start_clock(config: RealtimeConfig, spec: MethodSpec, method: MethodConfig) -> StreamClock:
    cost = config.cost if config.cost is not None else declared_cost(spec, method)
    return StreamClock(cost=cost if config.mode == "simulated" else 0.0)
