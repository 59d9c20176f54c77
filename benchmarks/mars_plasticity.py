"""MARS against DER++ in-process, per task right after its visit and at the end: where MARS's A_last goes.

Runs the StreamLearner of memcl_ops/methods.py on a bench suite's stream (its cached features; run `memcl bench
SUITE` once first to fill the feature cache) for each method and each `--set` variant, seeds 0..N-1, and prints
A_last, the mean of the diagonal (each task right after its own visit) and forgetting, mean ± std over seeds, and
the median seconds a run spends learning (observe + consolidate) on `--threads` torch threads (1: as `memcl bench`
runs its learner actors).

    python -m benchmarks.mars_plasticity digits-mnist-fmnist --methods mars,derpp --seeds 3
    python -m benchmarks.mars_plasticity synthetic-drift --methods mars --variant method.stage2.lambda_anchor_ce=1
    python -m benchmarks.mars_plasticity fmnist-5x2 --stream stream.class_order_seed=7   # another class order
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time

import numpy as np
import torch
import yaml

from memcl.pipeline.config import RunConfig, load_config
from memcl.pipeline.suites import suite
from memcl_ops.arrow import schema as S
from memcl_ops.data.feature_cache import FeatureCache
from memcl_ops.data.sources import DatasetStream, DriftStream, build_stream
from memcl_ops.learner import Round
from memcl_ops.learners import build_learner
from memcl_ops.metrics import forgetting


def cached_stream(config: RunConfig):
    """The suite's stream with its features from the feature cache (the bench's own cache)."""
    stream = build_stream(config.data, config.stream)
    if isinstance(stream, DriftStream):
        return stream
    assert isinstance(stream, DatasetStream)
    cache = FeatureCache(config.runtime.cache_dir)
    name = stream.describe().name
    # the cache's files are named DATASET-SPLIT-ENCODER-HASH: take an encoder whose files hold both splits' rows
    encoders = sorted({p.stem[len(f"{name}-train-"):].rsplit("-", 1)[0]
                       for p in cache.root.glob(f"{name}-train-*.parquet")})
    found = {}
    for encoder in encoders:
        found = {}
        for split in ("train", "test"):
            rows = stream.needed_rows(split)
            for path in cache.root.glob(f"{name}-{split}-{encoder}-*.parquet"):
                feats, _ = cache.lookup(path.stem, rows)
                if feats is not None:
                    found[split] = (rows, feats)
        if len(found) == 2:
            break
    if len(found) != 2:
        raise SystemExit(f"no cached features of {name} for this stream in {cache.root}: run `memcl bench` on it first")
    for split, (rows, feats) in found.items():
        stream.set_features(split, rows, feats)
    return stream


def accuracy_matrix(config: RunConfig, method: str, seed: int) -> tuple[np.ndarray, list[int], float]:
    """Accuracy on every task's test data after each visit, the task of each visit, and the seconds spent
    learning (observe and consolidate: no feature loading, no evaluation)."""
    stream = cached_stream(config)
    info = stream.describe()
    feature_dim = info.feature_dim or stream.features["train"][1].shape[1]
    learner = build_learner(method, config.method, seed=seed, feature_dim=feature_dim)
    tasks = len(info.task_classes)
    acc = np.full((len(info.visits), tasks), np.nan)
    learning = 0.0
    for visit, task in enumerate(info.visits):
        learner.begin_round(Round(visit, int(task), tuple(info.task_classes[int(task)])))
        batches = [stream.train_batch(visit, index) for index in range(info.visit_batches[visit])]
        started = time.perf_counter()
        for batch in batches:
            learner.observe(batch)
        learner.consolidate()
        learning += time.perf_counter() - started
        for t in range(tasks):
            if t > int(task) and not isinstance(stream, DriftStream):
                continue
            right = total = 0
            for k in range(info.test_batches[t]):
                batch = stream.test_batch(t, k, visit)
                right += int((learner.predict(batch) == np.asarray(batch.column(S.LABEL))).sum())
                total += batch.num_rows
            acc[visit, t] = right / total
    return acc, [int(t) for t in info.visits], learning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite")
    parser.add_argument("--methods", default="mars,derpp")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="KEY=VALUE[,KEY=VALUE]: one variant of every method (repeatable); none: the defaults")
    parser.add_argument("--stream", action="append", default=[], help="KEY=VALUE applied to every run")
    parser.add_argument("--show", action="store_true", help="also print each run's diagonal and last row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (memcl bench's actors use 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    importlib.import_module("torch._dynamo")  # the first optimizer imports it: not inside the first run's time
    chosen = suite(args.suite)

    def pairs(text: str) -> dict[str, object]:
        out = {}
        for item in filter(None, text.split(",")):
            key, value = item.split("=", 1)
            out[key] = yaml.safe_load(value)  # as `memcl --set` reads a value
        return out

    base = {**chosen.overrides}
    for item in args.stream:
        base.update(pairs(item))
    print("| suite | method | variant | A_last | diagonal | forgetting | s/run | learn s/run (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for method in args.methods.split(","):
        for variant in args.variant or [""]:
            config = load_config(overrides={**base, **pairs(variant)})
            a_last, diag, forget, secs, learning = [], [], [], [], []
            for seed in range(args.seeds):
                started = time.perf_counter()
                acc, visits, learned = accuracy_matrix(dataclasses.replace(config, seed=seed), method, seed)
                secs.append(time.perf_counter() - started)
                learning.append(learned)
                last = acc[-1][~np.isnan(acc[-1])]
                a_last.append(100 * last.mean())
                first_visit = {t: v for v, t in reversed(list(enumerate(visits)))}
                diagonal = np.array([acc[v, t] for t, v in sorted(first_visit.items())])  # right after its 1st visit
                diag.append(100 * np.nanmean(diagonal))
                if args.show:
                    print(f"  {method} {variant or 'default'} seed {seed}: diagonal",
                          np.round(100 * diagonal).astype(int).tolist(), "last row",
                          np.round(100 * acc[-1]).astype(int).tolist(), flush=True)
                forget.append(100 * forgetting(acc) if acc.shape[0] == acc.shape[1] else np.nan)
            fmt = lambda v: f"{np.mean(v):.2f} ± {np.std(v, ddof=1 if len(v) > 1 else 0):.2f}"  # noqa: E731
            print(f"| {chosen.name} | {method} | {variant or 'default'} | {fmt(a_last)} | {fmt(diag)} | "
                  f"{fmt(forget)} | {np.mean(secs):.1f} | {np.median(learning):.2f} |", flush=True)


if __name__ == "__main__":
    main()
