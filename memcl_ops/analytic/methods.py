"""The analytic heads' registered methods: closed-form ridge heads from exact running statistics, equal to joint
ridge on all data seen after every task with no samples kept (ridge.py); and their head (`analytic`). Found by name
through the registry (memcl_ops/methods.py)."""

from __future__ import annotations

from memcl_ops.analytic.ridge import AnalyticLearner, FeatureMap
from memcl_ops.spec import BoundFactory, HeadFactory, MethodSpec

HEADS: dict[str, HeadFactory] = {
    "analytic": lambda dim, cfg, seed: AnalyticLearner(dim, cfg.analytic, seed, cfg.stage1.smooth_target),
}

# the features the head takes exactly: what its fixed point can square, and its expansion multiply, per row
BOUNDS: dict[str, BoundFactory] = {
    "analytic": lambda dim, cfg, seed: FeatureMap(dim, cfg.analytic, seed).input_bound(),
}

METHODS = [
    MethodSpec("analytic", "analytic ridge head on the frozen features (exact running statistics, λ by LOO)",
               head="analytic", fixed={"analytic": {"expansion_dim": 0}}),
    MethodSpec("analytic-rp", "analytic ridge head on a fixed random ReLU expansion of the features (RanPAC-style)",
               head="analytic"),
]
