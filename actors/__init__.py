"""The pipeline's Ray actors (docs/architecture.md). A worker imports this package when it loads an actor class
from it, before the actor's `__init__` runs (the driver imports it too)."""

import numpy as np
import pyarrow as pa

# pyarrow imports pandas, when it is installed, the first time it converts a numpy array: every
# actor process pays that as it starts, in a run's setup, instead of inside the first batch it handles.
pa.array(np.zeros(1))

_HOSTED: dict[object, type] = {}  # each actor class -> the role class it hosts


def hosting(role_class: type, actor_class: object | None = None) -> object:
    """`actor_class` (default: `role_class` as a plain Ray actor) recorded as the actor that hosts `role_class`,
    so that a run held in this process (memcl.pipeline.local) builds the role itself where a run names its actor."""
    import ray

    actor = actor_class if actor_class is not None else ray.remote(role_class)
    _HOSTED[actor] = role_class
    return actor


def role_class(actor_class: object) -> type:
    """The role class an actor class hosts (see `hosting`)."""
    try:
        return _HOSTED[actor_class]
    except KeyError:
        raise ValueError(f"{actor_class} hosts no role a run can hold in this process") from None
