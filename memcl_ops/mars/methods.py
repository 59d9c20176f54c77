"""MARS's registered methods: `mars`, the MaRS paper's method as its sources write it, and the paper's ablations
built on it; `mars-memcl`, memcl's MARS (the paper's method with memcl's extensions, each a knob), and memcl's
variants of it; and the head they train (`distill`). Found by name through the registry (memcl_ops/methods.py).
docs/methods.md, "MARS: the paper's method and memcl's", says row by row what the paper says, what each runs and
what each difference measured."""

from __future__ import annotations

from dataclasses import dataclass

from memcl_ops.mars.head import DistillHead
from memcl_ops.spec import HeadFactory, MethodSpec
from memcl_ops.training import OptimConfig

HEADS: dict[str, HeadFactory] = {"distill": lambda dim, cfg, seed: DistillHead(dim, cfg.stage2, seed)}

# What makes `mars` the paper's method: the settings its sources state, and memcl's extensions off. They win over
# `--set`; every other MARS knob (the reconstructions where the sources are silent) keeps its default and its switch.
PAPER_STAGE2 = {"lambda_lwf": 1.0, "anchor_points": "slot", "lambda_anchor_ce": 0.0, "lambda_gaussian": 0.0,
                "new_class_init": "zero"}
PAPER = {"sgse": {"signal": "paper"}, "router": {"query_init": "orthogonal"},
         "stage1": {"train_query": True, "optim": OptimConfig(epochs=20), "smooth_target": "raw"},
         "stage2": PAPER_STAGE2}


@dataclass(frozen=True)
class Extension:
    """One of memcl's extensions of the paper's MARS: what it changes, and the settings (dotted, under `method.`)
    that turn it off, giving the paper's method back."""

    name: str
    summary: str
    paper: dict[str, object]


# From the paper's MARS to memcl's, one extension at a time (the order of benchmarks/mars_steps.py's table): all of
# them off is `mars` (its fixed settings, PAPER; tests/unit/test_mars_methods.py), all on `mars-memcl`.
EXTENSIONS = [
    Extension("ln-target", "stage 1's smoothness term pulls h̃ towards LN(h), not h",
              {"stage1.smooth_target": "raw"}),
    Extension("fast-stage1", "stage 1 runs one fused-Adam epoch and keeps W_q the identity",
              {"stage1.optim.epochs": 20, "stage1.optim.fused": False, "stage1.train_query": True,
               "router.query_init": "orthogonal"}),
    Extension("class-anchors", "stage 2 distils at an anchor per (slot, class), each old class weighed alike",
              {"stage2.anchor_points": "slot"}),
    Extension("anchor-ce", "stage 2 adds CE at the class anchors", {"stage2.lambda_anchor_ce": 0.0}),
    Extension("prototype-start", "a new class's column starts at its prototype", {"stage2.new_class_init": "zero"}),
    Extension("gaussian-replay", "stage 2 adds CE on draws from each earlier class's Gaussian",
              {"stage2.lambda_gaussian": 0.0}),
    Extension("lwf-0.3", "λ_LwF 0.3 instead of 1", {"stage2.lambda_lwf": 1.0}),
    Extension("reference-signal", "SGSE's calibrated reference signal on frozen features", {"sgse.signal": "paper"}),
]


def on_paper(**changes: dict[str, object]) -> dict[str, dict[str, object]]:
    """The paper's settings with some sections' settings changed (an ablation of `mars`)."""
    return {**PAPER, **{section: {**PAPER.get(section, {}), **values} for section, values in changes.items()}}


METHODS = [
    MethodSpec("mars", "MARS as its paper writes it: SGSE on the routing confidence, stage 1 trains W_q, keys and "
               "affines for 20 epochs with the smoothness term on h, stage 2 is CE + LwF + KD at one anchor per slot",
               head="distill", memory=True, sgse=True, stage1=True, fixed=PAPER, role="paper"),
    # The paper's ablations, each on the paper's method. No-Stage2 keeps the classifier (something must classify)
    # but drops stage 2's distillation (LwF and the anchor KD): the head is trained by CE alone on h̃.
    MethodSpec("mars-no-sgse", "the paper's MARS with its initial slots only (no SGSE expansion)", head="distill",
               memory=True, stage1=True, fixed=PAPER, role="ablation"),
    MethodSpec("mars-no-anchor", "the paper's MARS without the anchor KD in stage 2", head="distill", memory=True,
               sgse=True, stage1=True, fixed=on_paper(stage2={"lambda_anchor": 0.0}), role="ablation"),
    MethodSpec("mars-no-stage1", "the paper's MARS without stage 1 (the memory keeps its initial parameters)",
               head="distill", memory=True, sgse=True, fixed=PAPER, role="ablation"),
    MethodSpec("mars-no-stage2", "the paper's MARS without stage 2's distillation (CE only on h̃)", head="distill",
               memory=True, sgse=True, stage1=True, fixed=on_paper(stage2={"lambda_lwf": 0.0, "lambda_anchor": 0.0}),
               role="ablation"),
    # memcl's MARS: every extension at its default (MethodConfig's), each a knob that `--set` turns off
    MethodSpec("mars-memcl", "memcl's MARS: the paper's router, SGSE and two stages with memcl's extensions (SGSE's "
               "calibrated reference signal, one stage-1 epoch, an anchor per slot and class with CE there, "
               "prototype starts, Gaussian replay of old classes)", head="distill", memory=True, sgse=True,
               stage1=True),
    # SGSE's signal alone: the paper's routing confidence breaks SGSE's slot bound on long recurring streams, the
    # calibrated reference signal keeps it (docs/methods.md, "Which signal is the default")
    MethodSpec("mars-memcl-paper-signal", "memcl's MARS with the paper's SGSE signal (routing confidence against a "
               "quantile)", head="distill", memory=True, sgse=True, stage1=True, fixed={"sgse": {"signal": "paper"}},
               role="ablation"),
    MethodSpec("mars-analytic", "memcl's MARS memory (SGSE + DCDA stage 1) with the analytic ridge head on h̃",
               head="analytic", memory=True, sgse=True, stage1=True, fixed={"analytic": {"expansion_dim": 0}}),
]
