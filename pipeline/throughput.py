"""`memcl bench throughput`: the same images through (a) a bare in-process loop calling the encoder directly
and (b) the full actor pipeline (source -> encoder pool -> memory -> monitor, then stage 1/2 and evaluation),
side by side in one run, for several batch sizes and replica counts.

Prints samples/s of each, the ratio (b)/(a) over the streaming phase (where the data flows through the
encoder; training and evaluation follow it and are reported in the breakdown), the per-stage busy time
(source, encode, route, monitor, train, evaluate) and the Ray overhead (streaming wall time the encoder
was not busy), and the per-batch overhead of the actor chain next to Ray's own floor on this machine: the same
batches through a chain of as many no-op actors as the pipeline has hops. Bare loop and pipeline alternate
`repeats` times and the medians are reported (on a shared 2-core VM single timings vary by ±20 %).
Writes throughput.csv and throughput.png.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import ray
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import Dataset, load_fashion_mnist
from memcl_ops.models.encoders import Encoder, EncoderSpec, build_encoder
from pipeline import runner
from pipeline.actor_cache import ActorCache
from pipeline.config import RuntimeConfig, load_config
from pipeline.progress import InFlight, Progress

CORES = 2  # the machine this is measured on; encoder threads are split between replicas
HOPS = 4  # actor calls per streamed batch: source, encoder, memory.route, monitor.observe


@dataclass
class Case:
    encoder: str
    batch_size: int
    replicas: int
    images: int | None = None  # None: the run's --images


def default_cases() -> list[Case]:
    # The cheap encoder streams 100 batches, so the chain's per-batch cost is not swamped by its fill and drain.
    return [Case("efficientnet-lite0", 256, 1), Case("efficientnet-lite0", 512, 1),
            Case("efficientnet-lite0", 256, 2), Case("tiny", 256, 1, images=25_600)]


def images_per_class(images: int) -> int:
    return max(images // 10, 1)


def stream_rows(ds: Dataset, images: int) -> np.ndarray:
    """The rows the pipeline's one-task stream takes: the first images/10 of each class."""
    return np.concatenate([np.flatnonzero(ds.train_y == c)[:images_per_class(images)] for c in range(10)])


def raw_batch(ds: Dataset, rows: np.ndarray) -> pa.RecordBatch:
    return S.raw_batch(rows, S.IMAGE, ds.train_x[rows], ds.train_y[rows], image_shape=(28, 28))


def bare_loop(encoder: Encoder, ds: Dataset, rows: np.ndarray, batch_size: int) -> float:
    """Seconds to encode the stream's images in this process: build each raw batch, call the encoder."""
    encoder.encode(raw_batch(ds, rows[:batch_size]))  # warm-up, as the pipeline's actors are before they are timed
    start = time.perf_counter()
    for a in range(0, len(rows), batch_size):
        encoder.encode(raw_batch(ds, rows[a:a + batch_size]))
    return time.perf_counter() - start


@ray.remote(num_cpus=0)
class Relay:
    """A no-op hop: what one actor call costs here when the actor does nothing."""

    def forward(self, batch):
        return batch


def ray_floor(ds: Dataset, rows: np.ndarray, batch_size: int, in_flight: int) -> float:
    """Seconds to push the stream's raw batches through HOPS no-op actors, submitted like the runner does."""
    batches = [ray.put(raw_batch(ds, rows[a:a + batch_size])) for a in range(0, len(rows), batch_size)]
    relays = [Relay.remote() for _ in range(HOPS)]
    ray.get([r.forward.remote(None) for r in relays])
    window = InFlight(in_flight, Progress(enabled=False).bar("", len(batches)))
    start = time.perf_counter()
    for batch in batches:
        for relay in relays:
            batch = relay.forward.remote(batch)
        window.add(batch)
    window.drain()
    seconds = time.perf_counter() - start
    for relay in relays:
        ray.kill(relay)
    return seconds


def pipeline_run(case: Case, images: int, image_size: int, out: Path, actors: ActorCache) -> dict:
    config = load_config(overrides={
        "stream.tasks": 1, "stream.train_per_class": images_per_class(images), "stream.test_per_class": 20,
        "stream.batch_size": case.batch_size, "encoder.spec.name": case.encoder,
        "encoder.spec.image_size": image_size, "encoder.replicas": case.replicas,
        "encoder.threads": max(CORES // case.replicas, 1),
        "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 2,
        "runtime.cache_dir": "", "runtime.checkpoint": False, "runtime.progress": False, "runtime.out": str(out)})
    return runner.run(config, actors=actors).metrics


def measure(case: Case, images: int, image_size: int, out: Path, actors: ActorCache, repeats: int = 3) -> dict:
    images = case.images or images
    ds = load_fashion_mnist()
    rows = stream_rows(ds, images)
    torch.set_num_threads(CORES)
    encoder = build_encoder(EncoderSpec(case.encoder, image_size=image_size, device="cpu"))
    pipeline_run(case, case.batch_size, image_size, out, actors)  # warm-up: one batch through every actor
    bares, runs = [], []
    for _ in range(repeats):  # alternate, so slow spells of the machine hit both sides
        bares.append(bare_loop(encoder, ds, rows, case.batch_size))
        runs.append(pipeline_run(case, images, image_size, out, actors))
    bare = float(np.median(bares))
    metrics = sorted(runs, key=lambda m: m["wall_seconds"]["stream"])[len(runs) // 2]  # the median run
    wall, busy = metrics["wall_seconds"], metrics["actor_busy_seconds"]
    n = metrics["samples"]["stream"]
    batches = -(-n // case.batch_size)
    floor = ray_floor(ds, rows, case.batch_size, RuntimeConfig().max_in_flight)
    encode = sum(v for k, v in busy.items() if k.endswith(".encode"))
    stages = {
        "source": busy.get("source.source", 0.0), "encode": encode,
        "route": busy.get("memory.route", 0.0) + busy.get("memory.expand", 0.0),
        "monitor": busy.get("monitor.monitor", 0.0),
        "train": busy.get("stage1.stage1", 0.0) + busy.get("stage2.stage2", 0.0),
        "evaluate": busy.get("stage2.evaluate", 0.0),
        # streaming wall time in which no encoder replica was working (per replica, they run side by side)
        "ray_overhead": max(wall["stream"] - encode / case.replicas, 0.0),
    }
    return {"encoder": case.encoder, "batch_size": case.batch_size, "replicas": case.replicas, "images": n,
            "bare_samples_per_s": n / bare, "pipeline_samples_per_s": n / wall["stream"],
            "ratio": bare / wall["stream"], "end_to_end_samples_per_s": n / wall["total"],
            "chain_overhead_ms_per_batch": 1000 * (wall["stream"] - bare) / batches,
            "ray_floor_ms_per_batch": 1000 * floor / batches, "repeats": repeats,
            **{f"seconds.{k}": v for k, v in stages.items()}, "seconds.stream_wall": wall["stream"],
            "seconds.bare": bare}


def write(rows: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "throughput.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    labels = [f"{r['encoder']}\nbatch {r['batch_size']}, x{r['replicas']}" for r in rows]
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    left.bar(x - 0.2, [r["bare_samples_per_s"] for r in rows], 0.4, label="(a) bare encoder loop")
    left.bar(x + 0.2, [r["pipeline_samples_per_s"] for r in rows], 0.4, label="(b) actor pipeline (stream)")
    for xi, r in zip(x, rows):
        left.text(xi + 0.2, r["pipeline_samples_per_s"], f"{r['ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
    left.set_xticks(x, labels, fontsize=7)
    left.set_ylabel("samples/s")
    left.set_yscale("log")
    left.legend(fontsize=8)
    bottom = np.zeros(len(rows))
    for stage in ("source", "encode", "route", "monitor", "train", "evaluate", "ray_overhead"):
        values = np.array([r[f"seconds.{stage}"] for r in rows])
        right.bar(x, values, 0.6, bottom=bottom, label=stage)
        bottom += values
    right.set_xticks(x, labels, fontsize=7)
    right.set_ylabel("seconds (actor busy time; overhead: stream wall - encode)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=110)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    head = ("| encoder | batch | replicas | (a) bare samples/s | (b) pipeline samples/s | (b)/(a) | chain overhead "
            "ms/batch | Ray floor ms/batch | source | encode | route | monitor | train | evaluate | Ray overhead (s) |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        lines.append(
            f"| {r['encoder']} | {r['batch_size']} | {r['replicas']} | {r['bare_samples_per_s']:.0f} | "
            f"{r['pipeline_samples_per_s']:.0f} | {r['ratio']:.3f} | {r['chain_overhead_ms_per_batch']:.1f} | "
            f"{r['ray_floor_ms_per_batch']:.1f} | "
            + " | ".join(f"{r[f'seconds.{s}']:.2f}" for s in
                         ("source", "encode", "route", "monitor", "train", "evaluate", "ray_overhead")) + " |")
    return "\n".join(lines)


def throughput(images: int = 2560, image_size: int = 64, cases: list[Case] | None = None,
               out: str | Path = "runs/bench", repeats: int = 3, log=print) -> list[dict]:
    folder = Path(out) / "throughput"
    runner.ensure_ray(load_config())
    actors = ActorCache()
    rows = []
    try:
        for case in cases or default_cases():
            rows.append(measure(case, images, image_size, folder / "runs", actors, repeats))
            log(f"{case}: ratio {rows[-1]['ratio']:.3f}")
            write(rows, folder)
    finally:
        actors.close()
    return rows
