"""The one entry point of a run, for every family: `run` starts (or resumes) one run of a "features" or "nsr" method
(`RunConfig`) or the "lm" methods of an `LMRunConfig`, each through the one round loop (pipeline/loop.py: fault
replay, commit, checkpoints, the run folder). `memcl run`, `memcl lm`, `memcl bench`, `memcl stress` and
`memcl.run` all call it."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path

import ray
import yaml

from memcl.pipeline import preflight, run_folder
from memcl.pipeline.actor_cache import ActorCache, is_fault
from memcl.pipeline.chaos import Chaos
from memcl.pipeline.config import RunConfig, dump_config, load_config
from memcl.pipeline.errors import RunInterrupted, RunStopped
from memcl.pipeline.features import FeaturePipeline
from memcl.pipeline.lm import LMResult, LMRunConfig, run_methods
from memcl.pipeline.local import LocalActors
from memcl.pipeline.loop import PhaseHook, RoundHook, discard_unstarted, new_run_dir, stream
from memcl.pipeline.nsr import NSRPipeline
from memcl.pipeline.progress import Progress
from memcl.pipeline.roles import BatchHook, RunResult, StreamPipeline, ensure_ray, stream_source
from memcl_ops.data.sources import StreamInfo
from memcl_ops.spec import MethodSpec

log = logging.getLogger("memcl")


def run(config: RunConfig | LMRunConfig | None = None, *, run_dir: Path | None = None, resume: Path | None = None,
        progress: bool | None = None, actors: ActorCache | LocalActors | None = None, in_process: bool = False,
        on_batch: BatchHook | None = None, on_round: RoundHook | None = None,
        on_phase: PhaseHook | None = None) -> RunResult | LMResult:
    """Run (or resume from its folder) one stream: a `RunConfig` (default: `memcl run`'s) runs its "features" or
    "nsr" method and returns a `RunResult`; an `LMRunConfig` runs each of its "lm" methods (and byte budgets) over
    its task stream and returns an `LMResult`, one `RunResult` per (method, budget).

    `actors`: reuse the actors of earlier runs (they are reset); by default the run starts and kills its own.
    `in_process`: hold every role in this process instead of Ray actors (the same loop and flows, no Ray).
    `on_batch` / `on_round` / `on_phase`: observers (fault injection in tests, resource sampling in `memcl stress`).
    """
    if resume is not None:
        run_dir = preflight.run_folder(resume, "config.yaml")
        config = load_config(run_dir / "config.yaml", cls=config_class(run_dir / "config.yaml"))
        # chaos mode belongs to the session that asked for it, not to the run: a resumed run streams without it
        config = replace(config, runtime=replace(config.runtime, chaos_seconds=0.0))
    if in_process:
        preflight.check_in_process(config)
    if isinstance(config, LMRunConfig):
        return run_methods(config, run_dir=run_dir, resumed=resume is not None, progress=progress,
                           actors=actors or (LocalActors() if in_process else None), on_batch=on_batch,
                           on_phase=on_phase)
    config = preflight.with_absolute_paths(config or RunConfig())
    spec = preflight.check_run(config)  # before Ray starts: a bad config fails in a second, with one line
    own, given_dir = actors is None, run_dir
    actors = actors or (LocalActors() if in_process else ActorCache())
    lock = None
    try:
        if run_dir is not None and run_dir.is_dir():  # a folder given (a resume): refused before Ray if in use
            lock = run_folder.RunLock(run_dir)
        started = time.perf_counter()
        if not actors.local:
            ensure_ray(config)
            preflight.check_gpus(preflight.reserved_gpus(config, spec), ray.cluster_resources().get("GPU", 0),
                                 "the cluster has", preflight.RUN_COPIES)
        stream_source(config, actors)
        info: StreamInfo = actors.call("source", "describe")
        warn_unnamed_labels(info)
        free = "-taskfree" if config.stream.task_free else ""
        run_dir = run_dir or new_run_dir(config.runtime.out, f"{spec.name}-{info.name}{free}-s{config.seed}")
        if not run_dir.is_dir():
            run_folder.create(run_dir)
        lock = lock or run_folder.RunLock(run_dir)  # held while this process runs it (`memcl runs clean` leaves it)
        if resume is None:
            dump_config(config, run_dir / "config.yaml")
        bars = Progress(enabled=config.runtime.progress if progress is None else progress)
        try:
            t0 = time.perf_counter()
            pipe = set_up(config, spec, info, actors, bars, run_dir)
            encoding = getattr(pipe, "encoding_seconds", 0.0)
            metrics = {"method": config.method.name, "seed": config.seed, "class_names": info.extra.get("class_names")}
            try:
                return stream(pipe, run_dir, resume is not None, config.runtime, bars, metrics, started=started,
                              setup_wall={"setup": time.perf_counter() - t0 - encoding, "encoding": encoding},
                              on_batch=on_batch, on_round=on_round, on_phase=on_phase)
            finally:
                pipe.close()
        except KeyboardInterrupt:
            raise RunInterrupted(run_dir) from None
        except RunStopped as stop:
            if stop.run_dir is None and resume is None and given_dir is None:
                discard_unstarted(run_dir)  # stopped in set-up: nothing to resume
            raise  # its checkpoint is what --resume continues from
        except Exception:
            if resume is None and given_dir is None:
                discard_unstarted(run_dir)
            raise
    finally:
        if lock is not None:
            lock.release()
        if own:
            actors.close()


def set_up(config: RunConfig, spec: MethodSpec, info: StreamInfo, actors: ActorCache | LocalActors, bars: Progress,
           run_dir: Path) -> StreamPipeline:
    """The run's pipeline: its roles started and the feature cache filled. An actor fault replays set-up from its
    start, as the loop replays a round (a dead actor starts anew; the cache keeps what was encoded, so only the rest
    is encoded again), with the same budget of `runtime.max_recoveries` faults in a row; chaos mode kills actors here
    too. Past the budget: RunStopped without a folder to resume (`run_dir` None), saying to run the command again."""
    rt = config.runtime
    chaos = (Chaos(actors, lambda: list(actors.handles), rt.chaos_seconds, config.seed)
             if rt.chaos_seconds and not actors.local else contextlib.nullcontext())
    faults = 0
    with chaos:
        while True:
            try:
                if faults:
                    stream_source(config, actors)
                    info = actors.call("source", "describe")
                if spec.family == "nsr":
                    return NSRPipeline(config, info, actors)
                return FeaturePipeline(config, spec, info, actors, bars)
            except Exception as err:
                if actors.local or not is_fault(err):
                    raise
                faults += 1
                role = actors.role_of(err)
                where = f"the {role} actor" if role else "an actor"
                if faults > rt.max_recoveries:
                    raise RunStopped(f"setting up the run (its actors, the feature cache's encoding): {faults} actor "
                                     f"faults in a row (runtime.max_recoveries = {rt.max_recoveries}), the last in "
                                     f"{where} ({type(err).__name__})", None,
                                     next_step="run the same command again" + (
                                         ": the feature cache keeps what was encoded" if rt.cache_dir else "")) from err
                log.warning("actor fault setting up the run (%s, %s); starting set-up again", where,
                            type(err).__name__)


def warn_unnamed_labels(info: StreamInfo) -> None:
    """Labels beyond the class names the data gives (classes.txt, schema metadata) are learned under their number:
    say so once, since a typo in a label column looks just like that."""
    names = info.extra.get("class_names")
    unnamed = sorted({c for classes in info.task_classes for c in classes if c >= len(names)}) if names else []
    if unnamed:
        log.warning("data: labels %s have no class name (%d names given, for labels 0..%d); they are learned as "
                    "classes named by their number (data.labels lists the labels to accept)",
                    ", ".join(map(str, unnamed)), len(names), len(names) - 1)


def config_class(path: Path) -> type:
    """The config class a run folder's config.yaml was written from: an `LMRunConfig` names its methods."""
    data = yaml.safe_load(path.read_text()) or {}
    return LMRunConfig if isinstance(data, dict) and "methods" in data else RunConfig
