"""What a consolidation costs each method, declared: the trainers' passes over a batch of rows it consolidates.
Each training epoch of DCDA stage 1 and of a trained head is one pass (DER++'s replayed minibatch doubles its
epochs). A head that learns each batch exactly as it streams (the analytic heads, SLDA, the nearest means, the
blind baseline) does its learning in the per-batch step and settles in place: its consolidation costs the trainers
nothing beyond stage 1's epochs. The stream's clock (memcl_ops/realtime.py) charges these costs."""

from __future__ import annotations

from memcl_ops.method_config import MethodConfig
from memcl_ops.spec import MethodSpec


def consolidation_cost(spec: MethodSpec, method: MethodConfig) -> float:
    method = spec.resolve(method)
    passes = float(method.stage1.optim.epochs) if spec.stage1 else 0.0
    if spec.head in ("distill", "ewc", "joint"):
        passes += method.stage2.optim.epochs
    elif spec.head == "derpp":
        passes += 2 * method.stage2.optim.epochs
    return passes
