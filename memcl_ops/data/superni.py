"""SuperNI (Super-NaturalInstructions, Wang et al. 2022) tasks for `memcl lm`: the continual-learning order "A" of
15 tasks (O-LoRA / SAPT); an offline subsample of 10 of them ships in memcl_ops/data/superni/ (its README: which
instances, the licences; five tasks could not be obtained offline). Users with the full dataset point
`stream.superni_dir` at a folder of SuperNI task files (`<task>.json`).

A prompt is the task's definition followed by the instance input; the answer to learn is the first reference
output, and every reference counts when scoring. Classification tasks (task363, task875, task1687) are scored by
exact match, all others by ROUGE-L, as the CL literature on this order does. Train and test are the first and
second half of the instances in file order (the task files are shuffled upstream) at seed 0, of a seeded shuffle
otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from memcl_ops.data.datasets import DatasetUnavailable
from memcl_ops.data.text_tasks import TextPair, TextTask

SUPERNI_DIR = Path(__file__).with_name("superni")
ORDER_A = ("task1572_samsum_summary", "task363_sst2_polarity_classification", "task1290_xsum_summarization",
           "task181_outcome_extraction", "task002_quoref_answer_generation", "task1510_evalution_relation_extraction",
           "task639_multi_woz_user_utterance_generation", "task1729_personachat_generate_next",
           "task073_commonsenseqa_answer_generation", "task1590_diplomacy_text_generation",
           "task748_glucose_reverse_cause_event_detection", "task511_reddit_tifu_long_text_summarization",
           "task591_sciq_answer_generation", "task1687_sentiment140_classification", "task875_emotion_classification")
CLASSIFICATION = ("task363_sst2_polarity_classification", "task1687_sentiment140_classification",
                  "task875_emotion_classification")
MAX_PROMPT_WORDS = 200  # long inputs (dialogues) are cut to their first words: CPU prompt cost stays bounded


def available(root: Path = SUPERNI_DIR) -> list[str]:
    """The order-A tasks present under `root`, in order."""
    return [t for t in ORDER_A if (root / f"{t}.json").is_file()]


def _cut(text: str, words: int) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


def load_task(name: str, root: Path = SUPERNI_DIR, max_instances: int | None = None, seed: int = 0) -> TextTask:
    """One SuperNI task file as a TextTask: first half train, second half test, in file order at seed 0 and in a
    seeded shuffle otherwise (another draw of the same instances)."""
    path = Path(root) / f"{name}.json"
    if not path.is_file():
        raise DatasetUnavailable(f"SuperNI task {name!r} is not in {root} (present: {', '.join(available(root))})")
    try:
        data = json.loads(path.read_text())
        definition = data["Definition"][0].strip()
        instances = data["Instances"][:max_instances]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
        raise DatasetUnavailable(f"{path} is not a SuperNI task file ({type(err).__name__}: {err})") from err
    pairs = []
    for inst in instances:
        references = tuple(o.strip() for o in inst["output"] if o.strip())
        if not references:
            continue
        prompt = f"{definition}\n\nInput: {_cut(inst['input'], MAX_PROMPT_WORDS)}\nOutput:"
        pairs.append(TextPair(prompt, references[0], references))
    if len(pairs) < 2:
        raise DatasetUnavailable(f"{path} has {len(pairs)} usable instances; a task needs at least 2")
    if seed:
        pairs = [pairs[i] for i in np.random.default_rng([seed, *name.encode()]).permutation(len(pairs))]
    half = len(pairs) // 2
    classification = name in CLASSIFICATION
    answers = tuple(sorted({r for p in pairs[:half] for r in p.references})) if classification else ()
    longest = max(len(p.answer.split()) for p in pairs[:half])
    return TextTask(name, tuple(pairs[:half]), tuple(pairs[half:]), answers,
                    max_answer_tokens=4 if classification else min(48, 2 * longest + 2),
                    metric="exact" if classification else "rouge-l")
