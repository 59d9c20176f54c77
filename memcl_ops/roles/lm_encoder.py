"""The LMEncoder role: a frozen causal LM. It extracts MIITA's (key, correction) pairs from text-pair batches and
generates answers, plain, with a direction memory's temporary update, or after replayed demonstrations.

A role of its own rather than more methods on `Encoder`: it holds an LM and its tokenizer (not a feature
encoder), returns two vectors per row, and generates; its weights never change (the LoRA baseline trains in
`LMTrainer`, on its own copy)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.arrow.schema import with_predictions
from memcl_ops.clock import StageClock
from memcl_ops.miita.answers import adaptation, copy_answers, memory_from_state
from memcl_ops.miita.directions import AdaptConfig, MemoryConfig, extract_directions
from memcl_ops.models.causal_lm import LMSpec, load_lm


class LMEncoder:
    """`threads`: the hosting process's torch threads (None: leave them)."""

    def __init__(self, spec: LMSpec, threads: int | None = None):
        self.reset(spec, threads)

    def reset(self, spec: LMSpec, threads: int | None = None) -> None:
        self.clock = StageClock()
        if threads is not None:
            torch.set_num_threads(threads)
        if getattr(self, "spec", None) != spec:  # same frozen LM: keep the loaded weights
            self.lm = load_lm(spec)
            self.spec = spec

    @property
    def device(self) -> torch.device:
        """Where the LM extracts and answers."""
        return self.lm.device

    def info(self) -> dict:
        lm = self.lm
        return {"name": self.spec.name, "hidden": lm.hidden_size, "layers": lm.num_layers, "key_layer": lm.key_layer,
                "vocab": lm.vocab_size, "tied_head": lm.weight is lm.model.get_input_embeddings().weight}

    def extract(self, pairs: pa.RecordBatch) -> pa.RecordBatch:
        """Teacher-forced (k_m, R_m, ‖R_m‖) per pair (docs/methods.md, "MIITA"), no autograd."""
        with self.clock.time("extract"):
            return extract_directions(self.lm, pairs)

    def query_keys(self, pairs: pa.RecordBatch) -> np.ndarray:
        """k_q of each prompt alone (retrieval of replayed examples)."""
        with self.clock.time("query_keys"):
            prompts, _ = S.text_pairs(pairs)
            return self.lm.query_keys(prompts).numpy()

    def generate(self, pairs: pa.RecordBatch, max_new_tokens: int, prototypes: dict[str, np.ndarray] | None = None,
                 memory: MemoryConfig | None = None, adapt: AdaptConfig | None = None,
                 demonstrations: list[list[tuple[str, str]]] | None = None, query_keys: np.ndarray | None = None
                 ) -> pa.RecordBatch:
        """The pairs with `prediction` and `answer_nll` columns: greedy answers of the frozen LM (and the NLL of the
        reference answer), adapted by `prototypes` (a MIITA memory's state) when given, after per-row
        `demonstrations` when given (`query_keys`: the prompts' own keys, for the memory's retrieval). With
        `adapt.rule` "copy" the answer is the nearest prototype's stored tokens (no decoding, no NLL)."""
        with self.clock.time("generate"):
            prompts, answers = S.text_pairs(pairs)
            adapter = None
            if prototypes is not None:
                adapt = adapt or AdaptConfig()
                stored = memory_from_state(prototypes, self.lm.hidden_size, self.lm.vocab_size,
                                           memory or MemoryConfig())
                adapter = adaptation(stored, self.lm.weight, adapt)
                if adapt.rule == "copy":
                    texts = copy_answers(self.lm, adapter, prompts)
                    return with_predictions(pairs, texts, torch.full((len(prompts),), torch.nan),
                                            [len(self.lm.prompt_ids(p)) for p in prompts])
            keys = torch.from_numpy(np.array(query_keys)) if query_keys is not None else None
            out = self.lm.generate(prompts, max_new_tokens, adapter, demonstrations, answers, keys)
            return with_predictions(pairs, out.texts, out.answer_nll, out.prompt_tokens)

    def state(self) -> dict[str, np.ndarray]:
        return {}  # frozen: nothing to checkpoint

    def restore(self, state: dict[str, np.ndarray]) -> None:
        del state

    def timings(self) -> dict:
        return self.clock.report()
