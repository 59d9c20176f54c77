"""What a run appends once per committed round, kept on disk in the run folder (`journal/<name>.jsonl`, a JSON line
per record) rather than in the run state: the round log, the accuracy matrix's rows and what each follows, the
anytime rows and the prequential curve. So the run state a checkpoint copies, and the driver's memory, stay one size
however long the run. Each append is flushed and fsynced before the round's checkpoint is written; the checkpoint
keeps how many lines each file held, and a resumed run cuts the files back to that before it appends again."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

STREAMS = ("round_log", "acc_rows", "rows", "anytime_rows", "curve")


class Journal:
    def __init__(self, run_dir: Path):
        self.folder = Path(run_dir) / "journal"

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.jsonl"

    def append(self, name: str, records: list) -> None:
        """Records at the end of stream `name`, on disk when this returns."""
        if not records:
            return
        self.folder.mkdir(exist_ok=True)
        with open(self._path(name), "a") as f:
            f.write("".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())

    def read(self, name: str) -> list:
        return list(self.iter(name))

    def iter(self, name: str) -> Iterator:
        path = self._path(name)
        if not path.exists():
            return
        with open(path) as f:
            for line in f:
                yield json.loads(line)

    def cut(self, counts: dict[str, int]) -> None:
        """Every stream back to `counts` records (those a checkpoint committed); what a killed run appended after
        its last checkpoint goes."""
        for name in STREAMS:
            path, keep = self._path(name), counts.get(name, 0)
            if not path.exists():
                if keep:
                    raise FileNotFoundError(f"{path}: the checkpoint counts {keep} records there, the file is gone")
                continue
            with open(path, "rb+") as f:
                offset = 0
                for _ in range(keep):
                    line = f.readline()
                    if not line.endswith(b"\n"):
                        raise ValueError(f"{path}: the checkpoint counts {keep} records, the file holds fewer")
                    offset += len(line)
                f.truncate(offset)
                f.flush()
                os.fsync(f.fileno())
