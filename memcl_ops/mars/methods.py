"""MARS's registered methods: MARS (with SGSE's calibrated reference signal), MARS as its paper writes it, its
ablations and MARS's memory under the analytic head; and the head they train (`distill`). Found by name through
the registry (memcl_ops/methods.py)."""

from __future__ import annotations

from memcl_ops.head_training import NO_ANCHORS, NO_DISTILL
from memcl_ops.mars.head import DistillHead
from memcl_ops.spec import HeadFactory, MethodSpec
from memcl_ops.training import OptimConfig

HEADS: dict[str, HeadFactory] = {"distill": lambda dim, cfg, seed: DistillHead(dim, cfg.stage2, seed)}

METHODS = [
    MethodSpec("mars", "MARS: slot memory + SGSE + DCDA stage 1 and 2", head="distill", memory=True, sgse=True,
               stage1=True),
    # MARS as its paper writes it: SGSE's routing-confidence signal, stage 1's schedule (W_q, started orthogonal,
    # trained too, all 20 epochs, Adam's per-tensor loop; MARS's default runs one epoch and keeps W_q the identity,
    # A_last within a seed std or above), one anchor per slot (MARS's default keeps one per slot and class) and KD
    # only at the anchors (MARS's default adds CE there; benchmarks/RESULTS.md)
    MethodSpec("mars-paper", "MARS as written: SGSE's confidence signal, stage 1 trains W_q for 20 epochs, one "
               "distillation anchor per slot", head="distill", memory=True, sgse=True, stage1=True,
               fixed={"sgse": {"signal": "paper"}, "router": {"query_init": "orthogonal"},
                      "stage1": {"train_query": True, "optim": OptimConfig(epochs=20)},
                      "stage2": {"lambda_lwf": 1.0, "anchor_points": "slot", "lambda_anchor_ce": 0.0,
                                 "lambda_gaussian": 0.0, "new_class_init": "zero"}},
               role="ablation"),
    # SGSE's signal alone: the MARS paper's routing confidence breaks SGSE's slot bound on long recurring streams,
    # the calibrated reference signal MARS uses keeps it (docs/methods.md, "Which signal is the default")
    MethodSpec("mars-paper-signal", "MARS with the MARS paper's SGSE signal (routing confidence against a quantile)",
               head="distill", memory=True, sgse=True, stage1=True, fixed={"sgse": {"signal": "paper"}},
               role="ablation"),
    # The MARS paper's ablations. No-Stage2 keeps the classifier (something must classify) but drops stage 2's
    # distillation (LwF and the anchor terms): the head is trained by CE alone on h̃.
    MethodSpec("mars-no-sgse", "MARS with the initial slots only (no SGSE expansion)", head="distill", memory=True,
               stage1=True, role="ablation"),
    MethodSpec("mars-no-anchor", "MARS without the anchor terms (KD and CE) in stage 2", head="distill", memory=True,
               sgse=True, stage1=True, fixed={"stage2": NO_ANCHORS}, role="ablation"),
    MethodSpec("mars-no-stage1", "MARS without stage 1 (the memory keeps its initial parameters)", head="distill",
               memory=True, sgse=True, role="ablation"),
    MethodSpec("mars-no-stage2", "MARS without stage 2's distillation (CE only on h̃)", head="distill", memory=True,
               sgse=True, stage1=True, fixed=NO_DISTILL, role="ablation"),
    MethodSpec("mars-analytic", "MARS memory (SGSE + DCDA stage 1) with the analytic ridge head on h̃", head="analytic",
               memory=True, sgse=True, stage1=True, fixed={"analytic": {"expansion_dim": 0}}),
]
