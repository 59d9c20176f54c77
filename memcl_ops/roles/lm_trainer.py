"""The LMTrainer role: the sequential LoRA fine-tuning baseline on its own copy of the causal LM (the frozen
`LMEncoder` never changes). Trains on text-pair batches task after task and generates with the adapter.

Several trainers can learn as one, data-parallel (`join`): every worker takes `train` (REPLICATED), each learning its
share of every minibatch's pairs with DDP all-reducing the gradients (memcl_ops/data_parallel.py); worker 0 alone
answers the rest (generation, its state stands for the group's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.arrow.schema import with_predictions
from memcl_ops.baselines.lm_finetune import FinetuneConfig, finetune
from memcl_ops.clock import StageClock
from memcl_ops.data_parallel import DataParallel, data_parallel, join_group
from memcl_ops.models.causal_lm import LMSpec, load_lm
from memcl_ops.models.lora import LoRAAdapters
from memcl_ops.tensors import SampleIds, prefixed, state_part

# the calls every data-parallel worker takes (they change what the workers learn); the others go to worker 0
REPLICATED = frozenset({"train"})


class LMTrainer:
    """`threads`: the hosting process's torch threads (None: leave them)."""

    def __init__(self, spec: LMSpec, config: FinetuneConfig, seed: int, threads: int | None = None):
        self.reset(spec, config, seed, threads)

    def reset(self, spec: LMSpec, config: FinetuneConfig, seed: int, threads: int | None = None) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        if getattr(self, "spec", None) != spec:
            self.lm = load_lm(spec)
            self.spec = spec
        elif hasattr(self, "adapters"):
            self.adapters.remove()
        self.adapters = LoRAAdapters(self.lm.model, config.lora)
        self.config, self.seed = config, seed
        self.parallel: DataParallel | None = None  # set by `join`, after every reset
        self.rounds = 0
        self.learned = SampleIds()  # sample ids trained on, for exactly-once accounting
        self.clock = StageClock()

    @property
    def device(self) -> torch.device:
        """Where the LoRA factors train."""
        return self.lm.device

    def join(self, address: str, rank: int, world: int, whole_gpus: bool = False) -> None:
        """Become worker `rank` of `world` trainers learning as one (after every reset): join their process group at
        `address` (worker 0's `rendezvous_address`; NCCL when every worker has a GPU of its own, `whole_gpus`, else
        gloo) and wrap the LM's backbone in DDP."""
        synchronised = {id(p) for p in self.lm.backbone.parameters()}
        if not all(id(p) in synchronised for p in self.adapters.parameters()):  # e.g. a site on the LM head
            raise ValueError("the LoRA trainer learns data-parallel only with LoRA sites inside the LM's backbone: "
                             f"{self.config.lora.targets} reaches beyond it")
        join_group(address, rank, world, nccl=whole_gpus and self.lm.device.type == "cuda")
        # every LoRA site lies on the answer loss's path: DDP need not search the graph for unused ones
        self.parallel = data_parallel(self.lm.backbone, rank, world, find_unused=False)

    def train(self, *batches: pa.RecordBatch) -> list[float]:
        """LoRA epochs on the pairs of `batches` (one task's data); returns the loss per epoch."""
        with self.clock.time("train"):
            history = finetune(self.lm, self.adapters, batches, self.config.optim,
                               seed=self.seed * 100_003 + self.rounds, parallel=self.parallel)
            self.rounds += 1
            for b in batches:
                self.learned.add(S.sample_ids_to_numpy(b))
            return history

    def generate(self, pairs: pa.RecordBatch, max_new_tokens: int) -> pa.RecordBatch:
        with self.clock.time("generate"):
            prompts, answers = S.text_pairs(pairs)
            out = self.lm.generate(prompts, max_new_tokens, answers=answers)
            return with_predictions(pairs, out.texts, out.answer_nll, out.prompt_tokens)

    def memory_bytes(self) -> dict[str, int]:
        """The adapter is trained state, not memory of past data; reported for completeness."""
        return {"adapter": int(sum(v.nbytes for v in self.adapters.factors().values()))}

    def learned_counts(self) -> tuple[int, int]:
        """(pairs trained on, distinct sample ids among them)."""
        return self.learned.added, len(self.learned)

    def state(self) -> dict[str, np.ndarray]:
        return {**{f"lora.{k}": v for k, v in self.adapters.factors().items()}, "rounds": np.array(self.rounds),
                **prefixed("learned", self.learned.state())}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self.adapters.load_factors({k[5:]: v for k, v in state.items() if k.startswith("lora.")})
        self.rounds = int(state["rounds"])
        self.learned.restore(state_part(state, "learned"))

    def timings(self) -> dict:
        return self.clock.report()
