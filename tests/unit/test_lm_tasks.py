"""The offline LM task stream and the text-pair Arrow contract it travels in."""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from memcl_ops.arrow import schema as S
from memcl_ops.data.lm_tasks import (
    BUILDERS,
    OPEN_ANSWERS,
    LMStreamSpec,
    build_stream,
    exact_match,
    normalise,
    read_fortunes,
    to_base5,
)


@pytest.fixture(scope="module")
def stream():
    return build_stream(LMStreamSpec(tasks=tuple(BUILDERS)))


def test_stream_has_every_task_at_the_requested_sizes(stream):
    assert [t.name for t in stream] == list(BUILDERS)
    for task in stream:
        assert (len(task.train), len(task.test)) == (24, 16)
        if task.name in OPEN_ANSWERS:  # free answers: none of the test answers is a training answer
            assert task.answers == () and not {p.answer for p in task.train} & {p.answer for p in task.test}
            assert not {p.prompt for p in task.train} & {p.prompt for p in task.test}
            continue
        assert all(p.answer in task.answers for p in (*task.train, *task.test)), task.name
        assert all(", ".join(task.answers[:2]) in p.prompt or task.name in ("last-letter", "made-up-base")
                   for p in task.test)


def test_held_out_tasks_do_not_share_items_and_fact_tasks_change_the_wording(stream):
    by_name = {t.name: t for t in stream}
    for name in ("bbc-topic", "fortune-topic", "last-letter", "sentiment-negation", "word-category"):
        task = by_name[name]
        assert not {p.prompt for p in task.train} & {p.prompt for p in task.test}, name
    for name in ("word-code", "made-up-base"):
        task = by_name[name]
        train_prompts = {p.prompt for p in task.train}
        assert not train_prompts & {p.prompt for p in task.test}
        # every tested fact was trained (in another wording) with the same answer
        trained = {(_quoted_item(p.prompt), p.answer) for p in task.train}
        assert all((_quoted_item(p.prompt), p.answer) in trained for p in task.test), name


def _quoted_item(prompt: str) -> str:
    """The fact a prompt asks about: the quoted word, or the trailing sum 'x + y'."""
    return prompt.split("'")[1] if "'" in prompt else " ".join(prompt.rstrip(".?").split()[-3:])


def test_classification_tasks_are_balanced(stream):
    for task in stream[:2]:
        counts = np.unique([p.answer for p in task.test], return_counts=True)[1]
        assert counts.max() - counts.min() <= 1, task.name


def test_stream_is_deterministic_per_seed_and_per_task():
    a = build_stream(LMStreamSpec(tasks=("word-code", "last-letter"), seed=3))
    b = build_stream(LMStreamSpec(tasks=("last-letter",), seed=3))
    assert a[1] == b[0]  # a task's draw does not depend on which tasks precede it
    assert build_stream(LMStreamSpec(tasks=("word-code",), seed=4))[0] != a[0]


def test_base_five_and_scoring():
    assert [to_base5(n) for n in (0, 4, 5, 8, 24)] == ["p", "t", "qp", "qs", "tt"]
    assert normalise('  "Sports."\nmore text') == "sports"
    assert exact_match("Tech!", "tech") and not exact_match("technology", "tech")


def test_fortunes_are_read_from_the_debian_files():
    entries = read_fortunes("food")
    assert len(entries) > 150 and all("%" not in e.split() for e in entries)


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="unknown LM task"):
        build_stream(LMStreamSpec(tasks=("bbc-topic", "poetry")))
    with pytest.raises(ValueError, match="leaves none to train"):
        build_stream(LMStreamSpec(tasks=("last-letter",), test_per_task=100))


def test_text_pair_batches_round_trip_and_refuse_blank_answers():
    batch = S.text_pair_batch(np.arange(5, 8), ["p1", "p2", "p3"], ["a1", "a2", "a3"], task_ids=np.array([1, 1, 1]))
    assert S.text_pairs(batch) == (["p1", "p2", "p3"], ["a1", "a2", "a3"])
    assert S.task_ids_to_numpy(batch).tolist() == [1, 1, 1]
    blank = S.text_pair_batch(np.arange(5, 8), ["p1", "p2", "p3"], ["a1", "  ", "a3"])
    with pytest.raises(S.BatchError, match=r"column 'answer'.*sample_ids=\[6\]"):
        S.text_pairs(blank)
    plain = S.raw_batch(np.arange(2), S.TEXT, ["x", "y"])
    with pytest.raises(S.BatchError, match="column 'answer'"):
        S.text_pairs(plain)
    wrong = plain.append_column("answer", pa.array([1, 2]))
    with pytest.raises(S.BatchError, match="expected string"):
        S.text_pairs(wrong)


def test_direction_batches_carry_keys_and_corrections():
    keys, dirs = np.random.default_rng(0).normal(size=(2, 3, 6)).astype(np.float32)
    batch = S.direction_batch(np.arange(3), keys, dirs, np.linalg.norm(dirs, axis=1), task_ids=np.zeros(3))
    np.testing.assert_array_equal(S.column_matrix(batch, S.KEY), keys)
    np.testing.assert_array_equal(S.column_matrix(batch, S.DIRECTION), dirs)
    S.validate(batch)
    with pytest.raises(ValueError, match="same rows"):
        S.direction_batch(np.arange(3), keys, dirs[:2], np.ones(2))


def test_rouge_l_matches_hand_computed_values():
    from memcl_ops.data.lm_tasks import rouge_l

    # LCS("the cat on the mat", "the cat sat on the mat") = 5 words: P = 5/5, R = 5/6, F = 2PR/(P+R) = 10/11
    assert rouge_l("the cat on the mat", ["the cat sat on the mat"]) == pytest.approx(10 / 11)
    # LCS = 2 ("a c") of 3 and 4 words: F = 2·(2/3)(2/4)/((2/3)+(2/4)) = 4/7; the best reference counts
    assert rouge_l("a b c", ["a x c y", "zzz"]) == pytest.approx(4 / 7)
    assert rouge_l("nothing shared", ["other words"]) == 0.0


def test_answer_scores_name_exact_first_word_and_label_restricted():
    from memcl_ops.data.lm_tasks import TextPair, answer_scores

    pair = TextPair("q", "POS", ("POS",))
    assert answer_scores("POS", pair, ("NEG", "POS")) == {"exact": 1.0, "first_word": 1.0, "rouge_l": 1.0,
                                                         "label_restricted": 1.0}
    wordy = answer_scores("pos, because it is lovely", pair, ("NEG", "POS"))
    assert (wordy["exact"], wordy["first_word"], wordy["label_restricted"]) == (0.0, 1.0, 1.0)
    assert answer_scores("I think NEG", pair, ("NEG", "POS"))["label_restricted"] == 0.0


def test_superni_loader_reads_the_shipped_subsample():
    from memcl_ops.data import superni
    from memcl_ops.data.lm_tasks import LMStreamSpec, build_stream

    present = superni.available()
    assert len(present) == 10 and present[0] == "task1572_samsum_summary"  # order A, five tasks not shipped
    tasks = build_stream(LMStreamSpec(tasks=tuple(f"superni:{t}" for t in present)))
    for task in tasks:
        assert len(task.train) >= 13 and abs(len(task.train) - len(task.test)) <= 1
        assert not {p.prompt for p in task.train} & {p.prompt for p in task.test}
        assert all(p.prompt.endswith("Output:") and p.answer == p.references[0] for p in task.train)
    sst2 = tasks[present.index("task363_sst2_polarity_classification")]
    assert sst2.metric == "exact" and sst2.answers == ("NEG", "POS")
    assert tasks[0].metric == "rouge-l" and tasks[0].max_answer_tokens > 4


def test_superni_loader_names_a_missing_task_and_a_corrupt_file(tmp_path):
    from memcl_ops.data import superni
    from memcl_ops.data.datasets import DatasetUnavailable

    with pytest.raises(DatasetUnavailable, match=r"task1290_xsum_summarization.*is not in"):
        superni.load_task("task1290_xsum_summarization")
    (tmp_path / "task875_emotion_classification.json").write_text("{not json")
    with pytest.raises(DatasetUnavailable, match="is not a SuperNI task file"):
        superni.load_task("task875_emotion_classification", tmp_path)


def test_dev_split_holds_out_training_prompts_and_never_shows_a_test_item():
    from memcl_ops.data.lm_tasks import PARTLY_CAPABLE, LMStreamSpec, build_stream

    spec = LMStreamSpec(tasks=(*PARTLY_CAPABLE[1:], "superni:task363_sst2_polarity_classification"),
                        train_per_task=32, test_per_task=40)
    for full, dev in zip(build_stream(spec), build_stream(replace(spec, evaluate_on="dev"))):
        train, held = {p.prompt for p in dev.train}, {p.prompt for p in dev.test}
        assert held and not train & held
        assert train | held == {p.prompt for p in full.train}  # the dev run sees only training pairs
        assert not (train | held) & {p.prompt for p in full.test}
