"""Encoder samples/s through one Encoder actor, on the GPU when Ray sees one (issue 7's GPU check).

One replica per encoder, created exactly as the pipeline's encoder pool creates it (`num_gpus=1` when the cluster
has GPUs), fed the same raw Fashion-MNIST image batches by reference; after `--warmup` batches, `--batches` are
timed back to back with the encoder pool's bound on calls in flight. The encoders are EfficientNet-Lite0 (ImageNet
weights; `--image-size`) and open_clip ViT-B-16 with random weights at its own 224 px (no network needed; the
speed is the architecture's).

    python benchmarks/encoder_speed.py                                   # GPU machine: 224 px, batch 256
    python benchmarks/encoder_speed.py --image-size 64 --batch 32 --batches 2   # a CPU check (ViT: ~30 s/batch)

Prints one row per encoder: device, resolution, batch, samples/s, seconds per batch and peak GPU memory.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np
import ray

from actors.encoder import Encoder
from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import load_fashion_mnist
from memcl_ops.models.encoders import EncoderSpec
from pipeline.config import EncoderPoolConfig
from pipeline.progress import InFlight, Progress


def peak_gpu_gib(_actor) -> float:
    """Run inside the encoder's process (`__ray_call__`): its peak CUDA memory."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def measure(name: str, args: argparse.Namespace, gpus: int) -> dict:
    ds = load_fashion_mnist()
    rows = np.arange(args.batch)
    batch = ray.put(S.raw_batch(rows, S.IMAGE, ds.train_x[rows], ds.train_y[rows], image_shape=(28, 28)))
    spec = EncoderSpec(name, image_size=args.image_size, micro_batch=args.batch if gpus else 64)
    encoder = Encoder.options(num_gpus=1 if gpus else 0).remote(spec, S.IMAGE, args.threads)
    info = ray.get(encoder.info.remote())
    for _ in range(args.warmup):
        ray.get(encoder.encode.remote(batch)[0])
    window = InFlight(EncoderPoolConfig().max_in_flight, Progress(enabled=False).bar("", args.batches))
    start = time.perf_counter()
    for _ in range(args.batches):
        window.add(encoder.encode.remote(batch)[0])
    window.drain()
    seconds = time.perf_counter() - start
    peak = ray.get(encoder.__ray_call__.remote(peak_gpu_gib))
    ray.kill(encoder)
    return {"encoder": info["id"], "device": info["device"], "batch": args.batch,
            "samples_per_s": args.batches * args.batch / seconds, "s_per_batch": seconds / args.batches,
            "peak_gib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoders", nargs="+", default=["efficientnet-lite0", "open_clip:ViT-B-16"])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=20, help="timed batches per encoder")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads in the actor")
    args = parser.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    print(f"Ray sees {gpus} GPU(s)")
    print("| encoder @ input px | device | batch | samples/s | s/batch | peak GPU GiB |")
    print("|---|---|---|---|---|---|")
    for name in args.encoders:
        r = measure(name, args, gpus)
        print(f"| {r['encoder']} | {r['device']} | {r['batch']} | {r['samples_per_s']:.0f} | "
              f"{r['s_per_batch']:.3f} | {r['peak_gib']:.2f} |", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
