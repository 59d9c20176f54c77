"""Typed run configuration: YAML mapped onto dataclasses. Every default lives here or in the memcl_ops
config it nests, once; a YAML file only overrides."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import io
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from memcl_ops import files
from memcl_ops.data.sources import SourceSpec
from memcl_ops.data.streams import StreamSpec
from memcl_ops.method_config import MethodConfig
from memcl_ops.models.encoders import EncoderSpec
from memcl_ops.prequential import PrequentialConfig


class ConfigError(ValueError):
    """A config file or value that does not fit the schema; the message names the key."""


@dataclass(frozen=True)
class EncoderPoolConfig:
    spec: EncoderSpec = EncoderSpec()
    replicas: int = 1  # encoder actors; batches go round-robin
    num_cpus: float = 1.0  # Ray CPUs reserved per replica
    num_gpus: float | Literal["auto"] = "auto"  # "auto": 1 per replica when the cluster has GPUs, else 0
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per replica (placement)
    placement: Literal["default", "spread"] = "default"  # "spread": one replica per node where possible
    max_in_flight: int = 2  # calls queued per replica before the driver waits (backpressure)
    threads: int = 2  # torch threads in each replica (Ray sets OMP_NUM_THREADS=1 in actors)


# The roles whose actors `runtime.placement` places (the encoders are placed by the `encoder` section)
ROLES = ("source", "memory", "monitor", "stage1", "stage2", "predictor", "adapter_trainer", "lm_encoder", "lm_trainer")


@dataclass(frozen=True)
class Placement:
    """What one role's actor reserves from Ray, so where it runs: a role given a GPU (or a share of one) computes on
    it; custom resources pin it to the nodes that offer them. A value left out (None) keeps the role's default."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict[str, float] | None = None

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"runtime.placement: {name} {value} is below 0")
        if self.num_gpus is not None and self.num_gpus > 1 and self.num_gpus != int(self.num_gpus):
            raise ConfigError(f"runtime.placement: num_gpus {self.num_gpus}: a share (at most 1) or whole GPUs")

    def options(self, default: Placement | None = None) -> dict[str, Any]:
        """Ray's options: this placement's values over `default`'s, and nothing reserved where neither gives one."""
        base = default or Placement()
        pick = lambda name: getattr(self, name) if getattr(self, name) is not None else getattr(base, name)  # noqa: E731
        return {"num_cpus": pick("num_cpus") or 0.0, "num_gpus": pick("num_gpus") or 0.0,
                "resources": dict(pick("resources") or {})}


@dataclass(frozen=True)
class RuntimeConfig:
    """How every run executes, whatever its family (`memcl run`'s and `memcl lm`'s `runtime` section); `transport`,
    `compiled_timeout_s`, `cache_dir` and `max_batch_rows` concern the streams of frozen features and raw rows only."""

    address: str | None = None  # None: start Ray in-process; "auto": join a running cluster
    num_cpus: int | None = None  # for an in-process Ray; None: all cores
    object_store_mb: int = 512  # an in-process Ray's object store
    max_in_flight: int = 4  # batches in the pipeline at once (backpressure)
    # How a training batch moves along the features chain: one actor call per hop ("actors"), or a Ray Compiled
    # Graph over the same actors ("compiled": shared-memory channels, pipeline/compiled_chain.py; each channel
    # holds max_in_flight buffers of twice the stream's largest batch in the object store)
    transport: Literal["actors", "compiled"] = "actors"
    compiled_timeout_s: float = 300.0  # the longest wait for one compiled step before it counts as hung
    actor_threads: int = 2  # torch threads in the learner actors (and the LM actors)
    cache_dir: str = ".memcl_cache"  # Parquet feature cache; "" disables it (encode in-line)
    out: str = "runs"  # where run folders are made
    checkpoint: bool = True  # checkpoint every actor after each round (what --resume and fault replay read)
    progress: bool = True  # progress bars on stderr
    tensorboard: bool = False  # write TensorBoard event files into <run folder>/tensorboard/ (`tensorboard --logdir`)
    max_batch_rows: int | None = 4096  # larger batches are refused at the gate (dead letters)
    max_restarts: int = 2  # Ray restarts of a crashed actor (its state is then restored by the runner)
    max_recoveries: int = 5  # faults in a row of one step (a round, its commit, a report) before the run gives up
    # chaos mode: kill a random actor of the run every this many seconds while it streams (0: off)
    chaos_seconds: float = 0.0
    # evaluate after every N-th visit (task-free: every N-th consolidation round), and always after the last
    evaluate_every: int = 1
    # evaluate only the N most recently first-trained tasks (None: all seen); after the last round, all seen
    evaluate_window: int | None = None
    # test-then-train: every training batch is predicted before it is learned (docs/methods.md, "Prequential
    # accuracy"); its sliding window in rows and the k of near-future accuracy
    prequential: PrequentialConfig = PrequentialConfig()
    # anytime evaluation (needs task boundaries): each visit cut into this many rounds, every task (seen or not)
    # evaluated after each; 0: off (docs/methods.md, "Anytime accuracy")
    anytime: int = 0
    # per role (ROLES), what its actor reserves; a role not named keeps its default: nothing reserved for the
    # learner actors (they mostly wait on the encoders), a CPU for the LM's actor, the encoders' share for NSR's trainer
    placement: dict[str, Placement] = field(default_factory=dict)
    # workers of NSR's adapter trainer (`memcl run`) and of the LoRA trainer (`memcl lm`), learning as one (PyTorch
    # DDP: each takes its share of every step's rows)
    data_parallel: int = 1
    # copies of the frozen LM in `memcl lm`, extracting and answering side by side (placed as lm_encoder)
    lm_replicas: int = 1

    def __post_init__(self) -> None:
        if self.data_parallel < 1:
            raise ConfigError(f"runtime.data_parallel: {self.data_parallel} workers; 1 or more")
        if self.lm_replicas < 1:
            raise ConfigError(f"runtime.lm_replicas: {self.lm_replicas} copies of the LM; 1 or more")
        if self.anytime < 0:
            raise ConfigError(f"runtime.anytime: {self.anytime} evaluations per visit; 0 (off) or more")
        if self.chaos_seconds < 0:
            raise ConfigError(f"runtime.chaos_seconds: {self.chaos_seconds} is below 0 (0 turns chaos mode off)")
        unknown = sorted(set(self.placement) - set(ROLES))
        if unknown:
            raise ConfigError(f"runtime.placement: no role {unknown}; the roles are {list(ROLES)} "
                              "(encoder replicas are placed by the encoder section)")

    def actor_options(self, role: str, default: Placement = Placement()) -> dict[str, Any]:
        """Ray options of `role`'s actor: its placement over the role's `default`, and the restarts of every actor."""
        return {**self.placement.get(role, Placement()).options(default), "max_restarts": self.max_restarts}

    def device(self, role: str) -> str:
        """Where `role` computes: "auto" (the GPU Ray assigned it) when its placement asks for a GPU, else the CPU
        (Ray does not hide the GPUs from an actor that reserved none, so "auto" there would take one unasked)."""
        return "auto" if (self.placement.get(role, Placement()).num_gpus or 0) > 0 else "cpu"


@dataclass(frozen=True)
class RunConfig:
    """The embedded default is `memcl run` with no config: MARS on Fashion-MNIST (5 tasks x 2 classes),
    EfficientNet-Lite0 features at 64 px, 1200 train / 300 test images per class."""

    seed: int = 0  # seeds every learner and every sampled stream
    data: SourceSpec = SourceSpec()
    stream: StreamSpec = StreamSpec(tasks=5, train_per_class=1200, test_per_class=300)
    encoder: EncoderPoolConfig = EncoderPoolConfig()
    method: MethodConfig = MethodConfig()
    runtime: RuntimeConfig = RuntimeConfig()


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{where}: {value!r} fits none of {tp}")
    if origin is Literal:
        if isinstance(value, bool) and ("off" if value is False else "on") in typing.get_args(tp):
            value = "off" if value is False else "on"  # YAML 1.1 reads off / on as booleans
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        key_type, value_type = typing.get_args(tp)
        return {_convert(key_type, k, f"{where}.{k}"): _convert(value_type, v, f"{where}.{k}")
                for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = typing.get_args(tp)[0]
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported config type {tp}")


def from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Build dataclass `cls` from a nested dict, refusing unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        section = where.removeprefix("config").lstrip(".")
        near = [m[0] for k in sorted(unknown) if (m := difflib.get_close_matches(k, known, n=1))]
        hint = "".join(f" (did you mean {'.'.join(filter(None, (section, m)))}?)" for m in near)
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}{hint}; known: {sorted(known)}")
    default = cls()
    values = {}
    for name, value in data.items():
        if is_dataclass(hints[name]) and isinstance(value, dict):
            # nested sections override their defaults key by key
            base = dataclasses.asdict(getattr(default, name))
            value = {**base, **value}
        values[name] = _convert(hints[name], value, f"{where}.{name}")
    try:
        return dataclasses.replace(default, **values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def to_dict(config: Any) -> dict[str, Any]:
    return _plain(dataclasses.asdict(config))


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                cls: type = RunConfig) -> Any:
    """The embedded default of `cls` (a `RunConfig` unless given), overridden by a YAML file and then by
    `overrides` (same nesting)."""
    data: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"--config {path}: no such file (a YAML file of keys to override; "
                              "`memcl config --show` prints them all)")
        text = Path(path).read_text()
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    for key, value in (overrides or {}).items():
        section = data
        *parents, leaf = key.split(".")
        for p in parents:
            section = section.setdefault(p, {})
        section[leaf] = value
    return from_dict(cls, data)


def dump_config(config: Any, path: str | Path) -> None:
    files.write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False))


def describe(config: Any) -> str:
    """`config` as YAML that loads back to it, each key followed by its help: the comment its dataclass field
    carries in the source (where the default is defined, so the help cannot drift from it)."""
    lines: list[str] = []

    def walk(obj: Any, indent: str) -> None:
        helps, hints = _field_comments(type(obj)), typing.get_type_hints(type(obj))
        for f in fields(obj):
            value = getattr(obj, f.name)
            note = f"  # {_type_name(hints[f.name])}" + (f"; {helps[f.name]}" if f.name in helps else "")
            if is_dataclass(value):
                lines.append(f"{indent}{f.name}:{note}")
                walk(value, indent + "  ")
            else:
                text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6)
                text = text.strip().removesuffix("...").strip()  # a bare scalar document ends with "..."
                lines.append(f"{indent}{f.name}: {text}{note}")

    walk(config, "")
    return "\n".join(lines) + "\n"


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if is_dataclass(tp):
        return "section"
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (tuple, dict):
        return "list" if origin is tuple else "mapping"
    return getattr(tp, "__name__", str(tp))


def _plain(v: Any) -> Any:
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line (or the comment lines just above it) in the class source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    source_lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
            above, n = [], node.lineno - 1
            while n >= 1 and source_lines[n - 1].strip().startswith("#"):
                above.insert(0, comments[n])
                n -= 1
            if own or above:
                out[node.target.id] = " ".join(own or above)
    return out
