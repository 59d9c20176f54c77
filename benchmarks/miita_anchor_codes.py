"""Would shorter anchor codes let MIITA hold more examples at a tight budget? Nearest-stored-answer accuracy of
SmolLM2-135M's mid-layer keys on the `partly` stream's dev split (a held-out quarter of each task's training
pairs; no test item), per anchor code, with every training key stored (no budget, no merge): the retrieval each
code allows before the budget decides how many anchors fit (benchmarks/RESULTS.md, "MIITA at binding budgets").

    python -m benchmarks.miita_anchor_codes            # seeds 0 1 2, 46 s here

Codes: the memory's own (memcl_ops/miita/answers.py `encode_anchor`: float16, int8, sign = one bit per hidden
unit, H/8 bytes) and candidates with fewer bits, computed here only: the signs of a random subset of the hidden
units, and SimHash (signs of random Gaussian projections), through the origin or through the first task's mean
key. Queries are compared as the memory reads them: the raw unit query against the decoded anchor (for the
projected codes, the projected query against the projected signs). Prints one row per code: bytes per anchor and
the accuracy per seed and its mean.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from memcl_ops.data.lm_tasks import PARTLY_CAPABLE, LMStreamSpec, build_stream
from memcl_ops.miita.answers import anchor_width, decode_anchor, encode_anchor
from memcl_ops.models.causal_lm import LMSpec, load_lm
from memcl_ops.tensors import normalize

SHORT_BITS = (128, 256, 384)
PROJECTION_SEEDS = 3  # each projected code is averaged over this many random draws (the same draws for every seed)


def nearest_answer_accuracy(anchors: torch.Tensor, queries: torch.Tensor, stored: list[str], wanted: list[str]
                            ) -> float:
    nearest = (queries @ anchors.T).argmax(dim=1).tolist()
    return float(np.mean([stored[i] == y for i, y in zip(nearest, wanted)]))


def code_accuracies(keys: torch.Tensor, queries: torch.Tensor, stored: list[str], wanted: list[str],
                    first_task: int) -> dict[tuple[str, int], float]:
    """{(code, bytes per anchor): accuracy} for the memory's codes and the shorter candidates."""
    hidden = keys.shape[1]
    out = {}
    for code in ("float16", "int8", "sign"):
        anchors = decode_anchor(encode_anchor(keys, code), hidden, code)
        out[(code, anchor_width(hidden, code))] = nearest_answer_accuracy(anchors, queries, stored, wanted)
    centre = keys[:first_task].mean(dim=0)
    for bits in SHORT_BITS:
        subset, origin, centred = [], [], []
        for draw in range(PROJECTION_SEEDS):
            generator = torch.Generator().manual_seed(draw)
            units = torch.randperm(hidden, generator=generator)[:bits]
            subset.append(nearest_answer_accuracy(normalize(torch.sign(keys[:, units])), queries[:, units],
                                                  stored, wanted))
            projection = torch.randn(bits, hidden, generator=generator)
            origin.append(nearest_answer_accuracy(normalize(torch.sign(keys @ projection.T)), queries @ projection.T,
                                                  stored, wanted))
            centred.append(nearest_answer_accuracy(normalize(torch.sign((keys - centre) @ projection.T)),
                                                   (queries - centre) @ projection.T, stored, wanted))
        width = -(-bits // 8)
        out[(f"sign of {bits} random units", width)] = float(np.mean(subset))
        out[(f"SimHash {bits} (origin)", width)] = float(np.mean(origin))
        out[(f"SimHash {bits} (first task's mean)", width)] = float(np.mean(centred))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    seeds = parser.parse_args().seeds
    lm = load_lm(LMSpec())
    per_seed: dict[tuple[str, int], list[float]] = {}
    for seed in seeds:
        tasks = build_stream(LMStreamSpec(tasks=PARTLY_CAPABLE, train_per_task=32, test_per_task=40, seed=seed,
                                          evaluate_on="dev"))
        train = [p for t in tasks for p in t.train]
        dev = [p for t in tasks for p in t.test]
        with torch.inference_mode():
            keys = lm.query_keys([p.prompt for p in train]).float()
            queries = lm.query_keys([p.prompt for p in dev]).float()
        found = code_accuracies(keys, queries, [p.answer for p in train], [p.answer for p in dev],
                                len(tasks[0].train))
        for name, accuracy in found.items():
            per_seed.setdefault(name, []).append(accuracy)
    print(f"{len(train)} stored keys, {len(dev)} dev queries (seed {seeds[-1]}; seeds {' '.join(map(str, seeds))})\n")
    print("| anchor code | bytes per anchor | nearest-answer accuracy per seed (%) | mean (%) |")
    print("|---|---|---|---|")
    for (name, width), accuracies in per_seed.items():
        print(f"| {name} | {width} | {' / '.join(f'{100 * a:.1f}' for a in accuracies)} | "
              f"{100 * np.mean(accuracies):.1f} |")


if __name__ == "__main__":
    main()
