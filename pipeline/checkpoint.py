"""Atomic, checksummed checkpoints of every actor's state (dicts of numpy arrays) plus the runner's own.

Layout: `<dir>/ckpt-<seq>.npz` and its `<dir>/ckpt-<seq>.sha256`. Each file is written to a temp name, fsynced
and renamed, and the folder fsynced (memcl_ops/files.py); the checksum is written last, so a checkpoint without a
matching checksum is incomplete or corrupt and is refused. `latest_valid` falls back to the newest good one.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path

import numpy as np

from memcl_ops import files

State = dict[str, np.ndarray]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or does not match its checksum."""


def write(directory: Path, seq: int, parts: dict[str, State], meta: dict, keep: int = 2) -> Path:
    """Write checkpoint `seq` atomically; keeps the newest `keep` checkpoints."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"{part}/{key}": np.asarray(value) for part, state in parts.items() for key, value in state.items()}
    arrays["__meta__"] = np.array(json.dumps(meta))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    path = directory / f"ckpt-{seq:06d}.npz"
    files.write_bytes(path, data)
    files.write_bytes(path.with_suffix(".sha256"), hashlib.sha256(data).hexdigest().encode())
    for old in sorted(directory.glob("ckpt-*.npz"))[:-keep]:
        old.unlink(missing_ok=True)
        old.with_suffix(".sha256").unlink(missing_ok=True)
    return path


def read(path: Path) -> tuple[dict[str, State], dict]:
    """(parts, meta) of one checkpoint; raises CheckpointError naming what is wrong."""
    sidecar = path.with_suffix(".sha256")
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    if not sidecar.exists():
        raise CheckpointError(f"{path}: no checksum file (the write did not complete)")
    data = path.read_bytes()
    expected = sidecar.read_text().strip()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise CheckpointError(f"{path}: checksum mismatch (file {actual[:12]}…, recorded {expected[:12]}…): "
                              "truncated or corrupted")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError) as err:
        raise CheckpointError(f"{path}: unreadable npz: {err}") from err
    meta = json.loads(str(arrays.pop("__meta__")))
    parts: dict[str, State] = {}
    for key, value in arrays.items():
        part, name = key.split("/", 1)
        parts.setdefault(part, {})[name] = value
    return parts, meta


def latest_valid(directory: Path) -> tuple[Path, dict[str, State], dict] | None:
    """The newest checkpoint that passes its checksum, warning about each newer one that does not."""
    for path in sorted(directory.glob("ckpt-*.npz"), reverse=True):
        try:
            parts, meta = read(path)
        except CheckpointError as err:
            warnings.warn(f"skipping bad checkpoint: {err}", stacklevel=2)
            continue
        return path, parts, meta
    return None
