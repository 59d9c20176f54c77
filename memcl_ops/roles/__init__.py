"""The roles of a run (docs/architecture.md), each a plain object with no Ray in it: the memory manager (every store
of persistent memory), the novelty monitor, and the two DCDA trainers. One definition of each; the in-process
learner holds them directly and the pipeline hosts each in an actor (actors/), and the method's flow
(memcl_ops/roles/features.py) calls them the same way through an executor (memcl_ops/roles/executor.py).
A worker imports this package when it loads a role hosted as an actor, before the role's `__init__` runs."""

import numpy as np
import pyarrow as pa

# pyarrow imports pandas, when it is installed, the first time it converts a numpy array: every
# host process pays that as it starts, in a run's setup, instead of inside the first batch it handles.
pa.array(np.zeros(1))
