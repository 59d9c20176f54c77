"""The baselines' registered methods: the heads MARS is compared with on the same frozen features (and the heads
they train), and the LM family's frozen base, text replay and sequential LoRA. Found by name through the registry
(memcl_ops/methods.py)."""

from __future__ import annotations

from memcl_ops.baselines.heads import BlindHead, DERppHead, EWCHead, JointHead, NearestMeanHead, StreamingLDAHead
from memcl_ops.head_training import NO_DISTILL, NO_OLD_CLASS_TERMS
from memcl_ops.spec import HeadFactory, MethodSpec

HEADS: dict[str, HeadFactory] = {
    "ewc": lambda dim, cfg, seed: EWCHead(dim, cfg.stage2, cfg.ewc, seed),
    "derpp": lambda dim, cfg, seed: DERppHead(dim, cfg.stage2, cfg.derpp, seed),
    "nearest-mean": lambda dim, cfg, seed: NearestMeanHead(dim),
    "slda": lambda dim, cfg, seed: StreamingLDAHead(dim, cfg.slda),
    "euclidean-mean": lambda dim, cfg, seed: StreamingLDAHead(dim, cfg.slda, covariance=False),
    "joint": lambda dim, cfg, seed: JointHead(dim, cfg.stage2, seed),
    "blind": lambda dim, cfg, seed: BlindHead(cfg.blind),
}

FEATURE_METHODS = [
    MethodSpec("finetune", "sequential cross-entropy on the frozen features (no memory, no distillation)",
               head="distill", fixed=NO_DISTILL, role="baseline"),
    MethodSpec("lwf", "LwF: CE + KD of the previous head on current inputs (DCDA stage 2 without memory, anchors)",
               head="distill", fixed={"stage2": {"lambda_lwf": 1.0, **NO_OLD_CLASS_TERMS}}, role="baseline"),
    MethodSpec("ewc", "online EWC: CE + diagonal-Fisher penalty on the head", head="ewc", role="baseline"),
    MethodSpec("derpp", "DER++: CE + logit and label replay from a reservoir buffer of features", head="derpp",
               uses_labels_of="seen", role="baseline", buffer=("derpp.buffer_size", "head.buffer")),
    MethodSpec("simplecil", "SimpleCIL: cosine nearest class mean, no training", head="nearest-mean", role="baseline"),
    MethodSpec("slda", "Streaming LDA: class means and one shared covariance, exact streaming sums, no training",
               head="slda", role="baseline"),
    MethodSpec("ncm", "Euclidean nearest class mean (CapyMOA's NCM), no training", head="euclidean-mean",
               role="baseline"),
    MethodSpec("blind", "the blind classifier: the most frequent of the last labels streamed, never the input (what "
               "test-then-train accuracy alone would reward)", head="blind",
               tags=frozenset({"task-free", "input-blind"}), role="baseline"),
    MethodSpec("joint", "joint training on all data seen so far (non-continual upper bound)", head="joint",
               uses_labels_of="seen", role="upper-bound"),
]

LM_METHODS = [
    MethodSpec("base", "the frozen causal LM, no memory", family="lm", tags=frozenset({"generative", "learns-nothing"}),
               role="baseline"),
    MethodSpec("replay", "text replay: stored examples, nearest by key, as demonstrations in the prompt (UTF-8 "
               "budget)", family="lm", tags=frozenset({"generative", "byte-budget", "demonstrations"}),
               role="baseline"),
    MethodSpec("lora", "sequential LoRA fine-tuning of q/v projections, no memory (forgetting reference)",
               family="lm", tags=frozenset({"generative", "trains-backbone"}), role="baseline"),
]
