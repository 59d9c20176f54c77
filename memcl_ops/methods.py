"""The method registry: every method memcl runs, found by its name in one place, with its family, its roles,
the settings that define it and the capability tags it declares.

A "features" method is up to four roles, each owned by one actor in the pipeline:

* memory: a `SlotRouter` between encoder and head (MARS), or none (h̃ = h);
* novelty monitor: SGSE deciding when the memory grows, or none;
* stage 1: DCDA memory training, or none;
* head learner (memcl_ops/learner.py): the classifier and whatever it keeps to not forget.

"nsr" methods train LoRA inside the encoder (memcl_ops/nsr/), "lm" methods answer prompts with a frozen causal
LM (memcl_ops/miita/, memcl_ops/baselines/). All tunable defaults live in `MethodConfig` / `LMMethodConfig`, once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from memcl_ops.analytic.ridge import AnalyticConfig, AnalyticLearner
from memcl_ops.baselines.heads import DERppConfig, DERppHead, EWCConfig, EWCHead, JointHead, NearestMeanHead
from memcl_ops.baselines.lm_finetune import FinetuneConfig
from memcl_ops.baselines.text_replay import ReplayConfig
from memcl_ops.learner import HeadLearner
from memcl_ops.mars.dcda import Stage1Config, Stage2Config
from memcl_ops.mars.head import DistillHead
from memcl_ops.mars.router import RouterConfig
from memcl_ops.mars.sgse import SGSEConfig
from memcl_ops.miita.directions import PAPER_ADAPT, PAPER_MEMORY, AdaptConfig, MemoryConfig
from memcl_ops.nsr.adapter import NSRConfig
from memcl_ops.training import OptimConfig


@dataclass(frozen=True)
class MethodConfig:
    """Every method knob, with its default (the [R] ones documented where they are used)."""

    name: str = "mars"  # a registered method (`memcl list methods`)
    router: RouterConfig = RouterConfig()
    sgse: SGSEConfig = SGSEConfig()
    stage1: Stage1Config = Stage1Config()
    stage2: Stage2Config = Stage2Config()
    ewc: EWCConfig = EWCConfig()
    derpp: DERppConfig = DERppConfig()
    nsr: NSRConfig = NSRConfig()
    analytic: AnalyticConfig = AnalyticConfig()
    consolidate_every: int = 8  # task-free mode: run stage 1 + 2 every K batches


HeadFactory = Callable[[int, MethodConfig, int], HeadLearner]

HEADS: dict[str, HeadFactory] = {
    "distill": lambda dim, cfg, seed: DistillHead(dim, cfg.stage2, seed),
    "ewc": lambda dim, cfg, seed: EWCHead(dim, cfg.stage2, cfg.ewc, seed),
    "derpp": lambda dim, cfg, seed: DERppHead(dim, cfg.stage2, cfg.derpp, seed),
    "nearest-mean": lambda dim, cfg, seed: NearestMeanHead(dim),
    "joint": lambda dim, cfg, seed: JointHead(dim, cfg.stage2, seed),
    "analytic": lambda dim, cfg, seed: AnalyticLearner(dim, cfg.analytic, seed, cfg.stage1.smooth_target),
}


# Capability tags a method declares (Mammoth's COMPATIBILITY, river's tags); the conformance check
# (memcl_ops/conformance.py) selects its checks by them; preflight refuses what a method cannot do.
TAGS = {
    "task-free": "learns without task boundaries (rounds of K batches)",
    "mergeable": "its learning is a sum of statistics: encoder replicas sum their batches' share, merged exactly",
    "trains-backbone": "trains weights inside the frozen model (LoRA), on raw batches",
    "generative": "answers text prompts with a causal LM (memcl lm) instead of predicting class labels",
    "byte-budget": "its memory is capped by a byte budget set per run (memcl lm --budgets)",
    "learns-nothing": "keeps no state (the frozen base): restore and byte checks are vacuous",
    "direction-memory": "keeps MIITA's prototype memory (memcl_ops/miita/): written from teacher-forced extractions",
    "demonstrations": "answers after stored examples retrieved by key and shown in the prompt (text replay)",
}
FAMILIES = ("features", "nsr", "lm")  # what runs where: a pipeline per family (pipeline/features.py, nsr.py, lm.py)


@dataclass(frozen=True)
class MethodSpec:
    """What a method is: its family and roles, the settings that define it, and what it is compatible with."""

    name: str
    summary: str
    # "features": a HeadLearner over frozen (cached) features, with MARS's roles switched on below; "nsr": LoRA
    # trained inside the encoder on raw batches; "lm": a frozen causal LM answering text prompts
    family: str = "features"
    head: str | None = None  # key of HEADS (family "features")
    memory: bool = False  # a SlotRouter between encoder and head
    sgse: bool = False  # SGSE grows the memory
    stage1: bool = False  # DCDA stage 1 trains the memory
    fixed: dict[str, dict[str, object]] = field(default_factory=dict)  # section -> settings the method fixes
    tags: frozenset[str] = frozenset({"task-free"})
    # what labels the head learns from: the current block only ("current"), or also earlier blocks' labels it
    # keeps in its own (byte-counted) memory ("seen"); never those of blocks not streamed yet
    uses_labels_of: str = "current"
    # what the method is in a comparison: "memcl" (ours), "baseline", "ablation" (of MARS) or "upper-bound"
    role: str = "memcl"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or not self.tags <= TAGS.keys() or (
                self.family == "features") != bool(self.head):
            raise ValueError(f"method {self.name!r}: bad family {self.family!r}, head {self.head!r} or tags "
                             f"{sorted(self.tags)}")

    @property
    def task_free(self) -> bool:
        return "task-free" in self.tags

    @property
    def mergeable(self) -> bool:
        return "mergeable" in self.tags

    def resolve(self, config: MethodConfig) -> MethodConfig:
        """`config` with this method's defining settings applied (they win over user values)."""
        sections = {name: replace(getattr(config, name), **values) for name, values in self.fixed.items()}
        return replace(config, name=self.name, **sections)

    def resolve_lm(self, config: LMMethodConfig) -> LMMethodConfig:
        """The same for the "lm" family's config (it has no method name)."""
        return replace(config, **{name: replace(getattr(config, name), **values)
                                  for name, values in self.fixed.items()})


@dataclass(frozen=True)
class HybridConfig:
    """`miita-replay`: one byte budget, split between MIITA's prototypes and replayed demonstrations [R]."""

    # "prototypes-first": the prototypes may take the whole budget (repair keeps them inside it) and the
    # demonstrations hold what they leave, re-limited after every write, so at a tight budget miita-replay is miita
    # and demonstrations come in as the budget loosens; "share": a fixed `direction_share` of the budget each.
    split: Literal["prototypes-first", "share"] = "prototypes-first"
    direction_share: float = 0.5  # "share": of the budget for the prototypes; the rest holds demonstrations
    # an example is also kept as a demonstration only when the frozen model's mean answer NLL exceeds this (what it
    # cannot do; 0: every example); every example is written as a prototype (~90 bytes)
    demonstrate_above_nll: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.direction_share < 1.0:
            raise ValueError(f"direction_share must be in (0, 1), got {self.direction_share}")

    def budgets(self, total: int) -> tuple[int, int]:
        """(prototype bytes, the most demonstration bytes) of a total budget."""
        if self.split == "prototypes-first":
            return total, total
        prototypes = int(total * self.direction_share)
        return prototypes, total - prototypes

    def demonstration_room(self, total: int, prototype_bytes: int) -> int:
        """What the demonstrations may hold beside `prototype_bytes` of prototypes (after each write)."""
        return total - prototype_bytes if self.split == "prototypes-first" else self.budgets(total)[1]


@dataclass(frozen=True)
class LMMethodConfig:
    memory: MemoryConfig = MemoryConfig()
    adapt: AdaptConfig = AdaptConfig()
    replay: ReplayConfig = ReplayConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    hybrid: HybridConfig = HybridConfig()


_NSR_TAGS = frozenset({"trains-backbone"})  # task-aware: the bank is keyed at task arrival
_NO_ANCHORS = {"lambda_anchor": 0.0, "lambda_anchor_ce": 0.0}
_NO_OLD_CLASS_TERMS = {**_NO_ANCHORS, "lambda_gaussian": 0.0}  # the anchor terms and the Gaussian replay
_NO_DISTILL = {"stage2": {"lambda_lwf": 0.0, **_NO_OLD_CLASS_TERMS}}

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in [
    MethodSpec("mars", "MARS: slot memory + SGSE + DCDA stage 1 and 2", head="distill", memory=True, sgse=True,
               stage1=True),
    # SGSE's calibrated reference signal (docs/methods.md): keeps SGSE's slot bound on long recurring streams, where
    # the MARS paper's confidence signal does not; not MARS's default because it costs 1.4 points A_last on fmnist-5x2
    # (benchmarks/RESULTS.md, "SGSE signals")
    MethodSpec("mars-reference", "MARS with SGSE's calibrated per-slot reference signal (frozen features)",
               head="distill", memory=True, sgse=True, stage1=True, fixed={"sgse": {"signal": "reference"}}),
    # MARS as its paper writes it: stage 1's schedule (W_q, started orthogonal, trained too, all 20 epochs, Adam's
    # per-tensor loop; MARS's default runs one epoch and keeps W_q the identity, A_last within a seed std or above),
    # one anchor per slot (MARS's default keeps one per slot and class) and KD only at the anchors (MARS's default
    # adds CE there; benchmarks/RESULTS.md)
    MethodSpec("mars-paper", "MARS as written: stage 1 trains W_q for 20 epochs, one distillation anchor per slot",
               head="distill", memory=True, sgse=True, stage1=True,
               fixed={"router": {"query_init": "orthogonal"},
                      "stage1": {"train_query": True, "optim": OptimConfig(epochs=20)},
                      "stage2": {"lambda_lwf": 1.0, "anchor_points": "slot", "lambda_anchor_ce": 0.0,
                                 "lambda_gaussian": 0.0, "new_class_init": "zero"}},
               role="ablation"),
    MethodSpec("finetune", "sequential cross-entropy on the frozen features (no memory, no distillation)",
               head="distill", fixed=_NO_DISTILL, role="baseline"),
    # Baselines (memcl_ops/baselines/heads.py) on the same frozen features, stream and head.
    MethodSpec("lwf", "LwF: CE + KD of the previous head on current inputs (DCDA stage 2 without memory, anchors)",
               head="distill", fixed={"stage2": {"lambda_lwf": 1.0, **_NO_OLD_CLASS_TERMS}}, role="baseline"),
    MethodSpec("ewc", "online EWC: CE + diagonal-Fisher penalty on the head", head="ewc", role="baseline"),
    MethodSpec("derpp", "DER++: CE + logit and label replay from a reservoir buffer of features", head="derpp",
               uses_labels_of="seen", role="baseline"),
    MethodSpec("simplecil", "SimpleCIL: cosine nearest class mean, no training", head="nearest-mean", role="baseline"),
    MethodSpec("joint", "joint training on all data seen so far (non-continual upper bound)", head="joint",
               uses_labels_of="seen", role="upper-bound"),
    # MARS ablations (its paper's ablations). No-Stage2 keeps the classifier (something must classify) but
    # drops stage 2's distillation (LwF and the anchor terms): the head is trained by CE alone on h̃.
    MethodSpec("mars-no-sgse", "MARS with the initial slots only (no SGSE expansion)", head="distill", memory=True,
               stage1=True, role="ablation"),
    MethodSpec("mars-no-anchor", "MARS without the anchor terms (KD and CE) in stage 2", head="distill", memory=True,
               sgse=True, stage1=True, fixed={"stage2": _NO_ANCHORS}, role="ablation"),
    MethodSpec("mars-no-stage1", "MARS without stage 1 (the memory keeps its initial parameters)", head="distill",
               memory=True, sgse=True, role="ablation"),
    MethodSpec("mars-no-stage2", "MARS without stage 2's distillation (CE only on h̃)", head="distill", memory=True,
               sgse=True, stage1=True, fixed=_NO_DISTILL, role="ablation"),
    # Closed-form ridge heads from exact running statistics (memcl_ops/analytic/ridge.py): equal to joint ridge on all
    # data seen after every task, no samples kept.
    MethodSpec("analytic", "analytic ridge head on the frozen features (exact running statistics, λ by LOO)",
               head="analytic", fixed={"analytic": {"expansion_dim": 0}}, tags=frozenset({"task-free", "mergeable"})),
    MethodSpec("analytic-rp", "analytic ridge head on a fixed random ReLU expansion of the features (RanPAC-style)",
               head="analytic", tags=frozenset({"task-free", "mergeable"})),
    MethodSpec("mars-analytic", "MARS memory (SGSE + DCDA stage 1) with the analytic ridge head on h̃", head="analytic",
               memory=True, sgse=True, stage1=True, fixed={"analytic": {"expansion_dim": 0}}),
    # NSR (memcl_ops/nsr/): LoRA inside the frozen encoder; its memoryless baselines are the same learner with the
    # fresh / keep allocation rule.
    MethodSpec("nsr", "NSR: LoRA in the frozen encoder, compressed into a task bank, recalled at task arrival",
               family="nsr", tags=_NSR_TAGS),
    MethodSpec("nsr-fresh", "NSR's learner without a bank: a fresh adapter for every visit (memoryless)",
               family="nsr", tags=_NSR_TAGS, fixed={"nsr": {"allocation": "fresh"}}, role="baseline"),
    MethodSpec("nsr-keep", "NSR's learner without a bank: one adapter kept training across visits (memoryless)",
               family="nsr", tags=_NSR_TAGS, fixed={"nsr": {"allocation": "keep"}}, role="baseline"),
    # A frozen causal LM on (prompt, answer) tasks (`memcl lm`, memcl_ops/miita/ and memcl_ops/baselines/).
    MethodSpec("base", "the frozen causal LM, no memory", family="lm", tags=frozenset({"generative", "learns-nothing"}),
               role="baseline"),
    MethodSpec("miita", "MIITA, position-aware: answer-position prototypes on centred compact keys, the smallest "
               "pre-LM-head step that flips each position to the memory's token", family="lm",
               tags=frozenset({"generative", "byte-budget", "direction-memory"})),
    # MIITA as its paper writes it: one correction averaged over the answer, fp16 raw-key anchors merged at 0.9,
    # K = 3 by relevance + uncertainty, the gated relative step (benchmarks/RESULTS.md, "MIITA, position-aware")
    MethodSpec("miita-paper", "MIITA as written: averaged direction prototypes + gated temporary update", family="lm",
               tags=frozenset({"generative", "byte-budget", "direction-memory"}),
               fixed={"memory": PAPER_MEMORY, "adapt": PAPER_ADAPT}),
    MethodSpec("nearest-answer", "the stored answer of the nearest key in MIITA's memory, copied (no LM decoding; "
               "the retrieval's ceiling)", family="lm", tags=frozenset({"generative", "byte-budget",
                                                                          "direction-memory"}),
               fixed={"adapt": {"rule": "copy"}}, role="baseline"),
    MethodSpec("replay", "text replay: stored examples, nearest by key, as demonstrations in the prompt (UTF-8 "
               "budget)", family="lm", tags=frozenset({"generative", "byte-budget", "demonstrations"}),
               role="baseline"),
    MethodSpec("miita-replay", "MIITA + replay in one budget: position-aware prototypes steer, replayed examples "
               "shown in the prompt", family="lm",
               tags=frozenset({"generative", "byte-budget", "direction-memory", "demonstrations"})),
    MethodSpec("lora", "sequential LoRA fine-tuning of q/v projections, no memory (forgetting reference)",
               family="lm", tags=frozenset({"generative", "trains-backbone"}), role="baseline"),
]}


def family_methods(family: str) -> list[str]:
    """Registered methods of one family, in registry order (`memcl bench` compares the "features" ones)."""
    return [name for name, spec in METHODS.items() if spec.family == family]


def method_spec(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None


def build_head(spec: MethodSpec, config: MethodConfig, feature_dim: int, seed: int) -> HeadLearner:
    return HEADS[spec.head](feature_dim, spec.resolve(config), seed)


def lm_method(name: str) -> MethodSpec:
    """The registry entry of a method `memcl lm` runs."""
    if name not in family_methods("lm"):
        raise ValueError(f"unknown LM method {name!r}; known: {family_methods('lm')}")
    return METHODS[name]
