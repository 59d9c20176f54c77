"""Checks of a run's config that need neither Ray nor data loaded, so `memcl` refuses a bad run in a second with
one line (the key, what is wrong, what is accepted) instead of failing inside an actor after Ray has started."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from memcl.pipeline.config import ConfigError, RunConfig, RuntimeConfig
from memcl_ops.data.datasets import DATASETS, DatasetUnavailable
from memcl_ops.data.sources import check_source
from memcl_ops.data.streams import task_classes
from memcl_ops.methods import METHODS
from memcl_ops.models.encoders import ENCODER_NAMES, has_lora_sites, is_encoder_name
from memcl_ops.spec import MethodSpec


def method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ConfigError(f"method.name: unknown method {name!r}; accepted: {', '.join(METHODS)} "
                          "(`memcl list methods` describes them)")
    return METHODS[name]


def check_run(config: RunConfig) -> MethodSpec:
    """The method's spec if `config` can run; else ConfigError."""
    spec = method(config.method.name)
    if spec.family == "lm":
        raise ConfigError(f"method.name: {spec.name} answers text prompts with a causal LM; run it with `memcl lm "
                          f"--methods {spec.name}` (memcl run takes: "
                          + ", ".join(n for n, s in METHODS.items() if s.family != "lm") + ")")
    if config.stream.task_free and not spec.task_free:
        raise ConfigError(f"stream.task_free: method {spec.name} needs task boundaries; accepted with task_free: "
                          + ", ".join(n for n, s in METHODS.items() if s.task_free))
    if not is_encoder_name(config.encoder.spec.name):
        raise ConfigError(f"encoder.spec.name: unknown encoder {config.encoder.spec.name!r}; accepted: "
                          + ", ".join(ENCODER_NAMES))
    if config.stream.follow:
        _check_follow(spec, config)
    elif config.stream.idle_timeout_s is not None:
        raise ConfigError("stream.idle_timeout_s: it ends a followed folder's stream; set stream.follow=true (with "
                          "data.dataset=arrow:FOLDER), or leave it null")
    try:
        check_source(config.data, config.stream)
    except (ValueError, DatasetUnavailable) as err:
        raise ConfigError(str(err)) from err
    if config.runtime.data_parallel > 1 and spec.family != "nsr":
        raise ConfigError(f"runtime.data_parallel: {spec.name} has no trainer that learns data-parallel (NSR's "
                          "adapter trainer does: " + ", ".join(n for n, s in METHODS.items() if s.family == "nsr")
                          + "; and `memcl lm`'s LoRA trainer); leave it at 1")
    if config.stream.realtime.on and spec.family != "features":
        raise ConfigError(f"stream.realtime: {spec.name} learns every batch as it trains; a stream that goes on while "
                          "trainers consolidate in the background is run for the features methods (`memcl list "
                          "methods`); set stream.realtime.mode=off")
    if config.stream.realtime.on and config.runtime.transport == "compiled":
        raise ConfigError("stream.realtime: the compiled chain streams a round at once; a stream that publishes "
                          "consolidations between its batches runs over actor calls: set runtime.transport=actors")
    if config.runtime.anytime and (config.stream.task_free or spec.family != "features"):
        raise ConfigError("runtime.anytime: evaluations inside each visit cut the visits of a features method's "
                          "stream with task boundaries; a task-free run evaluates every runtime.evaluate_every rounds")
    if spec.family == "nsr":
        _check_nsr(spec, config)
    if not joins_a_cluster(config.runtime):  # Ray will start here, with this machine's GPUs
        check_gpus(reserved_gpus(config, spec), local_gpus(), "this machine has", RUN_COPIES)
    return spec


# the roles whose actors a run of each family starts (the encoder pool apart)
FAMILY_ROLES = {"features": ("source", "memory", "monitor", "stage1", "stage2"),
                "nsr": ("source", "adapter_trainer", "memory"),
                "lm": ("lm_encoder", "lm_trainer", "memory")}


def _check_follow(spec: MethodSpec, config: RunConfig) -> None:
    """What following a folder needs: an `arrow:` folder, a features method, and rounds that need not know the
    stream's size (no anytime cuts of a visit, no simulated clock, no channels sized by the largest batch)."""
    rt = config.runtime
    if not config.data.dataset.startswith("arrow:"):
        raise ConfigError(f"stream.follow: {config.data.dataset} is no folder that grows; follow takes the files "
                          "renamed into an arrow:<folder> stream's train/ (--set data.dataset=arrow:FOLDER)")
    if spec.family != "features":
        raise ConfigError(f"stream.follow: {spec.name} plans its stream whole at its start; a followed folder is "
                          "streamed by the features methods (`memcl list methods`)")
    if rt.anytime:
        raise ConfigError("runtime.anytime: it cuts each visit into equal rounds, and a followed folder's visit grows "
                          "until the next one begins; leave runtime.anytime=0 with stream.follow")
    if config.stream.realtime.on:
        raise ConfigError("stream.realtime: a followed folder's batches arrive when their files land; set "
                          "stream.realtime.mode=off with stream.follow")
    if rt.transport == "compiled":
        raise ConfigError("runtime.transport=compiled: its channels are sized by the stream's largest batch, unknown "
                          "while the folder grows; set runtime.transport=actors with stream.follow")


def check_in_process(config: RunConfig) -> None:
    """What a run held in this process cannot do: what only Ray's processes give."""
    rt = config.runtime
    if rt.data_parallel > 1:
        raise ConfigError("runtime.data_parallel: workers learning data-parallel are Ray actors; a run in this process "
                          "has one: leave it at 1, or run it with `memcl run`")
    if rt.chaos_seconds:
        raise ConfigError("runtime.chaos_seconds: chaos kills Ray actors; a run in this process has none")
    if rt.transport == "compiled":
        raise ConfigError("runtime.transport=compiled: a Ray Compiled Graph runs over actors; a run in this process "
                          "calls its roles directly: leave runtime.transport=actors")


def placed_gpus(rt: RuntimeConfig, family: str, copies: Mapping[str, int] = MappingProxyType({}),
                defaults: Mapping[str, float] = MappingProxyType({})) -> dict[str, tuple[float, int]]:
    """Per role of `family` that reserves GPUs, (GPUs per actor, actors): its placement's, else its default's."""
    out = {}
    for role in FAMILY_ROLES[family]:
        own = rt.placement[role].num_gpus if role in rt.placement else None
        own = defaults.get(role) if own is None else own
        if own:
            out[role] = (own, copies.get(role, 1))
    return out


def reserved_gpus(config: RunConfig, spec: MethodSpec) -> dict[str, tuple[float, int]]:
    """The GPUs the run's actors reserve where the config asks for them ("auto" takes only what the cluster has, so
    never more): per role, (GPUs per actor, actors)."""
    rt, enc = config.runtime, config.encoder
    explicit = enc.num_gpus if enc.num_gpus != "auto" else 0.0
    # by default NSR's workers reserve what an encoder replica would
    out = placed_gpus(rt, spec.family, {"adapter_trainer": rt.data_parallel}, {"adapter_trainer": explicit})
    if spec.family == "features" and explicit:
        out["encoder"] = (explicit, enc.replicas)
    return out


def lm_reserved_gpus(rt: RuntimeConfig, tags: set[str]) -> dict[str, tuple[float, int]]:
    """`reserved_gpus` of a `memcl lm` run whose methods carry `tags` (all of them together): its LM replicas, and
    the LoRA trainer and the memory manager where a method starts them."""
    asked = placed_gpus(rt, "lm", {"lm_encoder": rt.lm_replicas, "lm_trainer": rt.data_parallel})
    if "trains-backbone" not in tags:
        asked.pop("lm_trainer", None)
    if not tags & {"direction-memory", "demonstrations"}:
        asked.pop("memory", None)
    return asked


def check_gpus(asked: dict[str, tuple[float, int]], available: float, where: str, knobs: str) -> None:
    """ConfigError when the run's actors reserve (`asked`, per role) more GPUs than `available`: Ray would wait for
    them forever. `knobs`: the settings that set how many actors a role starts."""
    total = sum(gpus * copies for gpus, copies in asked.values())
    if total > available:
        detail = ", ".join(f"{role} {gpus:g}" + (f" x {copies} actors" if copies > 1 else "")
                           for role, (gpus, copies) in asked.items())
        raise ConfigError(f"runtime.placement: the run's actors reserve {total:g} GPUs ({detail}) and {where} "
                          f"{available:g}; lower {knobs} or the placements' num_gpus, or join a cluster that has "
                          "them (runtime.address)")


RUN_COPIES = "runtime.data_parallel, encoder.replicas"  # what `check_gpus` suggests to `memcl run`
LM_COPIES = "runtime.lm_replicas, runtime.data_parallel"  # and to `memcl lm`


def joins_a_cluster(rt: RuntimeConfig) -> bool:
    """Whether Ray will be joined rather than started here (then only the cluster can say what GPUs it has)."""
    return bool(rt.address or os.environ.get("RAY_ADDRESS"))


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


NSR_EXAMPLE = "`memcl run --config pipeline/configs/nsr-bbc-cyclic.yaml` runs NSR on BBC News with MiniLM"


def _check_nsr(spec: MethodSpec, config: RunConfig) -> None:
    """NSR trains LoRA inside the encoder on raw rows, with a task-local head of two classes or more."""
    if config.stream.task_free:
        return  # refused above: NSR needs task boundaries
    encoder = config.encoder.spec.name
    if not has_lora_sites(encoder):
        raise ConfigError(f"encoder.spec.name: {spec.name} trains LoRA inside the encoder's linear and attention "
                          f"layers, and {encoder} has none; use minilm (text), open_clip:<ViT> (images) or "
                          f"hf:<folder>; {NSR_EXAMPLE}")
    dataset = config.data.dataset
    payload = payload_of(config)
    if payload not in ("text", "image"):
        raise ConfigError(f"data.dataset: {spec.name} trains LoRA inside the encoder, so it needs raw text or image "
                          f"rows; {dataset} carries {payload}; {NSR_EXAMPLE}")
    if dataset in DATASETS:
        tasks = task_classes(DATASETS[dataset].num_classes, config.stream)
        if min(len(t) for t in tasks) < 2:
            raise ConfigError(f"stream.tasks: {spec.name} learns each task with its own head of two classes or more, "
                              f"and {dataset} split into {len(tasks)} tasks gives a task of "
                              f"{min(len(t) for t in tasks)}; set fewer tasks or stream.task_classes; {NSR_EXAMPLE}")


def payload_of(config: RunConfig) -> str:
    """What the stream's rows carry, known from the config: "features" (no encoder needed), "text" or "image"."""
    dataset = config.data.dataset
    return (DATASETS[dataset].payload if dataset in DATASETS else config.data.synthetic.payload
            if dataset == "synthetic" else "features" if dataset == "drift"
            else "image" if dataset.startswith("image-folder:") else config.data.payload)


def with_absolute_paths(config: RunConfig) -> RunConfig:
    """`config` with the folder of an `arrow:` or `image-folder:` source made absolute: actors (and a resumed run)
    may not share the working directory the path was given in."""
    kind, sep, path = config.data.dataset.partition(":")
    if not sep or kind not in ("arrow", "image-folder"):
        return config
    data = dataclasses.replace(config.data, dataset=f"{kind}:{Path(path).expanduser().resolve()}")
    return dataclasses.replace(config, data=data)


def run_folder(path: str | Path, needs: str) -> Path:
    """A run folder given on the command line (`--resume`, `memcl report`) that holds `needs`."""
    folder = Path(path)
    if not (folder / needs).is_file():
        what = "no such folder" if not folder.exists() else f"no {needs} in it"
        raise ConfigError(f"{path}: {what}; expected a run folder written by `memcl run` or `memcl lm` "
                          "(runs/<time>-...)")
    return folder
