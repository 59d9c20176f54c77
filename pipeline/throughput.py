"""`memcl bench throughput`: the same stream through (a) a bare in-process loop doing the pipeline's per-batch work
(build the batch, encode it or slice the cached features, gate it, the MARS learner's observe: route and SGSE),
(b) the actor pipeline with one call per hop (`runtime.transport: actors`) and (c) the same actors as a Ray
Compiled Graph (`runtime.transport: compiled`), side by side in one run, for a cheap encoder, cached EfficientNet
features and EfficientNet encoded in-line.

Prints samples/s of each over the streaming phase (where data flows through the chain; training and evaluation
follow it), the ratios (b)/(a) and (c)/(a), the chain overhead per batch ((stream wall - bare loop) / batches) of
(b) and (c) next to Ray's own floor on this machine (the same batches through as many no-op actors as the pipeline
has hops, with classic calls and compiled), and the per-stage busy time of each transport (source, encode, route,
monitor, train, evaluate, and the streaming wall time no encoder was busy). A third table accounts for every
core while the chain streams: CPU milliseconds per batch of each actor's process, of the driver and of the rest of
the machine (Ray's raylet and GCS, the idle trainers), against the bare loop's own CPU per batch; where the pipeline's
total over the cores it has is its wall time, the machine, not a stage, is the bottleneck. (a), (b) and (c) alternate
`repeats` times and the medians are reported (on a shared 2-core VM single timings vary by +-20 %).
Writes throughput.csv, stages.csv and throughput.png.
"""

from __future__ import annotations

import contextlib
import csv
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import psutil
import pyarrow as pa
import ray
import torch
from ray.dag import InputNode

from memcl.pipeline import runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.compiled_chain import size_channels
from memcl.pipeline.config import RuntimeConfig, load_config
from memcl.pipeline.progress import InFlight, Progress
from memcl.pipeline.roles import ensure_ray
from memcl_ops import files
from memcl_ops.arrow import schema as S
from memcl_ops.arrow.gate import gate
from memcl_ops.data.datasets import Dataset, load_fashion_mnist
from memcl_ops.learners import build_learner
from memcl_ops.method_config import MethodConfig
from memcl_ops.models.encoders import Encoder, EncoderSpec, build_encoder

CORES = 2  # the machine this is measured on; encoder threads are split between replicas
TRANSPORTS = ("actors", "compiled")
STAGES = ("source", "encode", "route", "monitor", "train", "evaluate", "ray_overhead")
CPU_ROLES = ("source", "encode", "memory", "monitor", "driver", "rest")


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


def bare_loop(encoder: Encoder, ds: Dataset, rows: np.ndarray, case: Case) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for the pipeline's per-batch work in this process, on one stream:
    the raw batch, encoded (or the cached features sliced into a feature batch), gated, observed by a fresh MARS
    learner."""
    bs = case.batch_size
    chunks = [rows[a:a + bs] for a in range(0, len(rows), bs)]
    cached = [encoder.encode(raw_batch(ds, chunk)) for chunk in chunks] if case.cached else None
    contract = S.Contract(feature_dim=encoder.dim, require_labels=True)

    def features(k: int) -> pa.RecordBatch:
        feats = cached[k] if cached is not None else encoder.encode(raw_batch(ds, chunks[k]))
        return S.feature_batch(chunks[k], feats, ds.train_y[chunks[k]])  # built per batch, as the source does

    learner = build_learner("mars-memcl", MethodConfig(), feature_dim=encoder.dim)
    learner.observe(gate(features(0), contract)[0])  # warm-up, as the pipeline's actors are before they are timed
    learner = build_learner("mars-memcl", MethodConfig(), feature_dim=encoder.dim)
    start, cpu = time.perf_counter(), time.process_time()
    for k in range(len(chunks)):
        learner.observe(gate(features(k), contract)[0])
    return time.perf_counter() - start, time.process_time() - cpu


def busy_cpu_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (what another VM took excluded)."""
    t = psutil.cpu_times()
    idle = ("idle", "iowait", "steal", "guest", "guest_nice")  # guest time is also counted in user time
    return sum(t) - sum(getattr(t, field, 0.0) for field in idle)


class CpuMeter:
    """The on_batch hook of a timed pipeline run. It reads the CPU time of each chain actor's process, of this
    driver and of the whole machine when the `skip + 1`-th batch is submitted (the chain full, no longer filling)
    and when the last one is, and gives them per batch streamed between the two: a few reads of /proc each time,
    not charged to any stage. Linux counts CPU time in clock ticks (10 ms), so a window of a few batches reads
    coarsely. A stream too short for `skip` (the batch-512 case's 5 batches) is read from its second-to-last
    submission on, while the chain still fills: one batch, at the tick's resolution."""

    def __init__(self, pids: dict[str, int], batches: int, skip: int):
        self.processes = {**{role: psutil.Process(pid) for role, pid in pids.items()}, "driver": psutil.Process()}
        self.batches, self.skip = batches, max(min(skip, batches - 2), 0)  # two marks on any stream of 2+ batches
        self.calls = 0
        self.marks: list[tuple[float, dict[str, float]]] = []

    def __call__(self, visit: int, index: int) -> None:
        self.calls += 1
        if self.calls in (self.skip + 1, self.batches):
            self.marks.append((time.perf_counter(), self._sample()))

    def _sample(self) -> dict[str, float]:
        seconds = {}
        for role, process in self.processes.items():
            with contextlib.suppress(psutil.NoSuchProcess):  # restarted after a fault: this role is not measured
                seconds[role] = _user_system(process)
        seconds["machine"] = busy_cpu_seconds()
        return seconds

    def per_batch(self) -> dict[str, float]:
        """Milliseconds per batch: `wall`, the CPU of each of CPU_ROLES (`rest`: the machine's busy time that no
        chain process or the driver accounts for) and `total` (the machine's); `batches`: how many were streamed
        between the two reads."""
        (t0, a), (t1, b) = self.marks
        batches = self.batches - 1 - self.skip
        spent = {role: b[role] - a[role] for role in b if role in a}
        out = {"wall": t1 - t0, "source": spent.get("source", 0.0), "memory": spent.get("memory", 0.0),
               "monitor": spent.get("monitor", 0.0), "driver": spent["driver"],
               "encode": sum(v for role, v in spent.items() if role.startswith("encoder"))}
        out["total"] = spent["machine"]
        out["rest"] = max(out["total"] - sum(out[r] for r in CPU_ROLES if r != "rest"), 0.0)
        return {**{k: 1000 * v / batches for k, v in out.items()}, "batches": batches}


def _user_system(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system


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


def pipeline_run(case: Case, images: int, image_size: int, out: Path, actors: ActorCache, transport: str,
                 meter: CpuMeter | None = None) -> dict:
    config = load_config(overrides={
        "stream.tasks": 1, "stream.train_per_class": images_per_class(images), "stream.test_per_class": 20,
        "stream.batch_size": case.batch_size, "encoder.spec.name": case.encoder,
        "encoder.spec.image_size": image_size, "encoder.replicas": case.replicas,
        "encoder.threads": max(CORES // case.replicas, 1),
        "method.stage1.optim.epochs": 2, "method.stage2.optim.epochs": 2,
        "runtime.cache_dir": str(out.parent / "cache") if case.cached else "", "runtime.checkpoint": False,
        "runtime.progress": False, "runtime.out": str(out), "runtime.transport": transport})
    return runner.run(config, actors=actors, on_batch=meter).metrics


def stages(metrics: dict, replicas: int) -> dict[str, float]:
    wall, busy = metrics["wall_seconds"], metrics["actor_busy_seconds"]
    encode = sum(v for k, v in busy.items() if k.endswith(".encode"))
    return {
        "source": busy.get("source.source", 0.0), "encode": encode,
        "route": busy.get("memory.slots", 0.0),
        "monitor": busy.get("monitor.monitor", 0.0),
        "train": busy.get("stage1.stage1", 0.0) + busy.get("stage2.stage2", 0.0),
        "evaluate": busy.get("predictor.evaluate", 0.0),
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
    encoders = [] if case.cached else [f"encoder{i}" for i in range(case.replicas)]  # not an earlier case's idle ones
    roles = [role for role in actors.handles if role in ("source", "memory", "monitor", *encoders)]
    batches = -(-len(rows) // case.batch_size)
    bares: list[tuple[float, float]] = []
    runs: dict[str, list[tuple[dict, dict]]] = {t: [] for t in TRANSPORTS}
    for _ in range(repeats):  # alternate, so slow spells of the machine hit every side
        bares.append(bare_loop(encoder, ds, rows, case))
        for transport in TRANSPORTS:
            # the PIDs of this run's processes: a fault in an earlier run may have restarted an actor
            meter = CpuMeter(actors.pids(roles), batches, skip=RuntimeConfig().max_in_flight)
            metrics = pipeline_run(case, images, image_size, out, actors, transport, meter)
            runs[transport].append((metrics, meter.per_batch()))
    bare, bare_cpu = sorted(bares)[len(bares) // 2]  # the median repeat by wall time, with its CPU
    n = runs["actors"][0][0]["samples"]["stream"]
    if {m["samples"]["stream"] for ms in runs.values() for m, _ in ms} != {len(rows)}:
        raise RuntimeError(f"{case}: the transports streamed other rows than the bare loop's {len(rows)}")
    # the floor moves what the source emits (raw images, or feature batches of the cached features' width)
    # through as many hops as the classic chain makes per batch: source, [encoder], memory.route, monitor.observe
    chunks = [rows[a:a + case.batch_size] for a in range(0, len(rows), case.batch_size)]
    emitted = ([S.feature_batch(c, np.zeros((len(c), encoder.dim), np.float32), ds.train_y[c]) for c in chunks]
               if case.cached else [raw_batch(ds, c) for c in chunks])
    floor = ray_floor(emitted, 3 if case.cached else 4, RuntimeConfig().max_in_flight)
    row = {"encoder": case.label, "batch_size": case.batch_size, "replicas": case.replicas, "images": n,
           "repeats": repeats, "bare_samples_per_s": n / bare, "seconds.bare": bare,
           "bare.cpu_ms_per_batch": 1000 * bare_cpu / batches}
    stage_rows = []
    for transport, measured in runs.items():
        median, cpu = sorted(measured, key=lambda m: m[0]["wall_seconds"]["stream"])[len(measured) // 2]
        wall = median["wall_seconds"]["stream"]
        row.update({f"{transport}.samples_per_s": n / wall, f"{transport}.ratio": bare / wall,
                    f"{transport}.overhead_ms_per_batch": 1000 * (wall - bare) / batches,
                    f"{transport}.floor_ms_per_batch": 1000 * floor[transport] / batches,
                    f"{transport}.stream_wall": wall})
        stage_rows.append({"encoder": case.label, "batch_size": case.batch_size, "replicas": case.replicas,
                           "transport": transport, **{f"seconds.{k}": v for k, v in
                                                      stages(median, case.replicas).items()},
                           **{f"cpu_ms.{k}": v for k, v in cpu.items()}})
    return row, stage_rows


def write(rows: list[dict], stage_rows: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, table_rows in (("throughput.csv", rows), ("stages.csv", stage_rows)):
        with files.atomic_open(folder / name, "w", newline="") as f:
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
    files.save_figure(fig, folder / "throughput.png", dpi=110)
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
    bare_cpu = {(r["encoder"], r["batch_size"], r["replicas"]): r["bare.cpu_ms_per_batch"] for r in rows}
    lines += ["", "| stream | batch | replicas | transport | wall ms/batch | " + " | ".join(CPU_ROLES)
              + " | total CPU ms/batch | cores busy | bare loop CPU ms/batch |", "|" + "---|" * (8 + len(CPU_ROLES))]
    for r in stage_rows:
        lines.append(f"| {r['encoder']} | {r['batch_size']} | {r['replicas']} | {r['transport']} | "
                     f"{r['cpu_ms.wall']:.2f} | " + " | ".join(f"{r[f'cpu_ms.{c}']:.2f}" for c in CPU_ROLES)
                     + f" | {r['cpu_ms.total']:.2f} | {r['cpu_ms.total'] / r['cpu_ms.wall']:.2f} | "
                     f"{bare_cpu[r['encoder'], r['batch_size'], r['replicas']]:.2f} |")
    return "\n".join(lines)


def throughput(images: int = 2560, image_size: int = 64, cases: list[Case] | None = None,
               out: str | Path = "runs/bench", repeats: int = 3, log=print) -> tuple[list[dict], list[dict]]:
    folder = Path(out) / "throughput"
    ensure_ray(load_config())
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
