"""How much routing one new MARS slot takes: the slot SGSE adds has key Norm(mean query of the samples that
triggered it) (docs/methods.md, SGSE). Frozen pretrained features share a large common component, so such a key
can attract every class, not only the one it was made from.

    python benchmarks/slot_capture.py              # EfficientNet-Lite0 at 64 px on Fashion-MNIST, 100 images/class

A fresh router (the default 32 random slots) gets one slot keyed on 20 training images of class 0; for each
class, the table gives the mean softmax mass on that slot and the share of images whose top slot it is.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import load_fashion_mnist
from memcl_ops.mars.router import RouterConfig, SlotRouter
from memcl_ops.models.encoders import EncoderSpec, build_encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ds = load_fashion_mnist()
    rows = np.concatenate([np.flatnonzero(ds.train_y == c)[:args.per_class] for c in range(10)])
    encoder = build_encoder(EncoderSpec("efficientnet-lite0", image_size=64, threads=2))
    batch = S.raw_batch(rows, S.IMAGE, ds.train_x[rows], ds.train_y[rows], image_shape=(28, 28))
    h, y = torch.from_numpy(np.asarray(encoder.encode(batch))), ds.train_y[rows]
    router = SlotRouter(h.shape[1], RouterConfig(), seed=args.seed)
    with torch.no_grad():
        new = router.add_slot(router.query(h[y == 0][:20].mean(0, keepdim=True)))
        probs = router.route(h)
    print(f"one slot keyed on 20 images of class 0 ({ds.class_names[0]}), {router.num_slots} slots in all")
    print("| class | mean softmax mass on the new slot | share routed to it (top slot) |")
    print("|---|---|---|")
    for c in range(10):
        p = probs[torch.from_numpy(y == c)]
        print(f"| {c} {ds.class_names[c]} | {p[:, new].mean():.2f} | {(p.argmax(1) == new).float().mean():.2f} |")


if __name__ == "__main__":
    main()
