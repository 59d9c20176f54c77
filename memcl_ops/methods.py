"""Continual-learning methods: one uniform learner interface and a registry of what each method is.

A method is four roles, each owned by one actor in the pipeline:

* memory: a `SlotRouter` between encoder and head (MARS), or none (h̃ = h);
* novelty monitor: SGSE deciding when the memory grows, or none;
* stage 1: DCDA memory training, or none;
* head learner: the classifier and whatever it keeps to not forget (teacher, buffer, statistics).

`HeadLearner` is the uniform interface every head follows (river-style): `fit` on a block of data,
`end_task` at a boundary, `predict`, `state`/`restore` over plain numpy dicts, `memory_bytes`.
`METHODS` declares, per method, its roles, its fixed settings and what it is compatible with
(Mammoth-style); all tunable defaults live in `MethodConfig`, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from memcl_ops.analytic import AnalyticConfig, AnalyticLearner
from memcl_ops.baselines import DERppConfig, DERppHead, EWCConfig, EWCHead, JointHead, NearestMeanHead
from memcl_ops.dcda import Stage1Config, Stage2Config, Teacher, apply_memory, train_stage2
from memcl_ops.head import GrowingLinearHead
from memcl_ops.nsr import NSRConfig
from memcl_ops.router import RouterConfig, SlotRouter
from memcl_ops.sgse import SGSEConfig


@dataclass(frozen=True)
class MethodConfig:
    """Every method knob, with its default (the [R] ones documented where they are used)."""

    name: str = "mars"
    router: RouterConfig = RouterConfig()
    sgse: SGSEConfig = SGSEConfig()
    stage1: Stage1Config = Stage1Config()
    stage2: Stage2Config = Stage2Config()
    ewc: EWCConfig = EWCConfig()
    derpp: DERppConfig = DERppConfig()
    nsr: NSRConfig = NSRConfig()
    analytic: AnalyticConfig = AnalyticConfig()
    consolidate_every: int = 8  # task-free mode: run stage 1 + 2 every K batches


class HeadLearner(Protocol):
    """The classifier role of a method; features arrive raw and are passed through `memory` (may be None)."""

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: SlotRouter | None) -> dict[str, float]: ...

    def end_task(self, memory: SlotRouter | None) -> None: ...

    def predict(self, features: torch.Tensor, memory: SlotRouter | None) -> np.ndarray: ...

    def state(self) -> dict[str, np.ndarray]: ...

    def restore(self, state: dict[str, np.ndarray]) -> None: ...

    def memory_bytes(self) -> dict[str, int]: ...


def state_nbytes(state: dict[str, np.ndarray]) -> int:
    return int(sum(np.asarray(v).nbytes for v in state.values()))


class DistillHead:
    """A growing linear head trained with CE + old-class distillation (DCDA stage 2, LwF, fine-tune).

    With λ_LwF = λ_anchor = 0 it is plain sequential fine-tuning and keeps no teacher.
    """

    def __init__(self, feature_dim: int, config: Stage2Config, seed: int):
        self.config, self.seed = config, seed
        self.head = GrowingLinearHead(feature_dim)
        self.teacher: Teacher | None = None
        self.fits = 0

    @property
    def distills(self) -> bool:
        return bool(self.config.lambda_lwf or self.config.lambda_anchor)

    def fit(self, features: torch.Tensor, labels: torch.Tensor, memory: SlotRouter | None) -> dict[str, float]:
        self.head.grow(labels)
        history = train_stage2(self.head, memory, features, labels, self.teacher, self.config,
                               seed=self.seed * 100_003 + self.fits)
        self.fits += 1
        return {"loss_first": history[0], "loss_last": history[-1]} if history else {}

    def end_task(self, memory: SlotRouter | None) -> None:
        if self.distills:
            self.teacher = Teacher.snapshot(memory, self.head)

    @torch.no_grad()
    def predict(self, features: torch.Tensor, memory: SlotRouter | None) -> np.ndarray:
        return self.head.predict(apply_memory(memory, features))

    def state(self) -> dict[str, np.ndarray]:
        out = {f"head.{k}": v for k, v in self.head.state().items()}
        if self.teacher is not None:
            out.update({f"teacher.{k}": v for k, v in self.teacher.state().items()})
        out["fits"] = np.array(self.fits)
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.head.load_state({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        teacher = {k[8:]: v for k, v in state.items() if k.startswith("teacher.")}
        self.teacher = Teacher.from_state(teacher) if teacher else None
        self.fits = int(state["fits"])

    def memory_bytes(self) -> dict[str, int]:
        return {"head": self.head.nbytes(),
                "teacher": state_nbytes(self.teacher.state()) if self.teacher is not None else 0}


HeadFactory = Callable[[int, MethodConfig, int], HeadLearner]

HEADS: dict[str, HeadFactory] = {
    "distill": lambda dim, cfg, seed: DistillHead(dim, cfg.stage2, seed),
    "ewc": lambda dim, cfg, seed: EWCHead(dim, cfg.stage2, cfg.ewc, seed),
    "derpp": lambda dim, cfg, seed: DERppHead(dim, cfg.stage2, cfg.derpp, seed),
    "nearest-mean": lambda dim, cfg, seed: NearestMeanHead(dim),
    "joint": lambda dim, cfg, seed: JointHead(dim, cfg.stage2, seed),
    "analytic": lambda dim, cfg, seed: AnalyticLearner(dim, cfg.analytic, seed, cfg.stage1.smooth_target),
}


@dataclass(frozen=True)
class MethodSpec:
    """What a method is: its roles, the settings that define it, and what it is compatible with."""

    name: str
    summary: str
    head: str  # key of HEADS
    memory: bool = False  # a SlotRouter between encoder and head
    sgse: bool = False  # SGSE grows the memory
    stage1: bool = False  # DCDA stage 1 trains the memory
    fixed: dict[str, dict[str, object]] = field(default_factory=dict)  # section -> settings the method fixes
    task_free: bool = True  # works without task boundaries
    # what labels the head learns from: the current block only ("current"), or also earlier blocks' labels it
    # keeps in its own (byte-counted) memory ("seen"); never those of blocks not streamed yet
    uses_labels_of: str = "current"
    # what the method is in a comparison: "memcl" (ours), "baseline", "ablation" (of MARS) or "upper-bound"
    role: str = "memcl"
    # "features": the runner's loop over frozen (cached) features and a HeadLearner; "adapter": LoRA trained inside
    # the encoder on raw batches (NSR, pipeline/adapter_runner.py; `head` is then unused)
    loop: str = "features"
    # the head is a sum of statistics of the frozen features (memcl_ops/analytic.py): encoder replicas can sum their
    # own batches' share and the MemoryManager merge them (when features are encoded in-line)
    mergeable: bool = False

    def resolve(self, config: MethodConfig) -> MethodConfig:
        """`config` with this method's defining settings applied (they win over user values)."""
        sections = {name: replace(getattr(config, name), **values) for name, values in self.fixed.items()}
        return replace(config, name=self.name, **sections)


_NO_DISTILL = {"stage2": {"lambda_lwf": 0.0, "lambda_anchor": 0.0}}

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in [
    MethodSpec("mars", "MARS: slot memory + SGSE + DCDA stage 1 and 2", "distill", memory=True, sgse=True, stage1=True),
    # SGSE's calibrated reference signal (docs/methods.md): keeps SGSE's slot bound on long recurring streams, where
    # the paper's confidence signal does not; not MARS's default because it costs 1.4 points A_last on fmnist-5x2
    # (benchmarks/RESULTS.md, "SGSE signals")
    MethodSpec("mars-reference", "MARS with SGSE's calibrated per-slot reference signal (frozen features)", "distill",
               memory=True, sgse=True, stage1=True, fixed={"sgse": {"signal": "reference"}}),
    MethodSpec("finetune", "sequential cross-entropy on the frozen features (no memory, no distillation)",
               "distill", fixed=_NO_DISTILL, role="baseline"),
    # Baselines (memcl_ops/baselines.py) on the same frozen features, stream and head.
    MethodSpec("lwf", "LwF: CE + KD of the previous head on current inputs (DCDA stage 2 without memory, anchors)",
               "distill", fixed={"stage2": {"lambda_anchor": 0.0}}, role="baseline"),
    MethodSpec("ewc", "online EWC: CE + diagonal-Fisher penalty on the head", "ewc", role="baseline"),
    MethodSpec("derpp", "DER++: CE + logit and label replay from a reservoir buffer of features", "derpp",
               uses_labels_of="seen", role="baseline"),
    MethodSpec("simplecil", "SimpleCIL: cosine nearest class mean, no training", "nearest-mean", role="baseline"),
    MethodSpec("joint", "joint training on all data seen so far (non-continual upper bound)", "joint",
               uses_labels_of="seen", role="upper-bound"),
    # MARS ablations (the paper's Tab. ablations). No-Stage2 keeps the classifier (something must classify) but
    # drops stage 2's distillation (LwF and anchor KD): the head is trained by CE alone on h̃.
    MethodSpec("mars-no-sgse", "MARS with the initial slots only (no SGSE expansion)", "distill", memory=True,
               stage1=True, role="ablation"),
    MethodSpec("mars-no-anchor", "MARS without anchor distillation in stage 2", "distill", memory=True, sgse=True,
               stage1=True, fixed={"stage2": {"lambda_anchor": 0.0}}, role="ablation"),
    MethodSpec("mars-no-stage1", "MARS without stage 1 (the memory keeps its initial parameters)", "distill",
               memory=True, sgse=True, role="ablation"),
    MethodSpec("mars-no-stage2", "MARS without stage 2's distillation (CE only on h̃)", "distill", memory=True,
               sgse=True, stage1=True, fixed=_NO_DISTILL, role="ablation"),
    # Closed-form ridge heads from exact running statistics (memcl_ops/analytic.py): equal to joint ridge on all data
    # seen after every task, no samples kept.
    MethodSpec("analytic", "analytic ridge head on the frozen features (exact running statistics, λ by LOO)",
               "analytic", fixed={"analytic": {"expansion_dim": 0}}, mergeable=True),
    MethodSpec("analytic-rp", "analytic ridge head on a fixed random ReLU expansion of the features (RanPAC-style)",
               "analytic", mergeable=True),
    MethodSpec("mars-analytic", "MARS memory (SGSE + DCDA stage 1) with the analytic ridge head on h̃", "analytic",
               memory=True, sgse=True, stage1=True, fixed={"analytic": {"expansion_dim": 0}}),
    # NSR (memcl_ops/nsr.py): its memoryless baselines are the same method with nsr.allocation fresh / keep.
    MethodSpec("nsr", "NSR: LoRA in the frozen encoder, compressed into a task bank, recalled at task arrival",
               "none", task_free=False, loop="adapter"),
]}


def head_learner_methods() -> list[str]:
    """Registered methods whose learning happens in a `HeadLearner` over frozen features (registry order): the
    ones the conformance suite drives in-process and `memcl bench` compares by default."""
    return [name for name, spec in METHODS.items() if spec.head in HEADS]


def method_spec(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None


def build_head(spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int) -> HeadLearner:
    return HEADS[spec.head](feature_dim, spec.resolve(config), seed)


def build_memory(spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int) -> SlotRouter | None:
    return SlotRouter(feature_dim, config.router, seed=seed) if spec.memory else None
