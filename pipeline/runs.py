"""`memcl runs`: the run folders under a parent folder (default runs/) listed, compared side by side, and the
unfinished or old ones removed on request. Reads only the folders' files (config.yaml, metrics.json,
checkpoints/, the marker and lock of pipeline/run_folder.py); starts no Ray.

`clean` removes only what memcl wrote (a folder with memcl's marker), never a run in progress (its lock held) and
never a resumable run (a checkpoint, no metrics.json) unless that folder is named."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from memcl.pipeline import run_folder
from memcl.pipeline.config import ConfigError
from memcl_ops.metrics import figure_text


@dataclass(frozen=True)
class RunFolder:
    path: Path
    kind: str  # "run" (memcl run) or "lm" (memcl lm: several runs side by side)
    method: str
    data: str
    # "running" (its lock held), "finished" (metrics.json written), "stopped" (checkpoints: resumable), "empty"
    status: str
    a_last: float | None  # the headline (the best run's, for an lm folder)
    size_bytes: int
    modified: float  # seconds since the epoch
    marked: bool  # memcl created it (pipeline/run_folder.py); a folder without the marker is never removed

    @classmethod
    def read(cls, path: Path) -> RunFolder:
        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        lm = "methods" in config
        metrics_file = path / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else None
        if lm:
            method = ",".join(config.get("methods") or [])
            data = ",".join((config.get("stream") or {}).get("tasks") or []) or "lm tasks"
        else:
            method = (config.get("method") or {}).get("name", "?")
            data = (config.get("data") or {}).get("dataset", "?")
        a_last = None
        if metrics is not None:
            if lm:
                scores = [r["summary"]["a_last"] for r in metrics.get("runs", {}).values()
                          if (r.get("summary") or {}).get("a_last") is not None]
                a_last = max(scores) if scores else None
            elif metrics.get("summary"):
                a_last = metrics["summary"]["a_last"]
        checkpoints = any(path.rglob("ckpt-*.npz"))
        status = ("running" if run_folder.holder(path) is not None else "finished" if metrics is not None
                  else "stopped" if checkpoints else "empty")
        files = [f for f in path.rglob("*") if f.is_file()]
        return cls(path, "lm" if lm else "run", method, data, status, a_last, sum(f.stat().st_size for f in files),
                   max((f.stat().st_mtime for f in files), default=path.stat().st_mtime), run_folder.is_marked(path))


def find(parent: Path) -> list[RunFolder]:
    """The run folders under `parent`, up to three levels down (`memcl stress` and `memcl bench` nest theirs),
    oldest first."""
    if not parent.is_dir():
        raise ConfigError(f"{parent}: no such folder (runs are written under runs/, or where --out says)")
    folders = {c.parent for pattern in ("*/config.yaml", "*/*/config.yaml", "*/*/*/config.yaml")
               for c in parent.glob(pattern)}
    return sorted((RunFolder.read(p) for p in folders), key=lambda r: r.modified)


def size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def list_table(folders: list[RunFolder], parent: Path) -> str:
    if not folders:
        return f"no run folders under {parent}"
    rows = [("run", "method", "data", "status", "A_last", "size")]
    for f in folders:
        rows.append((str(f.path.relative_to(parent)), f.method, f.data,
                     f.status, figure_text(f.a_last), size_text(f.size_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    total = sum(f.size_bytes for f in folders)
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:], "",
                      f"{len(folders)} runs, {size_text(total)}; `memcl runs compare RUN RUN` puts runs side by side, "
                      "`memcl runs clean --unfinished` removes the runs that never finished"])


COMPARED = (("A_last", "a_last"), ("Ā", "a_mean"), ("forgetting", "forgetting"), ("BWT", "bwt"))


def compare_table(paths: list[Path]) -> str:
    """Two or more `memcl run` folders side by side: what they ran and how they scored."""
    if len(paths) < 2:
        raise ConfigError("memcl runs compare needs two run folders or more")
    columns = []
    for path in paths:
        if not (path / "metrics.json").is_file():
            raise ConfigError(f"{path}: no metrics.json (not a finished `memcl run` folder)")
        metrics = json.loads((path / "metrics.json").read_text())
        if "runs" in metrics:
            raise ConfigError(f"{path}: a `memcl lm` folder (its runs are side by side already: memcl report {path})")
        columns.append((path.name, metrics))
    pct = figure_text
    rows = [("", *[name for name, _ in columns]),
            ("method", *[m["method"] for _, m in columns]),
            ("data", *[m["dataset"] for _, m in columns]),
            ("seed", *[str(m["seed"]) for _, m in columns])]
    rows += [(label, *[pct((m.get("summary") or {}).get(key)) for _, m in columns]) for label, key in COMPARED]
    rows += [("learned / streamed", *[f"{m['samples']['learned']} / {m['samples']['stream']}" for _, m in columns]),
             ("memory bytes", *[f"{sum(m['memory_bytes'].values()):,}" for _, m in columns]),
             ("wall seconds", *[f"{m['wall_seconds']['total']:.0f}" for _, m in columns])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def clean_plan(parent: Path, unfinished: bool, older_than_days: float | None, named: list[Path] = ()
               ) -> tuple[list[RunFolder], list[tuple[RunFolder, str]]]:
    """What `memcl runs clean` would remove, and what it leaves with the reason: of the run folders under `parent`
    (or the `named` ones), those that never finished (`unfinished`) or were last written more than `older_than_days`
    ago (named folders: all of them unless those say otherwise). It leaves a folder memcl did not create, a run in
    progress, and a resumable run unless it is named."""
    if not named and not unfinished and older_than_days is None:
        raise ConfigError("memcl runs clean: say what to remove: --unfinished, --older-than DAYS, or run folders")
    for path in named:
        if not (path / "config.yaml").is_file():
            raise ConfigError(f"{path}: not a run folder (no config.yaml)")
    cutoff = time.time() - 86400 * older_than_days if older_than_days is not None else None
    candidates = [RunFolder.read(p) for p in named] if named else find(parent)
    chosen = [f for f in candidates if (not unfinished and cutoff is None)
              or (unfinished and f.status != "finished") or (cutoff is not None and f.modified < cutoff)]
    remove, keep = [], []
    for f in chosen:
        if not f.marked:
            keep.append((f, f"not created by memcl (no {run_folder.MARKER}): remove it yourself if it is a run"))
        elif f.status == "running":
            keep.append((f, f"in progress (pid {run_folder.holder(f.path) or '?'})"))
        elif f.status == "stopped" and not named:
            command = "memcl lm" if f.kind == "lm" else "memcl run"
            keep.append((f, f"resumable ({command} --resume {f.path}); name it to remove it"))
        else:
            remove.append(f)
    return remove, keep


def remove(folders: list[RunFolder]) -> list[RunFolder]:
    """Remove each run folder, holding its lock meanwhile (a run that started since the plan keeps its folder);
    returns those removed."""
    removed = []
    for f in folders:
        try:
            lock = run_folder.RunLock(f.path, wait=0.0)
        except run_folder.RunInUse:
            continue
        with lock:
            shutil.rmtree(f.path)
        removed.append(f)
    return removed
