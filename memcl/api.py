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
from memcl_ops.realtime import start_clock
from memcl_ops.roles.stream_source import StreamSource
from memcl_ops.rounds import InProcessRun, Schedule, plan_rounds, stream_in_process

__all__ = ["METHODS", "InProcessRun", "LMMethodConfig", "LMResult", "LMRunConfig", "MethodConfig", "RunConfig",
           "RunResult", "build_learner", "run", "run_in_process", "stream_in_process"]


def run(method: str = "mars", settings: dict[str, Any] | None = None, *, config: str | Path | None = None,
        seed: int = 0, progress: bool = False) -> RunResult | LMResult:
    """Run one registered method on a stream through the Ray pipeline (a local Ray is started if none runs).
    `settings`: dotted keys over the embedded default config (or over the YAML file `config`); `seed`: the run's
    seed; `progress`: draw the progress bars. The run folder is `result.run_dir` (under `runtime.out`)."""
    if method_spec(method).family == "lm":
        return runner.run(load_config(config, {**(settings or {}), "methods": [method], "seed": seed},
                                      cls=LMRunConfig), progress=progress)
    return runner.run(_run_config(method, settings, config, seed), progress=progress)


def run_in_process(method: str = "mars", settings: dict[str, Any] | None = None, *,
                   config: str | Path | None = None, seed: int = 0) -> InProcessRun:
    """The same run as `run` for a "features" or "nsr" method, in this process and without Ray: the stream's rounds
    and evaluation points, its accuracy matrix (`.matrix`), the rows refused at the gate (`.refused_ids`). A
    "features" method needs a stream of features (an `arrow:` folder with `data.payload=features`, `synthetic`,
    `drift`): raw images or text are encoded by the pipeline's feature cache, which `run` fills."""
    spec = method_spec(method)
    if spec.family == "lm":
        raise ValueError(f"{method} is an LM method: drive `memcl.build_learner({method!r}, ...)` over text-pair "
                         "batches, or run it with `memcl.run`")
    cfg = _run_config(method, settings, config, seed)
    source = StreamSource(cfg.data, cfg.stream, cfg.runtime.max_batch_rows, unlabelled=spec.family == "features",
                          method=cfg.method, seed=seed)
    info = source.describe()
    if spec.family == "nsr":
        learner = build_learner(method, cfg.method, seed=seed, encoder=cfg.encoder.spec, payload=info.payload,
                                n_way=max(len(c) for c in info.task_classes),
                                near_future=cfg.runtime.prequential.near_future)
    elif info.feature_dim is None:
        raise ValueError(f"the stream {info.name!r} carries {info.payload!r}, not features: run it with `memcl.run` "
                         "(its feature cache encodes it), or stream features")
    else:
        learner = build_learner(method, cfg.method, seed=seed, feature_dim=info.feature_dim,
                                near_future=cfg.runtime.prequential.near_future)
    rt, every = cfg.runtime, cfg.method.consolidate_every
    rounds = len(plan_rounds(info, cfg.stream.task_free, every, rt.anytime))
    schedule = Schedule(cfg.stream.task_free, rounds, rt.evaluate_every, rt.evaluate_window, rt.anytime)
    realtime = cfg.stream.realtime
    clock = start_clock(realtime, spec, cfg.method) if realtime.on else None
    return stream_in_process(learner, source, schedule, every, clock, realtime)


def _run_config(method: str, settings: dict[str, Any] | None, config: str | Path | None, seed: int) -> RunConfig:
    cfg = preflight.with_absolute_paths(load_config(config, {**(settings or {}), "method.name": method,
                                                             "seed": seed}))
    preflight.check_run(cfg)
    return cfg
