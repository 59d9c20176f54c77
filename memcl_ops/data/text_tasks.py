"""A text task of the "lm" family: prompt/answer pairs to train on and to answer (memcl_ops/data/lm_tasks.py builds
the built-in ones, memcl_ops/data/superni.py reads SuperNI's)."""

from __future__ import annotations

from dataclasses import dataclass

# made-up facts of the "lm" tasks and the words of synthetic text classes (memcl_ops/data/datasets.py)
NOUNS = ("apple", "river", "candle", "tiger", "window", "bottle", "garden", "pencil", "mirror", "rocket", "blanket",
         "carrot", "island", "ladder", "magnet", "orange", "pillow", "saddle", "teapot", "violin", "wallet", "anchor",
         "basket", "cactus", "donkey", "feather", "guitar", "helmet", "jacket", "kettle", "lemon", "marble")


@dataclass(frozen=True)
class TextPair:
    prompt: str
    answer: str  # what is learned
    references: tuple[str, ...] = ()  # every acceptable answer when scoring (empty: `answer` alone)


@dataclass(frozen=True)
class TextTask:
    name: str
    train: tuple[TextPair, ...]
    test: tuple[TextPair, ...]
    answers: tuple[str, ...]  # the answer set (what a guesser chooses from; empty for free text)
    max_answer_tokens: int = 4  # generation length for this task (answers are short)
    metric: str = "exact"  # the task's headline score: "exact" (match) or "rouge-l" (free text)
