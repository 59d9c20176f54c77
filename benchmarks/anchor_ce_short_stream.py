"""MARS's accuracy on the task it has just seen, by the weight of CE at its class anchors, on the short stream of
tests/integration/test_methods_pipeline.py (4 tasks of 2 synthetic classes, 5 stage-2 epochs, 4 slots; seed 0):
the plasticity the anchor CE costs where a task gets few epochs (weights 0, 0.3 and 1).

    python -m benchmarks.anchor_ce_short_stream  # from the repository root: mars-memcl, mars-memcl-paper-signal
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from memcl.pipeline import runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import load_config
from memcl.pipeline.roles import ensure_ray
from tests.integration.test_methods_pipeline import tiny

WEIGHTS = (0.0, 0.3, 1.0)


def main() -> None:
    ensure_ray(load_config())
    actors = ActorCache()
    print("| method | lambda_anchor_ce | diagonal (each task right after its visit) | last row |")
    print("|---|---|---|---|")
    try:
        for name in ("mars-memcl", "mars-memcl-paper-signal"):
            for weight in WEIGHTS:
                with tempfile.TemporaryDirectory() as folder:
                    config = tiny(Path(folder), name)
                    stage2 = dataclasses.replace(config.method.stage2, lambda_anchor_ce=weight)
                    config = dataclasses.replace(config, method=dataclasses.replace(config.method, stage2=stage2))
                    acc = np.array(runner.run(config, actors=actors).metrics["acc_matrix"], float)
                print(f"| {name} | {weight} | {np.round(np.diag(acc), 2).tolist()} | {np.round(acc[-1], 2).tolist()} |")
    finally:
        actors.close()


if __name__ == "__main__":
    main()
