"""Turning the Arrow batches a trainer receives into one labelled tensor block."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from memcl_ops.arrow import schema as S


def labelled_block(batches: tuple[pa.RecordBatch | None, ...]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(features, labels, sample_ids) of the labelled rows of `batches`, concatenated in stream order
    (None stands for a batch the gate refused entirely)."""
    feats, labels, ids = [], [], []
    for b in batches:
        if b is None:
            continue
        y = S.labels_to_numpy(b)
        keep = y >= 0
        feats.append(S.features_to_numpy(b)[keep])
        labels.append(y[keep])
        ids.append(S.sample_ids_to_numpy(b)[keep])
    if not feats:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), np.zeros(0, np.int64)
    return (torch.from_numpy(np.concatenate(feats)), torch.from_numpy(np.concatenate(labels)),
            np.concatenate(ids))
