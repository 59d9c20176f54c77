"""Why MARS's anchor terms weigh each old class alike: MARS on the synthetic-drift suite's stream, in-process (the
StreamLearner of memcl_ops/methods.py), once per `stage2.anchor_weighting`; for each task below 10 % at the end it
prints the slots its test samples route to and its classes' (slot, class) anchors with their masses.

    python -m benchmarks.anchor_weighting [--seed 0]     # from the repository root
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from memcl.pipeline.config import load_config
from memcl.pipeline.suites import suite
from memcl_ops.arrow import schema as S
from memcl_ops.data.sources import DriftStream
from memcl_ops.learner import Round
from memcl_ops.learners import build_learner


def run(weighting: str, seed: int) -> None:
    config = load_config(None, {**suite("synthetic-drift").overrides, "method.stage2.anchor_weighting": weighting})
    spec = config.data.drift
    stream = DriftStream(spec)
    learner = build_learner("mars-memcl", config.method, seed=seed, feature_dim=spec.dim)
    for visit, task in enumerate(stream.visits):
        learner.begin_round(Round(visit, task, tuple(stream.classes(task))))
        for index in range(int(np.ceil(spec.train_per_visit / spec.batch_size))):
            learner.observe(stream.train_batch(visit, index))
        learner.consolidate()
    last = spec.visits - 1
    accuracy = []
    for task in range(spec.tasks):
        batch = stream.test_batch(task, 0, last)
        accuracy.append(float((learner.predict(batch) == np.asarray(batch.column(S.LABEL))).mean()))
    print(f"anchor_weighting={weighting}: A_last {100 * np.mean(accuracy):.2f}, last row (%)",
          np.round(100 * np.array(accuracy)).astype(int).tolist())
    served = learner.roles["predictor"]  # the published head and the memory it was trained through
    router, anchors = served.memory, served.head.class_anchors
    _, classes, mass = anchors.points(router)
    for task in np.flatnonzero(np.array(accuracy) < 0.1):
        with torch.no_grad():
            slots = router(S.features_to_torch(stream.test_batch(task, 0, last))).probs.argmax(dim=1).numpy()
        held = {c: [round(float(m), 1) for m in mass[classes == c]] for c in stream.classes(task)}
        print(f"  task {task}: test samples route to slots {sorted(set(slots.tolist()))} of {router.num_slots}; "
              f"anchor masses per class {held}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    seed = parser.parse_args().seed
    for weighting in ("point", "class"):
        run(weighting, seed)


if __name__ == "__main__":
    main()
