"""`memcl bench throughput` on a tiny stream: the bare loop, the actor chain and the compiled chain see the same
samples, an encoder appears in the stage breakdown only where it is in the chain, and the printed table has a row
per case and per (case, transport), and the CPU of the chain's processes adds up within the machine's. (Its ratios
are measurements, printed by the bench, never asserted here.)"""

import math
import os

import psutil
import pytest

from memcl.pipeline.throughput import CPU_ROLES, TRANSPORTS, Case, table, throughput

pytestmark = pytest.mark.ray


def test_throughput_bench_compares_three_paths_on_the_same_stream(ray_session, tmp_path):
    cases = [Case("tiny", 64, 1, images=640), Case("tiny", 32, 1, images=640, cached=True)]
    rows, stage_rows = throughput(image_size=32, cases=cases, out=tmp_path, repeats=1, log=lambda _: None)
    assert [r["images"] for r in rows] == [640, 640]
    for r in rows:
        for key in ("bare_samples_per_s", *(f"{t}.{m}" for t in TRANSPORTS for m in ("samples_per_s", "ratio"))):
            assert math.isfinite(r[key]) and r[key] > 0, key
    assert [(r["encoder"], r["transport"]) for r in stage_rows] == [
        ("tiny", "actors"), ("tiny", "compiled"), ("tiny (cached)", "actors"), ("tiny (cached)", "compiled")]
    inline, cached = stage_rows[:2], stage_rows[2:]
    assert all(r["seconds.encode"] > 0 for r in inline) and all(r["seconds.encode"] == 0 for r in cached)
    assert all(r["seconds.route"] > 0 and r["seconds.monitor"] > 0 for r in stage_rows)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")  # the unit Linux counts CPU time in
    for r in stage_rows:  # each process read, the driver's too, is a part of the machine's busy time
        roles = [role for role in CPU_ROLES if role != "rest"]
        slack = 2 * len(roles) * tick_ms / r["cpu_ms.batches"]  # each process's user and system truncated apart
        assert sum(r[f"cpu_ms.{role}"] for role in roles) <= r["cpu_ms.total"] + slack, r
        assert r["cpu_ms.total"] <= psutil.cpu_count() * r["cpu_ms.wall"] + slack, r
    # the learner processes are read at all: one short window can see no tick of theirs, so the four are summed
    assert sum(r["cpu_ms.memory"] + r["cpu_ms.monitor"] for r in stage_rows) > 0, stage_rows
    printed = table(rows, stage_rows).splitlines()
    assert sum(line.startswith("| tiny") for line in printed) == len(rows) + 2 * len(stage_rows)
