"""Where the driver's memory grows over a long horizon: `memcl stress`'s stream (pipeline/stress.py, its defaults)
through the real actor pipeline, with Python's tracemalloc in the driver. A snapshot is taken when a tenth of the
rounds has committed and another when the last has (before the run's reports are drawn); the script prints the
driver's memory at both and the source lines whose live Python allocations grew the most between them (traced
frames: `--frames`).

    python benchmarks/driver_growth.py --tasks 1000            # the top 25 lines
    python benchmarks/driver_growth.py --tasks 1000 --frames 8 --top 10 --group traceback

tracemalloc sees Python allocations only (numpy and Arrow buffers included, Ray's C++ core and the allocator's
fragmentation not); RSS growth beyond what it lists lies there. Beside it, at both marks: the bytes Arrow's memory
pool holds, the object references the driver's Ray core worker counts, the shared pages in the RSS (Ray's object
store is mapped into every process that reads from it) against the memory unique to the driver (USS), and the RSS
once glibc has returned its free memory to the system (`malloc_trim`), which tells freed-but-kept heap from live
native memory.
"""

from __future__ import annotations

import argparse
import ctypes
import tracemalloc
from pathlib import Path

import psutil
import pyarrow as pa
import ray

from memcl.pipeline import runner
from memcl.pipeline.stress import stress_config
from memcl_ops.data.sources import DriftStream
from memcl_ops.rounds import plan_rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=1, help="frames tracemalloc keeps per allocation")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--group", choices=("lineno", "traceback"), default="lineno")
    parser.add_argument("--out", default="runs/driver-growth")
    args = parser.parse_args(argv)

    config = stress_config(args.tasks, False, {"seed": args.seed, "runtime.out": args.out})
    info = DriftStream(config.data.drift, False).describe()
    rounds = len(plan_rounds(info, False, config.method.consolidate_every))
    process = psutil.Process()
    libc = ctypes.CDLL("libc.so.6")
    marks: dict[str, dict[str, float]] = {}
    snapshots = Path(args.out) / "driver-growth-tenth.tracemalloc"

    def on_round(r: int, *_: object) -> None:
        if r + 1 not in (max(rounds // 10, 1), rounds):
            return
        memory = process.memory_full_info()  # before the snapshot: tracemalloc does not trace its own
        libc.malloc_trim(0)
        refs = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
        at = "end" if r + 1 == rounds else "tenth"
        marks[at] = {"RSS MiB": memory.rss / 2**20, "shared pages in RSS MiB": memory.shared / 2**20,
                     "unique (USS) MiB": memory.uss / 2**20,
                     "RSS after malloc_trim MiB": process.memory_info().rss / 2**20,
                     "Arrow pool MiB": pa.total_allocated_bytes() / 2**20, "Ray object references": len(refs)}
        snapshot = tracemalloc.take_snapshot()
        if at == "tenth":  # kept on disk, so the end's figures do not hold it
            snapshots.parent.mkdir(parents=True, exist_ok=True)
            snapshot.dump(str(snapshots))
        else:
            kept["end"] = snapshot

    kept: dict[str, tracemalloc.Snapshot] = {}
    tracemalloc.start(args.frames)
    runner.run(config, on_round=on_round)
    end, start = kept["end"], tracemalloc.Snapshot.load(str(snapshots))
    at_tenth, at_end = marks["tenth"], marks["end"]
    traced = sum(s.size for s in end.statistics("filename")) - sum(s.size for s in start.statistics("filename"))
    print(f"{rounds} rounds; traced Python allocations {traced / 2**20:+.2f} MiB from a tenth to the end")
    for name, value in at_tenth.items():
        print(f"  {name}: {value:,.1f} at a tenth, {at_end[name]:,.1f} at the end "
              f"({100 * (at_end[name] / value - 1) if value else 0:+.1f} %)")
    for stat in end.compare_to(start, args.group)[:args.top]:
        where = "\n      ".join(stat.traceback.format()) if args.group == "traceback" else str(stat.traceback)
        print(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} blocks  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
