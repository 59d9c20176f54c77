"""memcl's Python API: every registered method (`memcl.METHODS`), run with one call.

* `memcl.run(method, settings)`: one run through the Ray pipeline (what `memcl run` / `memcl lm` do), its folder
  written as theirs are; returns a `RunResult` (an `LMResult` for an "lm" method, one run per byte budget).
* `memcl.run_in_process(method, settings)`: the same run with its roles held in this process, without Ray (the same
  round loop and flows: its results equal the pipeline's, tests/integration/test_parity.py); returns a `RunResult`
  (or an `LMResult`).
* `memcl.build_learner(method, ...)`: a `StreamLearner` to drive yourself: `begin_round`, `observe` Arrow batches,
  `consolidate`, `predict`.

`settings` are the dotted keys `memcl run --set` takes (`memcl config --show` lists them), e.g.
{"data.dataset": "arrow:mydata", "data.payload": "features", "data.feature_dim": 16}.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["METHODS", "LMMethodConfig", "LMResult", "LMRunConfig", "MethodConfig", "RunConfig", "RunResult",
           "build_learner", "run", "run_in_process"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("memcl.api"), name)
    raise AttributeError(f"module 'memcl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
