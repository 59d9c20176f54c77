"""What a registered method is (`MethodSpec`): its family, its roles, the settings that define it and the capability
tags it declares. Each family declares its methods in its own package (mars/methods.py, baselines/methods.py, ...);
memcl_ops/methods.py is the registry that finds every one by its name. The floor of the method layers: it knows no
family and no config class (a config is any frozen dataclass whose sections `fixed` names), so every family can
declare its methods with it and `MethodConfig` (memcl_ops/method_config.py) gathers the families' sections above
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

Config = TypeVar("Config")  # MethodConfig or LMMethodConfig: sections the methods fix by name

# Capability tags a method declares (Mammoth's COMPATIBILITY, river's tags); the conformance check
# (memcl_ops/conformance.py) selects its checks by them; preflight refuses what a method cannot do.
TAGS = {
    "task-free": "learns without task boundaries (rounds of K batches)",
    "trains-backbone": "trains weights inside the frozen model (LoRA), on raw batches",
    "generative": "answers text prompts with a causal LM (memcl lm) instead of predicting class labels",
    "byte-budget": "its memory is capped by a byte budget set per run (memcl lm --budgets)",
    "learns-nothing": "keeps no state (the frozen base): restore and byte checks are vacuous",
    "input-blind": "predicts without reading the input (from the labels streamed): the classes check is vacuous",
    "direction-memory": "keeps MIITA's prototype memory (memcl_ops/miita/): written from teacher-forced extractions",
    "demonstrations": "answers after stored examples retrieved by key and shown in the prompt (text replay)",
}
FAMILIES = ("features", "nsr", "lm")  # what runs where: a pipeline per family (pipeline/features.py, nsr.py, lm.py)


# (feature_dim, the method's config, seed) -> its head (a `HeadLearner`, memcl_ops/learner.py)
HeadFactory = Callable[[int, Any, int], Any]
# (feature_dim, the method's config, seed) -> the features its head takes (a `FeatureBound`, memcl_ops/arrow/schema.py)
BoundFactory = Callable[[int, Any, int], Any]


@dataclass(frozen=True)
class MethodSpec:
    """What a method is: its family and roles, the settings that define it, and what it is compatible with."""

    name: str
    summary: str
    # "features": a HeadLearner over frozen (cached) features, with MARS's roles switched on below; "nsr": LoRA
    # trained inside the encoder on raw batches; "lm": a frozen causal LM answering text prompts
    family: str = "features"
    head: str | None = None  # key of HEADS (family "features")
    memory: bool = False  # a feature memory (MARS's slot memory) between encoder and head
    sgse: bool = False  # SGSE grows the memory
    stage1: bool = False  # DCDA stage 1 trains the memory
    fixed: dict[str, dict[str, object]] = field(default_factory=dict)  # section -> settings the method fixes
    tags: frozenset[str] = frozenset({"task-free"})
    # what labels the head learns from: the current block only ("current"), or also earlier blocks' labels it
    # keeps in its own (byte-counted) memory ("seen"); never those of blocks not streamed yet
    uses_labels_of: str = "current"
    # what the method is in a comparison: "paper" (a paper's method as its sources write it), "memcl" (ours: memcl's
    # methods and its extensions of a paper's), "baseline", "ablation" (of a paper's method or of memcl's) or
    # "upper-bound"
    role: str = "memcl"
    # a rehearsal buffer of stored rows: (its size's setting under `method.`, in rows; its memory-report entry), so a
    # bench can give it the bytes of the method it is compared with (`memcl bench --equal-bytes`)
    buffer: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or not self.tags <= TAGS.keys() or (
                self.family == "features") != bool(self.head):
            raise ValueError(f"method {self.name!r}: bad family {self.family!r}, head {self.head!r} or tags "
                             f"{sorted(self.tags)}")

    @property
    def task_free(self) -> bool:
        return "task-free" in self.tags

    def resolve(self, config: Config) -> Config:
        """`config` with this method's defining settings applied (they win over user values)."""
        sections = {name: replace(getattr(config, name), **values) for name, values in self.fixed.items()}
        return replace(config, name=self.name, **sections)

    def resolve_lm(self, config: Config) -> Config:
        """The same for the "lm" family's config (it has no method name)."""
        return replace(config, **{name: replace(getattr(config, name), **values)
                                  for name, values in self.fixed.items()})

