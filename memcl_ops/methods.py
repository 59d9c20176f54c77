"""The method registry: every method memcl runs, found by its name in one place. Each family declares its methods
(and the heads they train) in its own package; this module only gathers them:

| package | methods |
|---|---|
| mars/methods.py | MARS, MARS as its paper writes it, its ablations, MARS's memory under the analytic head |
| analytic/methods.py | the analytic ridge heads |
| baselines/methods.py | the baselines' heads over frozen features; the LM family's frozen base, text replay, LoRA |
| nsr/methods.py | NSR and its memoryless baselines |
| miita/methods.py | MIITA, MIITA as its paper writes it, the nearest stored answer, MIITA with replay |

A "features" method is up to four roles, each owned by one actor in the pipeline: a feature memory between encoder
and head (MARS's slot memory, or none: h̃ = h), a novelty monitor (SGSE deciding when the memory grows, or none),
DCDA stage 1 (memory training, or none) and the head learner (memcl_ops/learner.py). "nsr" methods train LoRA
inside the encoder (memcl_ops/nsr/), "lm" methods answer prompts with a frozen causal LM (memcl_ops/miita/,
memcl_ops/baselines/). What a method is: `MethodSpec` (memcl_ops/spec.py); every tunable default: `MethodConfig` /
`LMMethodConfig` (memcl_ops/method_config.py)."""

from __future__ import annotations

from memcl_ops.analytic import methods as analytic
from memcl_ops.arrow.schema import FeatureBound
from memcl_ops.baselines import methods as baselines
from memcl_ops.learner import HeadLearner
from memcl_ops.mars import methods as mars
from memcl_ops.method_config import MethodConfig
from memcl_ops.miita import methods as miita
from memcl_ops.nsr import methods as nsr
from memcl_ops.spec import BoundFactory, HeadFactory, MethodSpec


def _by_name(specs: list[MethodSpec]) -> dict[str, MethodSpec]:
    out: dict[str, MethodSpec] = {}
    for spec in specs:
        if spec.name in out:
            raise ValueError(f"method {spec.name!r} is registered twice")
        out[spec.name] = spec
    return out


METHODS: dict[str, MethodSpec] = _by_name([*mars.METHODS, *analytic.METHODS, *baselines.FEATURE_METHODS,
                                          *nsr.METHODS, *baselines.LM_METHODS, *miita.METHODS])
HEADS: dict[str, HeadFactory] = {**mars.HEADS, **analytic.HEADS, **baselines.HEADS}
BOUNDS: dict[str, BoundFactory] = {**analytic.BOUNDS}  # heads that take less than every method's bound


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


def feature_bound(config: MethodConfig, feature_dim: int, seed: int) -> FeatureBound:
    """The features the method of `config` takes, which the gate enforces: every method's bound (FeatureBound()), or
    its head's own where the head reads the features themselves (not a memory's h̃) and has one (BOUNDS)."""
    spec = method_spec(config.name)
    if spec.family != "features" or spec.memory or spec.head not in BOUNDS:
        return FeatureBound()
    return BOUNDS[spec.head](feature_dim, spec.resolve(config), seed)


def lm_method(name: str) -> MethodSpec:
    """The registry entry of a method `memcl lm` runs."""
    if name not in family_methods("lm"):
        raise ValueError(f"unknown LM method {name!r}; known: {family_methods('lm')}")
    return METHODS[name]
