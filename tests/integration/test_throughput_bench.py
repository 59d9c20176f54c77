"""`memcl bench throughput` on a tiny stream: the bare loop, the actor chain and the compiled chain see the same
samples, an encoder appears in the stage breakdown only where it is in the chain, and the printed table has a row
per case and per (case, transport). (Its ratios are measurements, printed by the bench, never asserted here.)"""

import math

import pytest

from pipeline.throughput import TRANSPORTS, Case, table, throughput

pytestmark = pytest.mark.ray


def test_throughput_bench_compares_three_paths_on_the_same_stream(ray_session, tmp_path):
    cases = [Case("tiny", 64, 1, images=640), Case("tiny", 64, 1, images=640, cached=True)]
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
    printed = table(rows, stage_rows).splitlines()
    assert sum(line.startswith("| tiny") for line in printed) == len(rows) + len(stage_rows)
