"""Bytes per task of NSR's bank for CLIP ViT-B/16 with LoRA on q and v in all 12 blocks, from the real module
shapes (open_clip `create_model('ViT-B-16')`, random init: shapes do not depend on the weights), through the real
injection and compression code. The paper reports 0.29 MB of parameters per task.

The adapter is filled with random full-rank factors: their energy is spread over all r components, the case in
which the default energy rule (η_E = 0.90) is stopped by the cap k_max, i.e. the largest entry the default
compression stores. An adapter whose energy is concentrated keeps fewer components and costs less (table below).

Also times the compression side by side: SVD through QRs of the factors vs `torch.linalg.svd` of the dense delta.

    python benchmarks/nsr_bank_bytes.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from memcl_ops.models.lora import TARGET_PRESETS, LoRAAdapters, LoRAConfig
from memcl_ops.models.lowrank import CompressionConfig, compress, factored_svd
from memcl_ops.nsr.adapter import Snapshot

HEAD_CLASSES = 10  # one 5-Datasets task
DENSE_TIMED = 4  # dense SVDs timed (each takes ~0.1-1 s here)


def main() -> int:
    import open_clip

    torch.manual_seed(0)
    visual = open_clip.create_model("ViT-B-16").visual.eval()
    lora = LoRAConfig(targets=TARGET_PRESETS["open_clip_qv"])  # rank 8, α 16 (docs/methods.md, "NSR")
    adapters = LoRAAdapters(visual, lora)
    sites = list(adapters.sites)
    shapes = {(adapters.sites[s].d_out, adapters.sites[s].d_in) for s in sites}
    with torch.no_grad():
        for p in adapters.parameters():
            p.normal_(0.0, 0.02)
    dim = int(visual.output_dim)
    head = {"weight": np.zeros((HEAD_CLASSES, dim), np.float32), "bias": np.zeros(HEAD_CLASSES, np.float32)}

    default = CompressionConfig()
    deltas = {s: compress(*adapters.factor_pair(s), default) for s in sites}
    entry = Snapshot(deltas, head).entry(0, np.ones(dim, np.float32))
    factor_bytes = sum(d.nbytes for d in deltas.values())
    params = sum(d.B.size + d.A.size for d in deltas.values())
    print(f"open_clip ViT-B-16 visual tower: {len(sites)} LoRA sites (q and v of {len(sites) // 2} blocks), "
          f"shapes {sorted(shapes)}, rank {lora.rank}; {adapters.num_parameters():,} trainable adapter parameters")
    print(f"default compression {default}: kept ranks {sorted({d.rank for d in deltas.values()})}, "
          f"energy kept {np.mean([d.energy_kept for d in deltas.values()]):.3f}")
    print()
    print("| stored per task | parameters | bytes | MB (10^6 B) |")
    print("|---|---|---|---|")
    print(f"| compressed q, v factors (fp16, k = {deltas[sites[0]].rank}) | {params:,} | {factor_bytes:,} | "
          f"{factor_bytes / 1e6:.3f} |")
    print(f"| task key (float32, {dim}) | {dim} | {entry.key.nbytes:,} | {entry.key.nbytes / 1e6:.4f} |")
    head_bytes = sum(v.nbytes for v in head.values())
    print(f"| task head ({HEAD_CLASSES} classes, float32) | {head_bytes // 4:,} | {head_bytes:,} | "
          f"{head_bytes / 1e6:.4f} |")
    print(f"| **bank entry (what `memory_report()['bank']` counts)** | | **{entry.nbytes:,}** | "
          f"**{entry.nbytes / 1e6:.3f}** |")
    print()
    print("| kept rank k | fp16 factor bytes | MB | fp32 factor bytes | MB |")
    print("|---|---|---|---|---|")
    for k in range(1, lora.rank + 1):
        half = sum(compress(*adapters.factor_pair(s), CompressionConfig(energy=1.0, max_rank=k)).nbytes
                   for s in sites[:1]) * len(sites)
        print(f"| {k} | {half:,} | {half / 1e6:.3f} | {2 * half:,} | {2 * half / 1e6:.3f} |")
    print(f"(uncompressed rank-{lora.rank} adapter in float32: {4 * adapters.num_parameters():,} B)")

    # compression time, side by side on the same deltas: QR of the factors vs SVD of the dense delta (float64)
    pairs = [adapters.factor_pair(s) for s in sites]
    t0 = time.perf_counter()
    for b, a in pairs:
        factored_svd(b, a)
    qr = (time.perf_counter() - t0) / len(pairs)
    dense_pairs = pairs[:DENSE_TIMED]
    t0 = time.perf_counter()
    for b, a in dense_pairs:
        torch.linalg.svd((b @ a).double(), full_matrices=False)
    dense = (time.perf_counter() - t0) / len(dense_pairs)
    print(f"\nSVD per 768x768 delta (float64): QR of factors {1e3 * qr:.2f} ms (mean of {len(pairs)}), dense "
          f"torch.linalg.svd {1e3 * dense:.1f} ms (mean of {len(dense_pairs)}) -> {dense / qr:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
