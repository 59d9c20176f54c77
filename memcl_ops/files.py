"""Files a reader may see, written whole or not at all: each is written to a hidden temp file in its own folder,
flushed and fsynced, renamed over its name and the folder fsynced, so a reader (or a run resumed after a crash or a
power cut) finds the previous version or the new one, never a part. The temp name ends in `.tmp`, so no reader that
globs a folder for its suffix (`*.parquet`, `ckpt-*.npz`) takes a temp file left by a crash for a file.

JSON files are strict JSON (RFC 8259): a figure that is undefined (NaN) or infinite is written as null, and
`json_safe` turns numpy scalars and arrays into plain numbers and lists."""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside `path` to write to; when the block ends without an error the temp file is fsynced and
    renamed to `path` and the folder fsynced, on an error it is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """`open(path, mode)` whose writes land at `path` whole when the block ends (see `atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def json_safe(value: Any) -> Any:
    """`value` with every float that is NaN or infinite replaced by None (null: the figure is undefined), numpy
    scalars as Python numbers and arrays as lists, recursively through dicts, lists and tuples."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def json_text(value: Any, indent: int | None = 2) -> str:
    """Strict JSON of `value` (`json_safe`); a value JSON cannot hold raises rather than writing a non-standard
    token."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


def write_json(path: str | Path, value: Any, indent: int | None = 2) -> None:
    write_text(path, json_text(value, indent))


def write_parquet(table: Any, path: str | Path, **kwargs: Any) -> None:
    """`pyarrow.parquet.write_table(table, path)`, atomically."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, **kwargs)


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """`fig.savefig(path)`, atomically (the format from `path`'s suffix)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or None, **kwargs)


def publish_folder(tmp: Path, folder: Path) -> None:
    """Rename the folder `tmp`, written in full, to `folder` (which must not exist), its files fsynced first: a reader
    finds the whole folder or none."""
    for path in sorted(tmp.rglob("*")):
        if path.is_file():
            _fsync_file(path)
    _fsync_dir(tmp)
    os.replace(tmp, folder)
    _fsync_dir(folder.parent)
