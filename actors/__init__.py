"""The pipeline's Ray actors (docs/architecture.md). A worker imports this package when it loads an actor class
from it, before the actor's `__init__` runs (the driver imports it too)."""

import numpy as np
import pyarrow as pa

# pyarrow imports pandas, when it is installed, the first time it converts a numpy array: every
# actor process pays that as it starts, in a run's setup, instead of inside the first batch it handles.
pa.array(np.zeros(1))
