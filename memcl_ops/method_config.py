"""The typed configs of every method: `MethodConfig` (the "features" and "nsr" families, `memcl run`'s `method`
section) and `LMMethodConfig` (the "lm" family, `memcl lm`'s). Every tunable default lives here or in the family
config it nests, once; a method's own settings are fixed by its `MethodSpec` (memcl_ops/spec.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memcl_ops.analytic.ridge import AnalyticConfig
from memcl_ops.baselines.heads import BlindConfig, DERppConfig, EWCConfig, SLDAConfig
from memcl_ops.baselines.lm_finetune import FinetuneConfig
from memcl_ops.baselines.text_replay import ReplayConfig
from memcl_ops.head_training import Stage2Config
from memcl_ops.mars.dcda import Stage1Config
from memcl_ops.mars.router import RouterConfig
from memcl_ops.mars.sgse import SGSEConfig
from memcl_ops.miita.directions import AdaptConfig, MemoryConfig
from memcl_ops.miita.store import HybridConfig
from memcl_ops.nsr.adapter import NSRConfig


@dataclass(frozen=True)
class MethodConfig:
    """Every method knob, with its default (the [R] ones documented where they are used)."""

    name: str = "mars-memcl"  # a registered method (`memcl list methods`)
    router: RouterConfig = RouterConfig()
    sgse: SGSEConfig = SGSEConfig()
    stage1: Stage1Config = Stage1Config()
    stage2: Stage2Config = Stage2Config()
    ewc: EWCConfig = EWCConfig()
    derpp: DERppConfig = DERppConfig()
    slda: SLDAConfig = SLDAConfig()
    blind: BlindConfig = BlindConfig()
    nsr: NSRConfig = NSRConfig()
    analytic: AnalyticConfig = AnalyticConfig()
    consolidate_every: int = 8  # task-free mode: run stage 1 + 2 every K batches
    # what answers for the classes a trained head has not learned yet, between its consolidations: "ridge", the
    # analytic head of the raw features ((d+1)(d+2)/2 sums and a Cholesky of d+1 per batch), or "nearest-mean", the
    # Euclidean class means (a sum per class: for a large feature dimension d or a tight memory) [R]
    interim: Literal["ridge", "nearest-mean"] = "ridge"



@dataclass(frozen=True)
class LMMethodConfig:
    memory: MemoryConfig = MemoryConfig()
    adapt: AdaptConfig = AdaptConfig()
    replay: ReplayConfig = ReplayConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    hybrid: HybridConfig = HybridConfig()

