"""MIITA's position-aware memory (memcl_ops/miita/answers.py): the flip step against a brute-force search on a tiny
LM, decoding that reproduces stored answers and stops, compact anchors within their stated error, bytes that equal
the stored arrays, centred keys, and repair that keeps every answer it can afford."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from memcl_ops.miita.answers import (
    POOLED_VOTE_BYTES,
    AnswerMemory,
    AnswerSteering,
    anchor_width,
    answer_prototype_bytes,
    centre_bytes,
    decode_anchor,
    encode_anchor,
    flip_step,
)
from memcl_ops.miita.directions import AdaptConfig, MemoryConfig
from memcl_ops.models.causal_lm import LMSpec, load_lm
from memcl_ops.tensors import array_bytes, normalize

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lm():
    return load_lm(LMSpec(name="tiny:llama-tied", micro_batch=4))


def test_flip_step_is_the_smallest_flipping_step_of_a_brute_force_scan(lm):
    """On the tiny LM's real final states: along d = Norm(W[y] − Wᵀp), the closed-form step (margin 0) is where a
    fine scan of α first makes y the argmax, whenever the scan finds one."""
    w = lm.weight.float()
    prompts = ["the cat sat on", "2 + 2 =", "hello there", "x y z", "a b", "one two three four"]
    hidden = torch.stack([lm.backbone(input_ids=torch.tensor([lm.prompt_ids(p)])).last_hidden_state[0, -1]
                          for p in prompts]).detach()
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(60):
        h = hidden[trial % len(hidden)].unsqueeze(0)
        logits = h @ w.T
        target = torch.tensor([int(rng.integers(0, lm.vocab_size))])
        d = normalize(w[target] - torch.softmax(logits, 1) @ w)
        alpha = float(flip_step(logits, d @ w.T, target, margin=0.0))
        grid = torch.linspace(0, 4 * float(h.norm()), 20001)
        wins = ((logits + grid[:, None] * (d @ w.T)).argmax(1) == target).nonzero()
        if not len(wins):
            continue
        first = float(grid[wins[0, 0]])
        lower = float(grid[max(wins[0, 0] - 1, 0)])
        if float(logits.argmax()) == float(target):
            assert alpha == 0.0
        else:
            assert lower - 1e-4 <= alpha <= first + 1e-4
        checked += 1
    assert checked >= 30


def test_a_step_is_zero_where_the_model_already_writes_the_token(lm):
    prompts = ["the cat sat on", "2 + 2 ="]
    h = torch.stack([lm.backbone(input_ids=torch.tensor([lm.prompt_ids(p)])).last_hidden_state[0, -1]
                     for p in prompts]).detach()
    logits = lm.head(h)
    memory = AnswerMemory(lm.hidden_size, lm.vocab_size, MemoryConfig(budget_bytes=64 * 1024, positions=4))
    keys = lm.query_keys(prompts)
    for k, token in zip(keys, logits.argmax(1)):  # the memory asks for what the model writes anyway
        memory.write(k, np.array([int(token), lm.answer_end_id]))
    step = AnswerSteering(memory, lm.weight, AdaptConfig())(keys)
    assert torch.equal(step(h, logits, 0), h)


def test_decoding_with_the_memory_writes_each_stored_answer_and_stops(lm):
    prompts = ["the cat sat on", "2 + 2 =", "name a colour", "x y z", "first letter of b", "ten minus one"]
    answers = [" mat", " 4", " teal blue", " w", " b", " nine"]
    memory = AnswerMemory(lm.hidden_size, lm.vocab_size, MemoryConfig(budget_bytes=64 * 1024, positions=16,
                                                                         anchor_code="float16"))
    for k, a in zip(lm.query_keys(prompts), answers):
        memory.write(k, np.array([*lm.answer_ids(a), lm.answer_end_id]))
    config = AdaptConfig(max_step=100.0, flip_iterations=32, vote_gate=False)  # the steps alone, no gate
    base = lm.generate(prompts, 12)
    adapted = lm.generate(prompts, 12, AnswerSteering(memory, lm.weight, config))
    assert all(t.strip() != a.strip() for t, a in zip(base.texts, answers))  # the random model knows none
    written = [row == [*lm.answer_ids(a), lm.answer_end_id] for row, a in zip(adapted.tokens, answers)]
    assert sum(written) >= 5, (adapted.texts, answers)
    # the same steps teacher-forced: the reference answers become far more likely
    nll_base = lm.generate(prompts, 1, answers=answers).answer_nll
    nll = lm.generate(prompts, 1, AnswerSteering(memory, lm.weight, config), answers=answers).answer_nll
    assert bool((nll < nll_base).all())


@pytest.mark.parametrize(("code", "floor"), [("float16", 0.9999), ("int8", 0.999), ("sign", 0.75)])
def test_compact_anchors_round_trip_within_their_stated_error(code, floor):
    """float16 and int8 keep cosine >= 0.9999 / 0.999; sign bits of a Gaussian direction keep
    E[cos] = sqrt(2/π) ≈ 0.80 (min over 200 vectors >= 0.75)."""
    hidden = 576
    v = normalize(torch.randn(200, hidden, generator=torch.Generator().manual_seed(1)))
    codes = encode_anchor(v, code)
    assert codes.nbytes == 200 * anchor_width(hidden, code)
    cos = (decode_anchor(codes, hidden, code) * v).sum(1)
    assert float(cos.min()) >= floor
    if code == "sign":
        assert abs(float(cos.mean()) - np.sqrt(2 / np.pi)) < 0.01


def clustered_keys(rng: np.random.Generator, n: int, clusters: int, hidden: int, template: float = 20.0
                   ) -> tuple[torch.Tensor, np.ndarray]:
    """Unit keys dominated by a shared template (raw cosines ≈ 0.997, as SmolLM2's) with a small per-cluster part."""
    common = rng.normal(size=hidden)
    centres = rng.normal(size=(clusters, hidden))
    labels = rng.integers(0, clusters, n)
    keys = template * common + centres[labels] + 0.5 * rng.normal(size=(n, hidden))
    return normalize(torch.tensor(keys, dtype=torch.float32)), labels


@pytest.mark.parametrize(("code", "centred"), [("sign", True), ("int8", True), ("sign", False)])
def test_bytes_equal_the_stored_arrays_and_the_budget_holds_after_every_write(code, centred):
    rng = np.random.default_rng(2)
    hidden, vocab = 64, 1000
    config = MemoryConfig(budget_bytes=900, positions=4, anchor_code=code, centre_keys=centred)
    memory = AnswerMemory(hidden, vocab, config)
    keys, labels = clustered_keys(rng, 80, 6, hidden)
    for k, c in zip(keys, labels):
        memory.write(k, np.array([10 + int(c), 999][: 1 + int(c) % 2]))
        assert memory.nbytes() <= config.budget_bytes
        assert memory.nbytes() == array_bytes(memory.state())
    restored = AnswerMemory.from_state(memory.state(), hidden, vocab, config)
    assert restored.nbytes() == memory.nbytes() and len(restored) == len(memory)
    steer, back = AnswerSteering(memory, torch.randn(vocab, hidden), AdaptConfig()), AnswerSteering(
        restored, torch.randn(vocab, hidden), AdaptConfig())
    assert steer.nearest_answers(keys) == back.nearest_answers(keys)


def test_centred_keys_make_sign_anchors_retrieve_over_seeded_trials():
    """Raw keys share a dominant template: their sign bits mostly agree, so sign anchors of raw keys lose most of
    what tells prompts apart; centred, they find the right answer for held-out keys."""
    hidden, vocab, clusters = 128, 100, 5
    accuracy = {True: [], False: []}
    for seed in range(10):
        for centre in (True, False):
            rng = np.random.default_rng(seed)
            keys, labels = clustered_keys(rng, 140, clusters, hidden)
            memory = AnswerMemory(hidden, vocab, MemoryConfig(budget_bytes=64 * 1024, positions=2, centre_keys=centre))
            for k, c in zip(keys[:100], labels[:100]):
                memory.write(k, np.array([int(c), 99]))
            got = AnswerSteering(memory, torch.randn(vocab, hidden), AdaptConfig()).nearest_answers(keys[100:])
            accuracy[centre].append(np.mean([g[0] == c for g, c in zip(got, labels[100:])]))
    gain = np.array(accuracy[True]) - np.array(accuracy[False])
    assert np.median(accuracy[True]) > 0.9
    assert (gain > 0).sum() >= 8 and np.median(gain) >= 0.05


def test_repair_keeps_every_answer_it_can_afford():
    """Over budget, anchors of one answer merge before two answers do: with room for six one-anchor prototypes,
    six well-separated answers all survive 120 writes (keys centred: the synthetic template would hide them)."""
    rng = np.random.default_rng(3)
    hidden, vocab = 64, 100
    one = answer_prototype_bytes(hidden, 2, 1, "sign", votes=True)
    pooled = POOLED_VOTE_BYTES * (1 + 2 * 2)
    budget = centre_bytes(hidden) + pooled + 6 * one + anchor_width(hidden, "sign") - 1  # no room for a seventh anchor
    memory = AnswerMemory(hidden, vocab, MemoryConfig(budget_bytes=budget, positions=2, centre_keys=True))
    keys, labels = clustered_keys(rng, 120, 6, hidden)
    for k, c in zip(keys, labels):
        memory.write(k, np.array([int(c), 99]))
    assert sorted(int(a[0]) for a in memory.answers) == list(range(6))
    assert memory.repairs > 0 and memory.num_anchors == 6


END = 99  # the end-of-answer token of the synthetic answers


def test_a_prototype_merged_into_another_answer_keeps_only_the_votes_that_answer_won():
    """Two prototypes of different labels merge when a third answer needs the room: the kept prototype's record adds
    the dropped one's trials and model hits, and its hits only where the two answers agree, so the dropped label's
    wins never vouch for the kept label."""
    hidden, vocab = 64, 100
    for seed in range(10):
        rng = np.random.default_rng(seed)
        common, near, far = rng.normal(size=(3, hidden))
        centres = {1: near, 2: near + 0.8 * rng.normal(size=hidden), 3: far}  # labels 1 and 2: neighbouring keys
        stream = [1] * 12 + [2] * 8 + [3]
        keys = normalize(torch.tensor(np.array([20 * common + centres[c] + 0.2 * rng.normal(size=hidden)
                                                for c in stream]), dtype=torch.float32))
        model = {1: 7, 2: 2, 3: 7}  # the model's own first token: right on label 2 only
        roomy = MemoryConfig(budget_bytes=64 * 1024, positions=2, centre_keys=False, anchor_code="float16",
                             new_anchor=-1.0)
        tight = replace(roomy, budget_bytes=AnswerMemory(hidden, vocab, roomy).fixed_bytes()
                        + 2 * answer_prototype_bytes(hidden, 2, 1, "float16", votes=True))
        apart, merged = AnswerMemory(hidden, vocab, roomy), AnswerMemory(hidden, vocab, tight)
        for k, c in zip(keys, stream):
            for memory in (apart, merged):
                memory.write(k, np.array([c, END]), model_tokens=np.array([model[c], END]))
        assert [int(a[0]) for a in merged.answers] == [1, 3], seed  # label 2 merged into label 1 (the larger count)
        assert [int(a[0]) for a in apart.answers] == [1, 2, 3]
        assert merged.trials[0] == apart.trials[0] + apart.trials[1]
        assert list(merged.hits[0]) == [apart.hits[0][0], apart.hits[0][1] + apart.hits[1][1]], seed
        assert list(merged.model_hits[0]) == list(apart.model_hits[0] + apart.model_hits[1]), seed
        assert apart.hits[1][0] > 0  # the dropped label had wins of its own to leave out


def steered_positions(memory: AnswerMemory, queries: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B, 2): whether the memory steers each query at answer positions 0 and 1 (the default gate)."""
    step = AnswerSteering(memory, weight, AdaptConfig())(queries)
    return torch.stack([step.target(t)[1] for t in range(2)], dim=1)


def test_the_vote_record_opens_the_gate_where_answers_repeat_and_closes_it_where_they_do_not():
    """Over seeded trials: on clustered keys whose answers repeat per cluster the memory steers the content
    position; on the same keys with an answer of their own each, it leaves the content position to the model and
    still steers the end of the answer, the one token every stored answer shares; and where the model's own token
    was the answer more often than the memory's, it leaves the model alone even though answers repeat."""
    hidden, vocab = 64, 100
    config = MemoryConfig(budget_bytes=64 * 1024, positions=2, centre_keys=True)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        keys, labels = clustered_keys(rng, 90, 5, hidden)
        weight = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed))
        repeating, own, known = (AnswerMemory(hidden, vocab, config) for _ in range(3))
        for i, (k, c) in enumerate(zip(keys[:60], labels[:60])):
            wrong_end = np.array([int(c), END + 1])  # the model knows the label but not where the answer ends
            repeating.write(k, np.array([int(c), END]), model_tokens=np.array([END - 1, END]))
            own.write(k, np.array([i % 60 + 10 if i % 60 + 10 != END else 5, END]))
            known.write(k, np.array([int(c), END]), model_tokens=wrong_end)
        on_repeating = steered_positions(repeating, keys[60:], weight)
        on_own = steered_positions(own, keys[60:], weight)
        on_known = steered_positions(known, keys[60:], weight)
        assert on_repeating[:, 0].float().mean() >= 0.9, seed
        assert not on_repeating[:, 1].any(), seed  # the model ends the answer itself: nothing to gain there
        assert on_own[:, 0].float().mean() <= 0.1, seed
        assert on_own[:, 1].all(), seed  # the form every answer shares still transfers
        assert not on_known[:, 0].any() and on_known[:, 1].all(), seed


def test_miita_takes_the_form_of_answers_that_do_not_repeat_and_never_their_content(lm):
    """A stream whose answers never repeat (two letters each, a distinct first letter): ungated, MIITA writes the
    nearest stored answer, its neighbour's content; gated, it keeps what every answer shares (the leading space, the
    length: the end token after two letters) and leaves the letters to the model."""
    train = [f"fact {i}: the thing called {w} lives at" for i, w in enumerate(NOUN_SAMPLE)]
    answers = [f"{chr(97 + i)}{chr(97 + (7 * i) % 26)}" for i in range(len(train))]
    test = [f"fact {i + 100}: the thing called {w} sits near" for i, w in enumerate(NOUN_SAMPLE[::-1])]
    memory = AnswerMemory(lm.hidden_size, lm.vocab_size, MemoryConfig(budget_bytes=64 * 1024, positions=4))
    written = lm.teacher_forced(train, answers)
    for k, a, own in zip(written.keys, answers, written.model_tokens):
        memory.write(k, np.array([*lm.answer_ids(a), lm.answer_end_id]), model_tokens=np.array(own))
    steering = AnswerSteering(memory, lm.weight, AdaptConfig(max_step=100.0))
    nearest = steering.nearest_answers(lm.query_keys(test))
    gated = lm.generate(test, 6, steering).tokens
    copied = lm.generate(test, 6, AnswerSteering(memory, lm.weight, AdaptConfig(max_step=100.0,
                                                                                vote_gate=False))).tokens
    assert copied == nearest
    assert all(g[1:3] != n[1:3] for g, n in zip(gated, nearest))  # no neighbour's letters
    assert all(g[0] == n[0] and g[3:] == [lm.answer_end_id] for g, n in zip(gated, nearest))


NOUN_SAMPLE = ("apple", "river", "candle", "tiger", "window", "bottle", "garden", "pencil", "mirror", "rocket",
               "blanket", "carrot", "island", "ladder", "magnet", "orange", "pillow", "saddle", "teapot", "violin")


def test_admitting_only_where_the_memory_is_ahead_spends_no_bytes_on_answers_it_cannot_give():
    """Over seeded trials, `admit: ahead` (miita-replay's): where answers repeat, every label is stored; where each
    answer is its own and the model's own first token does as well as the nearest stored one (never right, both),
    new answers stop being stored once the record shows it, and the bytes stay free for demonstrations."""
    hidden, vocab = 64, 100
    for seed in range(10):
        rng = np.random.default_rng(seed)
        keys, labels = clustered_keys(rng, 60, 5, hidden)
        config = MemoryConfig(budget_bytes=64 * 1024, positions=2, centre_keys=True, admit="ahead")
        repeating, own = AnswerMemory(hidden, vocab, config), AnswerMemory(hidden, vocab, config)
        for i, (k, c) in enumerate(zip(keys, labels)):
            repeating.write(k, np.array([int(c), END]), model_tokens=np.array([END - 1, END - 1]))
            own.write(k, np.array([10 + i, END]), model_tokens=np.array([END - 1, END - 1]))
        assert sorted(int(a[0]) for a in repeating.answers) == sorted(set(labels.tolist())), seed
        assert len(own) <= 5 and own.pooled_trials == len(keys) - 1, (seed, len(own))  # the record still learns
        everything = AnswerMemory(hidden, vocab, replace(config, admit="all"))
        for i, k in enumerate(keys):
            everything.write(k, np.array([10 + i, END]))
        assert len(everything) == len(keys)
