"""`build_learner`: the in-process `StreamLearner` of any registered method (memcl_ops/methods.py), by its name."""

from __future__ import annotations

from memcl_ops.feature_learner import FeatureLearner
from memcl_ops.learner import StreamLearner
from memcl_ops.method_config import LMMethodConfig, MethodConfig
from memcl_ops.methods import method_spec
from memcl_ops.nsr.learner import NSRLearner
from memcl_ops.roles.lm import LMLearner


def build_learner(name: str, config: MethodConfig | LMMethodConfig, seed: int = 0, **context: object) -> StreamLearner:
    """The in-process `StreamLearner` (memcl_ops/learner.py) of a registered method. `context` per family:
    "features": feature_dim; "nsr": encoder (an EncoderSpec), payload, n_way; "lm": lm (an LMSpec), budget (the
    byte budget of a "byte-budget" method), max_new_tokens."""
    spec = method_spec(name)
    if spec.family == "features":
        return FeatureLearner(spec, config, seed=seed, **context)
    if spec.family == "nsr":
        return NSRLearner(spec, config, seed=seed, **context)
    return LMLearner(spec, config, seed=seed, **context)
