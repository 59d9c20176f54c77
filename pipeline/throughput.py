"""`memcl bench throughput`: the same stream through (a) a bare in-process loop doing the pipeline's per-batch work
(build the batch, encode it or slice the cached features, gate it, the MARS learner's observe: route and SGSE),
(b) the actor pipeline with one call per hop (`runtime.transport: actors`) and (c) the same actors as a Ray
Compiled Graph (`runtime.transport: compiled`), side by side in one run, for a cheap encoder, cached EfficientNet
features and EfficientNet encoded in-line.

Prints samples/s of each over the streaming phase (where data flows through the chain; training and evaluation
follow it), the ratios (b)/(a) and (c)/(a), the chain overhead per batch ((stream wall - bare loop) / batches) of
(b) and (c) next to Ray's own floor on this machine (the same batches through as many no-op actors as the pipeline
has hops, with classic calls and compiled), and the per-stage busy time of each transport (source, encode, route,
monitor, train, evaluate, and the streaming wall time no encoder was busy). (a), (b) and (c) alternate `repeats`
times and the medians are reported (on a shared 2-core VM single timings vary by +-20 %).
Writes throughput.csv, stages.csv and throughput.png.
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
from ray.dag import InputNode

from memcl_ops.arrow import schema as S
from memcl_ops.arrow.gate import gate
from memcl_ops.data.datasets import Dataset, load_fashion_mnist
from memcl_ops.methods import MethodConfig, build_learner
from memcl_ops.models.encoders import Encoder, EncoderSpec, build_encoder
from pipeline import runner
from pipeline.actor_cache import ActorCache
from pipeline.compiled_chain import size_channels
from pipeline.config import RuntimeConfig, load_config
from pipeline.progress import InFlight, Progress

CORES = 2  # the machine this is measured on; encoder threads are split between replicas
TRANSPORTS = ("actors", "compiled")
STAGES = ("source", "encode", "route", "monitor", "train", "evaluate", "ray_overhead")


@dataclass
class Case:
    encoder: str
    batch_size: int
    replicas: int
    images: int | None = None  # None: the run's --images
    cached: bool = False  # the features come from the feature cache: no encoder in the chain

    @property
    def label(self) -> str:
        return f"{self.encoder}{' (cached)' if self.cached else ''}"

    @property
    def name(self) -> str:  # what `memcl bench throughput --cases` selects by
        return f"{self.encoder}{'-cached' if self.cached else ''}-b{self.batch_size}-x{self.replicas}"


def default_cases() -> list[Case]:
    # The cheap encoder and the cached features stream 100 and 47 batches, so the chain's per-batch cost is not
    # swamped by its fill and drain.
    return [Case("efficientnet-lite0", 256, 1), Case("efficientnet-lite0", 512, 1),
            Case("efficientnet-lite0", 256, 2), Case("tiny", 256, 1, images=25_600),
            Case("efficientnet-lite0", 256, 1, images=12_000, cached=True)]


def images_per_class(images: int) -> int:
    return max(images // 10, 1)


def stream_rows(ds: Dataset, images: int) -> np.ndarray:
    """The rows the pipeline's one-task stream takes: the first images/10 of each class."""
    return np.concatenate([np.flatnonzero(ds.train_y == c)[:images_per_class(images)] for c in range(10)])


def raw_batch(ds: Dataset, rows: np.ndarray) -> pa.RecordBatch:
    return S.raw_batch(rows, S.IMAGE, ds.train_x[rows], ds.train_y[rows], image_shape=(28, 28))


def bare_loop(encoder: Encoder, ds: Dataset, rows: np.ndarray, case: Case) -> float:
    """Seconds for the pipeline's per-batch work in this process, on one stream: the raw batch, encoded (or the
    cached features sliced into a feature batch), gated, observed by a fresh MARS learner."""
    bs = case.batch_size
    chunks = [rows[a:a + bs] for a in range(0, len(rows), bs)]
    cached = [encoder.encode(raw_batch(ds, chunk)) for chunk in chunks] if case.cached else None
    contract = S.Contract(feature_dim=encoder.dim, require_labels=True)

    def features(k: int) -> pa.RecordBatch:
        feats = cached[k] if cached is not None else encoder.encode(raw_batch(ds, chunks[k]))
        return S.feature_batch(chunks[k], feats, ds.train_y[chunks[k]])  # built per batch, as the source does

    learner = build_learner("mars", MethodConfig(), feature_dim=encoder.dim)
    learner.observe(gate(features(0), contract)[0])  # warm-up, as the pipeline's actors are before they are timed
    learner = build_learner("mars", MethodConfig(), feature_dim=encoder.dim)
    start = time.perf_counter()
    for k in range(len(chunks)):
        learner.observe(gate(features(k), contract)[0])
    return time.perf_counter() - start


@ray.remote(num_cpus=0)
class Relay:
    """A no-op hop: what one actor call costs here when the actor does nothing. The first relay of a chain holds
    the stream's batches and emits one per call, as the source does."""

    def __init__(self, batches: list[pa.RecordBatch] | None = None):
        self.batches = batches

    def emit(self, index: int) -> pa.RecordBatch:
        return self.batches[index]

    def forward(self, batch):
        return batch


def ray_floor(batches: list[pa.RecordBatch], hops: int, in_flight: int) -> dict[str, float]:
    """Seconds to push `batches` through `hops` no-op actors (the first emitting them), submitted like the runner
    does: one classic call per hop, and the same relays as a compiled graph."""
    relays = [Relay.remote(batches), *(Relay.remote() for _ in range(hops - 1))]
    ray.get([relays[0].emit.remote(0), *(r.forward.remote(None) for r in relays[1:])])
    window = InFlight(in_flight, Progress(enabled=False).bar("", len(batches)))
    start = time.perf_counter()
    for k in range(len(batches)):
        ref = relays[0].emit.remote(k)
        for relay in relays[1:]:
            ref = relay.forward.remote(ref)
        window.add(ref)
    window.drain()
    classic = time.perf_counter() - start
    with InputNode() as index:
        node = relays[0].emit.bind(index)
        for relay in relays[1:]:
            node = relay.forward.bind(node)
    size = size_channels(relays, 2 * max(b.nbytes for b in batches))
    dag = node.experimental_compile(_max_inflight_executions=in_flight, _buffer_size_bytes=size)
    wait_s = RuntimeConfig().compiled_timeout_s
    ray.get(dag.execute(0), timeout=wait_s)  # the first execution sets the channels up
    pending = []
    start = time.perf_counter()
    for k in range(len(batches)):
        pending.append(dag.execute(k))
        if len(pending) >= in_flight:
            ray.get(pending.pop(0), timeout=wait_s)
    for ref in pending:
        ray.get(ref, timeout=wait_s)
    compiled = time.perf_counter() - start
    dag.teardown()
    for relay in relays:
        ray.kill(relay)
    return {"actors": classic, "compiled": compiled}


def pipeline_run(case: Case, images: int, image_size: int, out: Path, actors: ActorCache, transport: str) -> dict:
    config = load_config(overrides={
        "stream.tasks": 1, "stream.train_per_class": images_per_class(images), "stream.test_per_class": 20,
        "stream.batch_size": case.batch_size, "encoder.spec.name": case.encoder,
        "encoder.spec.image_size": image_size, "encoder.replicas": case.replicas,
        "encoder.threads": max(CORES // case.replicas, 1),
        "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 2,
        "runtime.cache_dir": str(out.parent / "cache") if case.cached else "", "runtime.checkpoint": False,
        "runtime.progress": False, "runtime.out": str(out), "runtime.transport": transport})
    return runner.run(config, actors=actors).metrics


def stages(metrics: dict, replicas: int) -> dict[str, float]:
    wall, busy = metrics["wall_seconds"], metrics["actor_busy_seconds"]
    encode = sum(v for k, v in busy.items() if k.endswith(".encode"))
    return {
        "source": busy.get("source.source", 0.0), "encode": encode,
        "route": busy.get("memory.route", 0.0) + busy.get("memory.expand", 0.0),
        "monitor": busy.get("monitor.monitor", 0.0),
        "train": busy.get("stage1.stage1", 0.0) + busy.get("stage2.stage2", 0.0),
        "evaluate": busy.get("stage2.evaluate", 0.0),
        # streaming wall time in which no encoder replica was working (per replica, they run side by side)
        "ray_overhead": max(wall["stream"] - encode / replicas, 0.0),
    }


def measure(case: Case, images: int, image_size: int, out: Path, actors: ActorCache, repeats: int = 3
            ) -> tuple[dict, list[dict]]:
    """(one row of ratios for `case`, its per-stage rows per transport)."""
    images = case.images or images
    ds = load_fashion_mnist()
    rows = stream_rows(ds, images)
    torch.set_num_threads(CORES)
    encoder = build_encoder(EncoderSpec(case.encoder, image_size=image_size, device="cpu"))
    for transport in TRANSPORTS:  # warm-up: every actor started (and, cached, the feature cache filled)
        pipeline_run(case, images if case.cached else case.batch_size, image_size, out, actors, transport)
    bares: list[float] = []
    runs: dict[str, list[dict]] = {t: [] for t in TRANSPORTS}
    for _ in range(repeats):  # alternate, so slow spells of the machine hit every side
        bares.append(bare_loop(encoder, ds, rows, case))
        for transport in TRANSPORTS:
            runs[transport].append(pipeline_run(case, images, image_size, out, actors, transport))
    bare = float(np.median(bares))
    n = runs["actors"][0]["samples"]["stream"]
    if {m["samples"]["stream"] for ms in runs.values() for m in ms} != {len(rows)}:
        raise RuntimeError(f"{case}: the transports streamed other rows than the bare loop's {len(rows)}")
    # the floor moves what the source emits (raw images, or feature batches of the cached features' width)
    # through as many hops as the classic chain makes per batch: source, [encoder], memory.route, monitor.observe
    chunks = [rows[a:a + case.batch_size] for a in range(0, len(rows), case.batch_size)]
    emitted = ([S.feature_batch(c, np.zeros((len(c), encoder.dim), np.float32), ds.train_y[c]) for c in chunks]
               if case.cached else [raw_batch(ds, c) for c in chunks])
    floor = ray_floor(emitted, 3 if case.cached else 4, RuntimeConfig().max_in_flight)
    batches = -(-n // case.batch_size)
    row = {"encoder": case.label, "batch_size": case.batch_size, "replicas": case.replicas, "images": n,
           "repeats": repeats, "bare_samples_per_s": n / bare, "seconds.bare": bare}
    stage_rows = []
    for transport, metrics in runs.items():
        median = sorted(metrics, key=lambda m: m["wall_seconds"]["stream"])[len(metrics) // 2]
        wall = median["wall_seconds"]["stream"]
        row.update({f"{transport}.samples_per_s": n / wall, f"{transport}.ratio": bare / wall,
                    f"{transport}.overhead_ms_per_batch": 1000 * (wall - bare) / batches,
                    f"{transport}.floor_ms_per_batch": 1000 * floor[transport] / batches,
                    f"{transport}.stream_wall": wall})
        stage_rows.append({"encoder": case.label, "batch_size": case.batch_size, "replicas": case.replicas,
                           "transport": transport, **{f"seconds.{k}": v for k, v in
                                                      stages(median, case.replicas).items()}})
    return row, stage_rows


def write(rows: list[dict], stage_rows: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, table_rows in (("throughput.csv", rows), ("stages.csv", stage_rows)):
        with open(folder / name, "w", newline="") as f:
            writer = csv.DictWriter(f, list(table_rows[0]))
            writer.writeheader()
            writer.writerows(table_rows)
    labels = [f"{r['encoder']}\nbatch {r['batch_size']}, x{r['replicas']}" for r in rows]
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4))
    left.bar(x - 0.27, [r["bare_samples_per_s"] for r in rows], 0.27, label="(a) bare in-process loop")
    for offset, transport, name in ((0.0, "actors", "(b) actor calls"), (0.27, "compiled", "(c) compiled graph")):
        values = [r[f"{transport}.samples_per_s"] for r in rows]
        left.bar(x + offset, values, 0.27, label=name)
        for xi, r, v in zip(x, rows, values):
            left.text(xi + offset, v, f"{r[f'{transport}.ratio']:.2f}x", ha="center", va="bottom", fontsize=7)
    left.set_xticks(x, labels, fontsize=7)
    left.set_ylabel("samples/s (streaming phase)")
    left.set_yscale("log")
    left.legend(fontsize=8)
    sx = np.arange(len(stage_rows))
    bottom = np.zeros(len(stage_rows))
    for stage in STAGES:
        values = np.array([r[f"seconds.{stage}"] for r in stage_rows])
        right.bar(sx, values, 0.6, bottom=bottom, label=stage)
        bottom += values
    right.set_xticks(sx, [f"{r['encoder']} b{r['batch_size']} x{r['replicas']}\n{r['transport']}"
                          for r in stage_rows], fontsize=6, rotation=60)
    right.set_ylabel("seconds (actor busy time; overhead: stream wall - encode)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=110)
    plt.close(fig)


def table(rows: list[dict], stage_rows: list[dict]) -> str:
    head = ("| stream | batch | replicas | (a) bare samples/s | (b) actors samples/s | (b)/(a) | (c) compiled "
            "samples/s | (c)/(a) | (b) overhead ms/batch | (c) overhead ms/batch | Ray floor actors ms/batch | "
            "Ray floor compiled ms/batch |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['encoder']} | {r['batch_size']} | {r['replicas']} | {r['bare_samples_per_s']:.0f} | "
            f"{r['actors.samples_per_s']:.0f} | {r['actors.ratio']:.3f} | {r['compiled.samples_per_s']:.0f} | "
            f"{r['compiled.ratio']:.3f} | {r['actors.overhead_ms_per_batch']:.2f} | "
            f"{r['compiled.overhead_ms_per_batch']:.2f} | {r['actors.floor_ms_per_batch']:.2f} | "
            f"{r['compiled.floor_ms_per_batch']:.2f} |")
    lines += ["", "| stream | batch | replicas | transport | " + " | ".join(STAGES) + " (s) |",
              "|" + "---|" * (4 + len(STAGES))]
    for r in stage_rows:
        lines.append(f"| {r['encoder']} | {r['batch_size']} | {r['replicas']} | {r['transport']} | "
                     + " | ".join(f"{r[f'seconds.{s}']:.2f}" for s in STAGES) + " |")
    return "\n".join(lines)


def throughput(images: int = 2560, image_size: int = 64, cases: list[Case] | None = None,
               out: str | Path = "runs/bench", repeats: int = 3, log=print) -> tuple[list[dict], list[dict]]:
    folder = Path(out) / "throughput"
    runner.ensure_ray(load_config())
    actors = ActorCache()
    rows, stage_rows = [], []
    try:
        for case in cases or default_cases():
            row, per_stage = measure(case, images, image_size, folder / "runs", actors, repeats)
            rows.append(row)
            stage_rows += per_stage
            log(f"{case}: actors {row['actors.ratio']:.3f}x, compiled {row['compiled.ratio']:.3f}x of the bare loop")
            write(rows, stage_rows, folder)
    finally:
        actors.close()
    return rows, stage_rows
