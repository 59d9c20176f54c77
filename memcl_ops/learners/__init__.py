"""The in-process learners, one per method family (features.py, nsr.py, lm.py): each runs its family's one flow
(memcl_ops/roles/) over roles held as plain objects. `build_learner` gives the `StreamLearner` of any registered
method (memcl_ops/methods.py) by its name."""

from __future__ import annotations

from memcl_ops.learner import StreamLearner
from memcl_ops.learners.features import FeatureLearner
from memcl_ops.learners.lm import LMLearner
from memcl_ops.learners.nsr import NSRLearner
from memcl_ops.method_config import LMMethodConfig, MethodConfig
from memcl_ops.methods import method_spec


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
