"""Every registered method passes the conformance check (memcl_ops/conformance.py) as its in-process learner
(`build_learner`): parametrized over `METHODS` itself, so a method registered later is checked without touching
this file (a new family needs a tiny stream below). Each family streams tiny real data through its real parts:
synthetic features ("features"), raw text through a small random BERT saved as a local folder ("nsr") and text
pairs through a tiny random Llama ("lm")."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from memcl_ops.arrow import schema as S
from memcl_ops.conformance import Stream, Visit, check_learner
from memcl_ops.data.datasets import SyntheticSpec, make_synthetic
from memcl_ops.data.lm_tasks import NOUNS, LMStreamSpec, build_stream
from memcl_ops.data.streams import StreamSpec, make_plan
from memcl_ops.learner import Round
from memcl_ops.learners import build_learner
from memcl_ops.learners.features import FeatureLearner
from memcl_ops.mars.router import RouterConfig
from memcl_ops.method_config import LMMethodConfig, MethodConfig
from memcl_ops.methods import METHODS, method_spec
from memcl_ops.miita.directions import AdaptConfig
from memcl_ops.models.causal_lm import LMSpec
from memcl_ops.models.encoders import EncoderSpec
from memcl_ops.nsr.adapter import NSRConfig
from memcl_ops.training import OptimConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --- "features": synthetic features, 4 tasks of 2 classes, probes of every class ---------------------------------
DIM, TASKS, BATCH = 16, 4, 32
_BASE = MethodConfig()
FEATURES_CONFIG = replace(  # small enough to run every method several times in seconds; DER++'s buffer replaces
    _BASE, router=RouterConfig(initial_slots=4),
    stage1=replace(_BASE.stage1, optim=OptimConfig(epochs=2, batch_size=BATCH)),
    stage2=replace(_BASE.stage2, optim=OptimConfig(epochs=3, batch_size=BATCH)),
    derpp=replace(_BASE.derpp, buffer_size=30), analytic=replace(_BASE.analytic, expansion_dim=64))


@functools.cache
def feature_stream() -> Stream:
    data = make_synthetic(SyntheticSpec(classes=8, dim=DIM, train_per_class=40, test_per_class=20, separation=2.0))
    plan = make_plan(data.train_y, data.test_y, data.num_classes, StreamSpec(tasks=TASKS, batch_size=BATCH))
    visits = []
    for t in range(TASKS):
        rows = plan.visit_rows[t]
        batches = tuple(S.feature_batch(chunk, data.train_x[chunk], data.train_y[chunk])
                        for chunk in np.array_split(rows, -(-len(rows) // BATCH)))
        visits.append(Visit(Round(t, t, tuple(plan.classes[t])), batches))
    probe = S.feature_batch(np.arange(len(data.test_y)), data.test_x, data.test_y)
    return Stream(tuple(visits), (probe,))


# --- "nsr": raw texts of 3 tasks of 3 classes (A B C A), a random BERT ----------------------------------------------
NSR_TASKS, NSR_CLASSES, NSR_VISITS = 3, 3, (0, 1, 2, 0)
NSR_CONFIG = replace(_BASE, nsr=NSRConfig(batch_size=4, lr=2e-2, probe_size=6))


def text_rows(task: int, per_class: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Each class owns three nouns; a text is four draws of them."""
    rng = np.random.default_rng([task, seed])
    labels = np.repeat(np.arange(NSR_CLASSES) + task * NSR_CLASSES, per_class)
    rng.shuffle(labels)
    texts = [" ".join(rng.choice(NOUNS[3 * c:3 * c + 3], 4)) for c in labels]
    return texts, labels


@functools.cache
def nsr_stream() -> Stream:
    visits, ids = [], 0
    for index, task in enumerate(NSR_VISITS):
        texts, labels = text_rows(task, 16, index)
        batches = []
        for a in range(0, len(texts), 6):
            n = len(texts[a:a + 6])
            batches.append(S.raw_batch(np.arange(ids, ids + n), S.TEXT, texts[a:a + 6], labels[a:a + 6],
                                       np.full(n, task)))
            ids += n
        classes = tuple(range(task * NSR_CLASSES, (task + 1) * NSR_CLASSES))
        visits.append(Visit(Round(index, task, classes), tuple(batches)))
    probes = []
    for task in range(NSR_TASKS):
        texts, labels = text_rows(task, 4, 99)
        probes.append(S.raw_batch(np.arange(len(texts)) + 10_000 * (task + 1), S.TEXT, texts, labels,
                                  np.full(len(texts), task)))
    return Stream(tuple(visits), tuple(probes))


# --- "lm": text pairs of 2 synthetic tasks, a random Llama --------------------------------------------------------
LM_CONFIG = LMMethodConfig(adapt=AdaptConfig(step=0.5, entropy_threshold=-1.0, relevance_threshold=-1.0))


@functools.cache
def lm_stream() -> Stream:
    tasks = build_stream(LMStreamSpec(tasks=("word-code", "last-letter"), train_per_task=4, test_per_task=2))
    visits, probes, ids = [], [], 0
    for t, task in enumerate(tasks):
        for split, pairs in (("train", task.train), ("test", task.test)):
            batch = S.text_pair_batch(np.arange(ids, ids + len(pairs)), [p.prompt for p in pairs],
                                      [p.answer for p in pairs], task_ids=np.full(len(pairs), t))
            ids += len(pairs)
            if split == "train":
                visits.append(Visit(Round(t, t, None), (batch.slice(0, 2), batch.slice(2))))
            else:
                probes.append(batch)
    return Stream(tuple(visits), tuple(probes))


def case(name: str, request: pytest.FixtureRequest):
    """(make, stream) of a registered method: its learner on its family's tiny stream."""
    family = method_spec(name).family
    if family == "features":
        return functools.partial(build_learner, name, FEATURES_CONFIG, feature_dim=DIM), feature_stream()
    if family == "nsr":
        encoder = EncoderSpec(name=f"hf:{request.getfixturevalue('tiny_bert')}", max_length=16, device="cpu")
        return (functools.partial(build_learner, name, NSR_CONFIG, encoder=encoder, payload=S.TEXT,
                                  n_way=NSR_CLASSES), nsr_stream())
    if family == "lm":
        budget = {"budget": 512} if "byte-budget" in method_spec(name).tags else {}
        return (functools.partial(build_learner, name, LM_CONFIG, lm=LMSpec(name="tiny:llama"), max_new_tokens=3,
                                  **budget), lm_stream())
    raise ValueError(f"no tiny stream for the family {family!r} of {name!r}: add one here")


@pytest.mark.parametrize("name", list(METHODS))
def test_registered_method_conforms(name, request):
    make, stream = case(name, request)
    report = check_learner(make, stream)
    tags = METHODS[name].tags
    assert {"npz", "seed"} <= set(report.ran)
    assert ("restore" in report.ran) == ("memory-bytes" in report.ran) == ("learns-nothing" not in tags)
    assert ("classes" in report.ran) == (not tags & {"generative", "input-blind"})


class ForgetsItsMonitor(FeatureLearner):
    """MARS whose restore leaves SGSE as it was built: a restore that is not exact."""

    def restore(self, state):
        monitor = self.roles.pop("monitor")
        super().restore(state)
        self.roles["monitor"] = monitor


class HidesItsSlots(FeatureLearner):
    def memory_bytes(self):
        return {k: v for k, v in super().memory_bytes().items() if k != "slots"}


class NamesEveryClass(FeatureLearner):
    """Answers with labels it was never given: a head that knows the stream's label set in advance."""

    def predict(self, batch):
        return S.labels_to_numpy(batch)


@pytest.mark.parametrize("learner, check", [(ForgetsItsMonitor, "restore"), (HidesItsSlots, "memory-bytes"),
                                            (NamesEveryClass, "classes")])
def test_the_check_names_what_a_broken_learner_breaks(learner, check):
    make = functools.partial(learner, METHODS["mars-memcl"], FEATURES_CONFIG, DIM)
    with pytest.raises(AssertionError, match=f"^{check}: "):
        check_learner(make, feature_stream())
