"""The fast path of the features pipeline's per-batch chain (`runtime.transport: compiled`): the same actors and
the same flow (memcl_ops/roles/features.py) as the classic chain (pipeline/features.py), its calls bound once into
a Ray Compiled Graph, so a batch moves
between them through shared-memory channels instead of a task submission and an object-store round trip per hop.

One execution is one step of R batches, R = the encoder replicas (1 without encoders):

    source.train_batch x R -> [encoder_j.encode] -> memory.route -> monitor.observe -> memory.route -> ...
                                                  -> memory.expand (the last batch's expansions)

Batch j+1 is routed after the expansions of batch j, as on the classic path, so both paths give the same result.
The round's features stay with the actor that needs them: the MemoryManager's slots keep what they route (`take_block`),
and a method without a memory gets its features back at the driver, which puts them into the object store.
An actor's death shuts a compiled graph down: the runner replays the round as after any fault, and the chain is
compiled again over the revived actors (`close` then a new `CompiledChain`).

Every channel is created large enough for the largest message up front. Ray 2.60 grows a channel when a message
outgrows it, and a graph whose channel grew never finishes `teardown()`: its readers spin in `ReadAcquire` (seen
with 1.3 MB batches of 1280-d features against Ray's 1 MB default). The channels Ray creates for actor-to-actor
edges take their size from the creating process's `DAGContext`, not from `experimental_compile`'s argument, so
the size is set in every actor of the graph and in the driver before compiling.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import ray
from ray.dag import DAGContext, InputNode, MultiOutputNode
from ray.dag.context import DEFAULT_BUFFER_SIZE_BYTES

from memcl.pipeline.executors import GraphBinding
from memcl_ops.roles.features import FeatureFlow

Handle = ray.actor.ActorHandle


@dataclass(frozen=True)
class ChainActors:
    """The actors one step passes through (None: the method has no such role)."""

    source: Handle
    flow: Callable[[GraphBinding], FeatureFlow]  # the method's flow over the roles it is given
    encoders: Sequence[Handle] = ()
    memory: Handle | None = None
    monitor: Handle | None = None


def size_channels(handles: Sequence[Handle], message_bytes: int) -> int:
    """Make the channels of the next graph compiled over `handles` hold `message_bytes` (at least Ray's default);
    returns the size set. Each channel keeps one buffer of that size per execution in flight, in the object store."""
    size = max(message_bytes, DEFAULT_BUFFER_SIZE_BYTES)
    ray.get([h.__ray_call__.remote(_set_channel_bytes, size) for h in handles])
    _set_channel_bytes(None, size)
    return size


def _set_channel_bytes(actor, size: int) -> None:
    """Run in each process of a graph (in an actor via `__ray_call__`, which passes the actor instance first)."""
    DAGContext.get_current().buffer_size_bytes = size


class CompiledChain:
    """A compiled graph over `actors`; `stream` pushes one round's batches through it."""

    def __init__(self, actors: ChainActors, max_in_flight: int, timeout_s: float, message_bytes: int):
        """`max_in_flight`: batches in the chain at once, as on the classic path (rounded up to whole steps);
        `message_bytes`: a bound on the largest value one hop passes on (a batch, its features, its dead letters)."""
        self.actors, self.timeout_s = actors, timeout_s
        self.width = max(len(actors.encoders), 1)
        self.max_in_flight = -(-max_in_flight // self.width)  # in steps
        handles = [actors.source, *actors.encoders, *(h for h in (actors.memory, actors.monitor) if h is not None)]
        self.channel_bytes = size_channels(handles, message_bytes)
        self.dag = self._wire().experimental_compile(_max_inflight_executions=self.max_in_flight,
                                                     _buffer_size_bytes=self.channel_bytes)

    def _wire(self) -> MultiOutputNode:
        a = self.actors
        letters, features = [], []
        with InputNode() as step:  # step = [visit_0, index_0, visit_1, index_1, ...]
            for j in range(self.width):
                batch, refused = a.source.train_batch.bind(step[2 * j], step[2 * j + 1])
                letters.append(refused)
                if a.encoders:
                    batch, refused = a.encoders[j].encode.bind(batch)
                    letters.append(refused)
                features.append(batch)
            if a.memory is None:  # nothing per batch past the features: they come back to the driver
                return MultiOutputNode([*letters, *features])
            flow = a.flow(GraphBinding({"memory": a.memory, "monitor": a.monitor}))
            tails = [flow.route(batch, keep=True) for batch in features]
            if a.monitor is None:  # every routing is an output: a graph may not end in a node nobody reads
                return MultiOutputNode([*letters, *tails])
            return MultiOutputNode([*letters, flow.end_stream()])

    def stream(self, batches: Sequence[tuple[int, int]], on_step: Callable[[Sequence[tuple[int, int]]], None]
               ) -> tuple[list[ray.ObjectRef], list[pa.Table]]:
        """Push `batches` through, at most `max_in_flight` steps at once. Returns (the round's feature batches, as
        refs, in stream order: one block cut at its `stream_batch` column where the memory manager kept them; the
        dead-letter tables of every hop)."""
        steps = [batches[a:a + self.width] for a in range(0, len(batches), self.width)]
        pending: deque = deque()
        block: list[ray.ObjectRef] = []
        letters: list[pa.Table] = []

        def take() -> None:
            outputs = ray.get(pending.popleft(), timeout=self.timeout_s)
            letter_outputs = self.width * (2 if self.actors.encoders else 1)
            # Nothing read here may be held: a value read from a channel keeps its buffer from the writer, and the
            # graph stalls once every buffer is held. Dead letters (usually none) are copied; features are put.
            letters.extend(pa.Table.from_pylist(t.to_pylist(), schema=t.schema)
                           for t in outputs[:letter_outputs] if t.num_rows)
            if self.actors.memory is None:
                block.extend(ray.put(b) for b in outputs[letter_outputs:])
            del outputs

        for step in steps:
            flat = [x for pair in step for x in pair] + [None, None] * (self.width - len(step))
            pending.append(self.dag.execute(*flat))
            on_step(step)
            if len(pending) >= self.max_in_flight:
                take()
        while pending:
            take()
        if self.actors.memory is not None:
            block = [self.actors.memory.call.remote("slots", "take_block")]
        return block, letters

    def close(self) -> None:
        """Release the actors from the graph (they stay alive for classic calls or another graph)."""
        self.dag.teardown()
