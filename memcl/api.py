"""memcl's Python API, the functions and types `import memcl` gives (memcl/__init__.py loads this module on first
use, so a Ray worker importing `memcl.actors` does not import the driver's modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memcl.pipeline import preflight, runner
from memcl.pipeline.config import RunConfig, load_config
from memcl.pipeline.lm import LMResult, LMRunConfig
from memcl.pipeline.roles import RunResult
from memcl_ops.learners import build_learner
from memcl_ops.method_config import LMMethodConfig, MethodConfig
from memcl_ops.methods import METHODS, method_spec

__all__ = ["METHODS", "LMMethodConfig", "LMResult", "LMRunConfig", "MethodConfig", "RunConfig", "RunResult",
           "build_learner", "run", "run_in_process"]


def run(method: str = "mars-memcl", settings: dict[str, Any] | None = None, *, config: str | Path | None = None,
        seed: int = 0, progress: bool = False) -> RunResult | LMResult:
    """Run one registered method on a stream through the Ray pipeline (a local Ray is started if none runs).
    `settings`: dotted keys over the embedded default config (or over the YAML file `config`); `seed`: the run's
    seed; `progress`: draw the progress bars. The run folder is `result.run_dir` (under `runtime.out`)."""
    if method_spec(method).family == "lm":
        return runner.run(load_config(config, {**(settings or {}), "methods": [method], "seed": seed},
                                      cls=LMRunConfig), progress=progress)
    return runner.run(_run_config(method, settings, config, seed), progress=progress)


def run_in_process(method: str = "mars-memcl", settings: dict[str, Any] | None = None, *,
                   config: str | Path | None = None, seed: int = 0) -> RunResult | LMResult:
    """The same run as `run`, its roles held in this process instead of Ray actors: the same round loop, flows,
    predictions sink, late labels, dead letters and run folder (`result.matrix`: the accuracy matrix). A
    "features" method needs a stream of features (an `arrow:` folder with `data.payload=features`, `synthetic`,
    `drift`): raw images or text are encoded by the pipeline's encoder actors and feature cache, which `run`
    fills."""
    if method_spec(method).family == "lm":
        return runner.run(load_config(config, {**(settings or {}), "methods": [method], "seed": seed},
                                      cls=LMRunConfig), in_process=True)
    return runner.run(_run_config(method, settings, config, seed), in_process=True)


def _run_config(method: str, settings: dict[str, Any] | None, config: str | Path | None, seed: int) -> RunConfig:
    cfg = preflight.with_absolute_paths(load_config(config, {**(settings or {}), "method.name": method,
                                                             "seed": seed}))
    preflight.check_run(cfg)
    return cfg
