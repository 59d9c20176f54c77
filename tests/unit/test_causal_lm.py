"""The frozen causal-LM view MIITA relies on, checked on tiny random transformers models of four families
(Llama untied and tied, GPT-2, Qwen2): closed forms against autograd, padding invariance, the decoding loop
against transformers' own greedy generate, and the adapted loop's effect on the KV cache."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from memcl_ops.baselines.lm_finetune import FinetuneConfig, minibatch_loss
from memcl_ops.data_parallel import DataParallel
from memcl_ops.miita.answers import AnswerMemory, AnswerSteering
from memcl_ops.miita.directions import Adaptation, AdaptConfig, DirectionMemory, MemoryConfig
from memcl_ops.models.causal_lm import TINY_ARCHS, CausalLM, LMSpec, load_lm, tiny_causal_lm
from memcl_ops.models.lora import LoRAAdapters

PROMPTS = ["the cat sat on", "2 + 2 =", "a much longer prompt than the others, with commas", "x"]
ANSWERS = [" mat", " 4", " yes it is", " zz"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=TINY_ARCHS)
def lm(request) -> CausalLM:
    return load_lm(LMSpec(name=f"tiny:{request.param}", micro_batch=3))


def autograd_correction(lm: CausalLM, prompt: str, answer: str) -> torch.Tensor:
    """−∂L/∂h_out summed over the answer positions, L = mean cross-entropy of the answer tokens."""
    p, a = lm.prompt_ids(prompt), lm.answer_ids(answer)
    ids = torch.tensor([p + a])
    with torch.no_grad():
        h = lm.backbone(input_ids=ids).last_hidden_state[0]
    h = h.detach().requires_grad_(True)
    positions = torch.arange(len(p) - 1, len(p) - 1 + len(a))
    loss = F.cross_entropy(lm.head(h[positions]), torch.tensor(a))
    (grad,) = torch.autograd.grad(loss, h)
    return -grad[positions].sum(dim=0)


def test_tiny_models_cover_tied_and_untied_heads(lm):
    tied = lm.weight is lm.model.get_input_embeddings().weight
    assert tied == (lm.model.config.model_type == "gpt2" or lm.model.config.tie_word_embeddings)
    assert tied == (lm.model.config.model_type != "qwen2" and lm.spec.name != "tiny:llama")


def test_closed_form_correction_equals_autograd(lm):
    out = lm.teacher_forced(PROMPTS, ANSWERS)  # batched, with padding
    for i, (prompt, answer) in enumerate(zip(PROMPTS, ANSWERS)):
        expected = autograd_correction(lm, prompt, answer)
        assert torch.allclose(out.corrections[i], expected, atol=1e-6, rtol=1e-4), (i, out.corrections[i], expected)
    assert out.corrections.norm(dim=1).min() > 0


def test_loss_matches_the_model_cross_entropy(lm):
    out = lm.teacher_forced(PROMPTS[:2], ANSWERS[:2])
    for i in range(2):
        p, a = lm.prompt_ids(PROMPTS[i]), lm.answer_ids(ANSWERS[i])
        with torch.no_grad():
            logits = lm.model(torch.tensor([p + a])).logits[0, len(p) - 1:-1]
        assert torch.allclose(out.loss[i], F.cross_entropy(logits, torch.tensor(a)), atol=1e-5)


def test_keys_are_the_normalised_mean_over_the_prompt_tokens_and_ignore_padding(lm):
    batched = lm.teacher_forced(PROMPTS, ANSWERS).keys
    for i, prompt in enumerate(PROMPTS):
        tokens = lm.prompt_tokens(prompt)
        assert lm.tokenizer.decode(tokens.ids[slice(*tokens.key_span)]) == prompt  # X_m: the prompt's own tokens
        with torch.no_grad():
            states = lm.backbone(input_ids=torch.tensor([tokens.ids]), output_hidden_states=True).hidden_states
        mean = states[lm.key_layer][0, slice(*tokens.key_span)].mean(dim=0)
        assert torch.allclose(batched[i], mean / mean.norm(), atol=1e-5)
    # the key does not see the answer, and the same prompt read for generation (left padded) gives the same key
    assert torch.allclose(lm.query_keys(PROMPTS), batched, atol=1e-5)
    assert torch.allclose(lm.generate(PROMPTS, 1).query_keys, batched, atol=1e-5)


def test_key_positions_all_takes_every_input_token():
    every = load_lm(LMSpec(name="tiny:llama", key_positions="all"))
    tokens = every.prompt_tokens("abc", [("q", "a")])
    assert tokens.key_span == (0, len(tokens.ids)) and len(tokens.ids) > len("abc")


def test_greedy_loop_matches_transformers_generate(lm):
    for prompt in PROMPTS:
        ids = lm.prompt_ids(prompt)
        ours = lm.generate([prompt], 6).tokens[0]
        theirs = lm.model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                                   eos_token_id=sorted(lm.stop_ids), pad_token_id=lm.pad_id)[0, len(ids):].tolist()
        assert ours == theirs[:len(ours)]


def test_answer_nll_during_generation_is_the_teacher_forced_loss_and_leaves_decoding_alone(lm):
    plain = lm.generate(PROMPTS, 5)
    scored = lm.generate(PROMPTS, 5, answers=ANSWERS)
    assert scored.tokens == plain.tokens  # the cache went back to the prompt before decoding
    assert torch.allclose(scored.answer_nll, lm.teacher_forced(PROMPTS, ANSWERS).loss, atol=1e-4)
    adapted = lm.generate(PROMPTS, 5, Adaptation(filled_memory(lm), lm.weight, AdaptConfig(
        step=1.0, entropy_threshold=-1.0, relevance_threshold=-1.0)), answers=ANSWERS)
    assert not torch.allclose(adapted.answer_nll, scored.answer_nll)


def test_batched_generation_equals_one_by_one(lm):
    together = lm.generate(PROMPTS, 5).tokens
    alone = [lm.generate([p], 5).tokens[0] for p in PROMPTS]
    assert together == alone


def filled_memory(lm: CausalLM) -> DirectionMemory:
    memory = DirectionMemory(lm.hidden_size, lm.hidden_size, MemoryConfig(budget_bytes=64 * 1024))
    out = lm.teacher_forced(PROMPTS, ANSWERS)
    for k, r in zip(out.keys, out.corrections):
        memory.write(k, r)
    return memory


class Recorder:
    """Wraps an adapter factory and keeps every (h, h̃) pair its steps produced."""

    def __init__(self, factory):
        self.factory, self.pairs = factory, []

    def __call__(self, keys):
        return RecordedStep(self, self.factory(keys))


class RecordedStep:
    def __init__(self, recorder, step):
        self.recorder, self.step = recorder, step

    def __call__(self, hidden, logits, position):
        edited = self.step(hidden, logits, position)
        self.recorder.pairs.append((hidden.clone(), edited.clone()))
        return edited

    def select(self, rows):
        return RecordedStep(self.recorder, self.step.select(rows))


def test_zero_step_is_bit_identical_to_the_base_model(lm):
    memory = filled_memory(lm)
    base = lm.generate(PROMPTS, 8)
    always_on = AdaptConfig(step=0.0, entropy_threshold=-1.0, relevance_threshold=-1.0)
    recorder = Recorder(Adaptation(memory, lm.weight, always_on))
    zero = lm.generate(PROMPTS, 8, adapter=recorder)
    assert zero.tokens == base.tokens
    assert recorder.pairs and all(torch.equal(h, edited) for h, edited in recorder.pairs)
    # the same memory with a real step does change the output (so the comparison above can fail)
    strong = lm.generate(PROMPTS, 8, adapter=Adaptation(memory, lm.weight, AdaptConfig(
        step=2.0, entropy_threshold=-1.0, relevance_threshold=-1.0)))
    assert strong.tokens != base.tokens


def test_adapted_steps_never_enter_the_kv_cache(lm):
    memory = filled_memory(lm)
    config = AdaptConfig(step=2.0, entropy_threshold=-1.0, relevance_threshold=-1.0)
    prompts = PROMPTS[:2]
    adapted = lm.generate(prompts, 6, adapter=Adaptation(memory, lm.weight, config))
    assert adapted.tokens != lm.generate(prompts, 6).tokens  # the adaptation changed what was generated
    # replay the adapted tokens through the plain backbone, step by step exactly as the loop feeds them
    seqs = [lm.prompt_ids(p) for p in prompts]
    width = max(map(len, seqs))
    ids = torch.tensor([[lm.pad_id] * (width - len(s)) + s for s in seqs])
    mask = (torch.arange(width) >= torch.tensor([width - len(s) for s in seqs]).unsqueeze(1)).long()
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        out = lm.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache, position = out.cache, positions[:, -1]
        steps = len(adapted.tokens[0]) - 1
        for t in range(steps):
            token = torch.tensor([row[t] for row in adapted.tokens])
            mask = torch.cat([mask, torch.ones(len(seqs), 1, dtype=mask.dtype)], dim=1)
            position = position + 1
            cache = lm.backbone(input_ids=token.unsqueeze(1), attention_mask=mask, position_ids=position.unsqueeze(1),
                                cache=cache, use_cache=True).cache
    assert all(len(row) == steps + 1 for row in adapted.tokens)  # no early stop: both caches cover every step
    for ours, plain in zip(adapted.cache.layers, cache.layers):
        assert torch.equal(ours.keys, plain.keys) and torch.equal(ours.values, plain.values)


def test_bad_input_is_refused(lm):
    with pytest.raises(ValueError, match="2 prompts but 1 answers"):
        lm.teacher_forced(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="is blank"):
        lm.teacher_forced(["a"], [""])
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate(["a"], 0)
    with pytest.raises(ValueError, match="key_layer 9"):
        load_lm(LMSpec(name="tiny:llama", key_layer=9))
    with pytest.raises(ValueError, match="unknown causal LM"):
        load_lm(LMSpec(name="gpt-7"))


# A task's prompts as SuperNI writes them: one long definition, then each instance.
DEFINITION = "In this task you are given a short phrase. Answer with the phrase's first word, then stop."
TASK_PROMPTS = [f"{DEFINITION}\n\nInput: {x}\nOutput:" for x in
                ("red apples fall", "blue", "a much longer instance than the others, with commas, and more", "zz top",
                 "q")]


@pytest.fixture(scope="module", params=TINY_ARCHS)
def whole_and_shared(request) -> tuple[CausalLM, CausalLM]:
    """The same tiny LM (initialised so that its answers depend on the prompt) twice: reading each prompt whole, and
    taking the prompts' shared prefix from its cache."""
    arch = request.param
    return tuple(CausalLM(*tiny_causal_lm(arch, init_range=0.5),
                          LMSpec(name=f"tiny:{arch}", micro_batch=3, reuse_prefix=reuse)) for reuse in (False, True))


def test_a_task_prompts_share_a_prefix_that_is_read_once(whole_and_shared):
    whole, shared = whole_and_shared
    seqs = [shared.prompt_tokens(p) for p in TASK_PROMPTS]
    common = shared.shared_prefix(seqs)
    assert common >= len(shared.tokenizer(DEFINITION)["input_ids"])  # the definition is in it
    assert all(s.ids[:common] == seqs[0].ids[:common] for s in seqs)
    assert whole.shared_prefix(seqs) == 0
    shared.forget_prefixes()
    shared.generate(TASK_PROMPTS, 4)
    shared.generate(TASK_PROMPTS[:2], 4)  # a later batch of the same task reuses the cached prefix
    assert [key[1:] for key in shared._prefixes] == [tuple(seqs[0].ids[:common])]


def test_the_shared_prefix_cache_gives_the_whole_prompt_answers_token_for_token(whole_and_shared):
    whole, shared = whole_and_shared
    for prompts in (TASK_PROMPTS, TASK_PROMPTS[::-1], PROMPTS):
        answers = ["x y"] * len(prompts)
        expected, got = whole.generate(prompts, 8, answers=answers), shared.generate(prompts, 8, answers=answers)
        assert len({tuple(row) for row in expected.tokens}) > 1  # the answers differ, so mixed-up rows would show
        assert got.tokens == expected.tokens
        assert torch.allclose(got.query_keys, expected.query_keys, atol=1e-5)
        assert torch.allclose(got.answer_nll, expected.answer_nll, atol=1e-4)
        assert torch.allclose(shared.query_keys(prompts), whole.query_keys(prompts), atol=1e-5)
        assert got.prompt_tokens == expected.prompt_tokens  # what a prompt costs to read is reported unchanged


def test_rows_that_stop_leave_the_batch_without_changing_the_others(whole_and_shared):
    for lm in whole_and_shared:
        first = lm.generate(TASK_PROMPTS[:1], 1).tokens[0][0]
        saved = lm.stop_ids
        lm.stop_ids = saved | {first}  # the first row stops at step 0; rows starting otherwise go on
        try:
            alone = [lm.generate([p], 8).tokens[0] for p in TASK_PROMPTS]
            together = lm.generate(TASK_PROMPTS, 8).tokens
        finally:
            lm.stop_ids = saved
        assert together[0] == [first] and max(map(len, together)) == 8
        assert together == alone


def test_steered_answers_of_different_lengths_are_the_same_read_whole_or_from_the_prefix(whole_and_shared):
    answers = [" red", " blue sky", " a", " zz top now", " q"]  # stop at different steps: rows leave the batch
    decoded = []
    for lm in whole_and_shared:
        memory = AnswerMemory(lm.hidden_size, lm.vocab_size, MemoryConfig(budget_bytes=64 * 1024, positions=16,
                                                                             anchor_code="float16"))
        for k, a in zip(lm.query_keys(TASK_PROMPTS), answers):
            memory.write(k, np.array([*lm.answer_ids(a), lm.answer_end_id]))
        steering = AnswerSteering(memory, lm.weight, AdaptConfig(max_step=100.0, flip_iterations=32, vote_gate=False))
        decoded.append(lm.generate(TASK_PROMPTS, 10, steering).tokens)
    assert decoded[0] == decoded[1]
    assert len({len(row) for row in decoded[1]}) > 1


def test_a_kept_prefix_is_read_again_once_the_weights_can_change(whole_and_shared):
    whole, shared = whole_and_shared
    shared.generate(TASK_PROMPTS, 4)  # keeps the task's prefix
    answers = []
    for lm in (whole, shared):
        saved = {k: v.clone() for k, v in lm.model.state_dict().items()}
        torch.manual_seed(0)
        try:  # what a trainer does: its weights require gradients, and a step changes them
            lm.model.requires_grad_(True)
            with torch.no_grad():
                for p in lm.model.parameters():
                    p.add_(0.2 * torch.randn_like(p))
            answers.append(lm.generate(TASK_PROMPTS, 6).tokens)
        finally:
            lm.model.load_state_dict(saved)
            lm.model.requires_grad_(False)
    assert not shared._prefixes  # nothing read while the weights could train was kept
    assert answers[0] == answers[1]
    assert answers[1] != shared.generate(TASK_PROMPTS, 6).tokens  # the step did change them


def test_the_model_own_teacher_forced_tokens_start_with_its_greedy_answer(whole_and_shared):
    lm = whole_and_shared[1]
    answers = ["x y", "blue", "a b c d", "zz", "q r"]
    forced = lm.teacher_forced(TASK_PROMPTS, answers)
    greedy = lm.generate(TASK_PROMPTS, 1).tokens
    for own, answer, first in zip(forced.model_tokens, answers, greedy):
        assert len(own) == len(lm.answer_ids(answer)) + 1  # each answer position and the one after it
        assert own[0] == first[0]  # nothing of the reference is read before position 0
    logits = lm.model(torch.tensor([lm.prompt_ids(TASK_PROMPTS[2]) + lm.answer_ids(answers[2])])).logits[0]
    assert forced.model_tokens[2] == logits[-len(lm.answer_ids(answers[2])) - 1:].argmax(dim=-1).tolist()


def test_data_parallel_shares_of_a_lora_minibatch_average_to_its_mean_gradient():
    """What DDP averages over the LoRA trainer's workers (each worker's weighed share of a minibatch's pairs, read
    through the backbone) is the gradient of the whole minibatch's mean answer loss, for shares of unequal size and
    with more workers than pairs."""
    lm = load_lm(LMSpec(name="tiny:llama"))
    adapters = LoRAAdapters(lm.model, FinetuneConfig().lora)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # factors away from B = 0, so that every one of them has a gradient
        for p in adapters.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    prompts, answers = [*PROMPTS, "one more", "and the last"], [*ANSWERS, " two", " end"]
    params = list(adapters.parameters())

    def gradient(loss: torch.Tensor) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        loss.backward()
        return [p.grad.clone() for p in params]

    whole = gradient(minibatch_loss(lm, prompts, answers))
    assert all(g.abs().sum() > 0 for g in whole)
    for world in (2, 4, 9):  # shares of 3 and 3; 2, 2, 1, 1; six of one pair and three of none
        total = [torch.zeros_like(g) for g in whole]
        for rank in range(world):
            share = gradient(minibatch_loss(lm, prompts, answers, DataParallel(rank, world, lm.backbone)))
            total = [t + g for t, g in zip(total, share, strict=True)]
        for averaged, expected in zip(total, whole, strict=True):
            torch.testing.assert_close(averaged / world, expected, rtol=1e-4, atol=1e-7)
    adapters.remove()
