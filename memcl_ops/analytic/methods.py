"""The analytic heads' registered methods: closed-form ridge heads from exact running statistics, equal to joint
ridge on all data seen after every task with no samples kept (ridge.py); and their head (`analytic`). Found by name
through the registry (memcl_ops/methods.py)."""

from __future__ import annotations

from memcl_ops.analytic.ridge import AnalyticLearner
from memcl_ops.spec import HeadFactory, MethodSpec

HEADS: dict[str, HeadFactory] = {
    "analytic": lambda dim, cfg, seed: AnalyticLearner(dim, cfg.analytic, seed, cfg.stage1.smooth_target),
}

METHODS = [
    MethodSpec("analytic", "analytic ridge head on the frozen features (exact running statistics, λ by LOO)",
               head="analytic", fixed={"analytic": {"expansion_dim": 0}}),
    MethodSpec("analytic-rp", "analytic ridge head on a fixed random ReLU expansion of the features (RanPAC-style)",
               head="analytic"),
]
