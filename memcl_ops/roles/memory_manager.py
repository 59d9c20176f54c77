"""The memory manager role: owns all persistent memory of a run, as named stores. It knows no kind of store: a
method's flow names the stores it needs (`StoreSpec`: how to build each, defined in the method's own package) and
calls them through `call`; the manager times every call, checkpoints every store and reports their bytes.

The stores of the registered methods: MARS's slots (memcl_ops/mars/slots.py `SlotStore`), an analytic head's merged
statistics (memcl_ops/analytic/ridge.py `StatisticsStore`), NSR's compressed LoRA bank (memcl_ops/nsr/store.py
`BankStore`) and the LM family's prototypes and demonstrations (memcl_ops/miita/store.py `TextMemoryStore`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from memcl_ops.clock import StageClock
from memcl_ops.tensors import prefixed, state_part


class Store(Protocol):
    """What the memory manager asks of a store; every other method is the store's own, reached by `call`."""

    def state(self) -> dict[str, np.ndarray]: ...  # exact: `restore` of it continues bit for bit

    def restore(self, state: dict[str, np.ndarray]) -> None: ...

    def report(self) -> dict[str, int]: ...  # its bytes, by part name (and counts such as `num_slots`)


@dataclass(frozen=True)
class StoreSpec:
    """How a store is built: `build(*args)` (a class or a module-level function, so it travels to an actor)."""

    build: Callable[..., Store]
    args: tuple[Any, ...] = ()


class MemoryManager:
    """Hosted in-process (memcl_ops/roles/executor.py) or as an actor (actors/memory_manager.py). `threads`: the
    torch threads of the hosting process (None: leave them, as an in-process host must)."""

    def __init__(self, stores: Mapping[str, StoreSpec], threads: int | None = None):
        self.reset(stores, threads)

    def reset(self, stores: Mapping[str, StoreSpec], threads: int | None = None) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.stores: dict[str, Store] = {name: spec.build(*spec.args) for name, spec in stores.items()}
        self.clock = StageClock()

    @property
    def device(self) -> torch.device:
        """Where its stores compute: the device of the first store that has one (MARS's routing), else the CPU."""
        return next((s.device for s in self.stores.values() if isinstance(getattr(s, "device", None), torch.device)),
                    torch.device("cpu"))

    def call(self, store: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` of one store, timed under the store's name."""
        with self.clock.time(store):
            return getattr(self.stores[store], method)(*args, **kwargs)

    def memory_report(self) -> dict[str, int]:
        """The one byte report of every store."""
        return {k: v for store in self.stores.values() for k, v in store.report().items()}

    def learned_counts(self) -> tuple[int, int]:
        """(rows written into the stores that learn from rows, distinct sample ids among them), for exactly-once
        accounting."""
        counts = [store.learned_counts() for store in self.stores.values() if hasattr(store, "learned_counts")]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def state(self) -> dict[str, np.ndarray]:
        return {k: v for name, store in self.stores.items() for k, v in prefixed(name, store.state()).items()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        for name, store in self.stores.items():
            store.restore(state_part(state, name))

    def timings(self) -> dict:
        return self.clock.report()
