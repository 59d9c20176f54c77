"""Bring your own data: `arrow:<folder>` streams of Parquet or Arrow IPC files with many batches per file,
image folders of mixed sizes, and a run whose every row is refused (the command exits non-zero)."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from memcl.pipeline import cli, runner
from memcl.pipeline.config import load_config
from memcl_ops.arrow import schema as S

pytestmark = pytest.mark.ray

DIM, NAMES = 8, ["cat", "dog", "eel", "fox"]


def synthetic_tables(rows_per_file=70):
    """Two tasks of two classes, two train files per task and one test file per task."""
    rng = np.random.default_rng(0)
    means = rng.normal(scale=3, size=(4, DIM))
    tables, next_id = {"train": [], "test": []}, 0
    for split, files_per_task in (("train", 2), ("test", 1)):
        for task in (0, 1):
            for _ in range(files_per_task):
                labels = rng.choice([2 * task, 2 * task + 1], rows_per_file)
                feats = means[labels] + rng.normal(size=(rows_per_file, DIM))
                batch = S.feature_batch(np.arange(next_id, next_id + rows_per_file), feats, labels,
                                        np.full(rows_per_file, task))
                next_id += rows_per_file
                tables[split].append(pa.Table.from_batches([batch]))
    return tables


def write_parquet(root, tables):
    for split, items in tables.items():
        (root / split).mkdir(parents=True)
        for i, table in enumerate(items):
            named = table.replace_schema_metadata({**table.schema.metadata, b"class_names": repr(NAMES)
                                                   .replace("'", '"').encode()})
            pq.write_table(named, root / split / f"{i:03d}.parquet", row_group_size=25)  # several row groups


def write_ipc(root, tables):
    for split, items in tables.items():
        (root / split).mkdir(parents=True)
        for i, table in enumerate(items):
            with pa.ipc.new_file(root / split / f"{i:03d}.arrow", table.schema) as writer:
                for batch in table.to_batches(max_chunksize=30):  # several record batches per file
                    writer.write_batch(batch)
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")


def feature_config(root, tmp_path, **extra):
    return load_config(overrides={
        "data.dataset": f"arrow:{root}", "data.payload": "features", "data.feature_dim": DIM,
        "stream.batch_size": 32, "method.router.initial_slots": 2, "method.stage1.optim.epochs": 1,
        "method.stage2.optim.epochs": 2, "runtime.out": str(tmp_path / "runs"), "runtime.progress": False,
        "runtime.actor_threads": 1, **extra})


def test_parquet_and_ipc_folders_give_the_same_run(actors, tmp_path):
    tables = synthetic_tables()
    write_parquet(tmp_path / "pq", tables)
    write_ipc(tmp_path / "ipc", tables)
    from_parquet = runner.run(feature_config(tmp_path / "pq", tmp_path), actors=actors).metrics
    from_ipc = runner.run(feature_config(tmp_path / "ipc", tmp_path), actors=actors).metrics
    assert from_parquet["samples"]["stream"] == from_parquet["samples"]["learned"] == 4 * 70
    assert from_parquet["visits"] == [0, 1]
    np.testing.assert_array_equal(from_parquet["acc_matrix"], from_ipc["acc_matrix"])
    assert from_parquet["summary"] == from_ipc["summary"] and from_parquet["summary"]["a_last"] > 0.5
    assert from_parquet["class_names"] == from_ipc["class_names"] == NAMES  # schema metadata / classes.txt
    # re-batched by stream.batch_size: each 70-row file is 3 batches (32 + 32 + 6), never spanning two files
    assert [r["batches"] for r in from_parquet["round_log"]] == [6, 6]


def test_every_row_refused_exits_non_zero_with_the_reasons(ray_session, tmp_path, capsys):
    """Each row broken its own way (three of another width, two without a sample_id, one NaN): the run learns
    nothing, exits 1, and the closing line counts the reasons and says the commonest in words, with what the gate
    found in one of its rows."""
    root = tmp_path / "ragged"
    (root / "train").mkdir(parents=True)
    features = [[0.5] * DIM if i > 2 else [0.5] * (DIM - 1 - i % 2) for i in range(6)]
    features[5] = [float("nan")] * DIM
    ragged = pa.table({S.SAMPLE_ID: pa.array([0, 1, 2, None, None, 5], pa.int64()),
                       S.TASK_ID: pa.array([0] * 6, pa.int32()), S.LABEL: pa.array([0, 1] * 3, pa.int32()),
                       S.FEATURES: pa.array(features, pa.list_(pa.float32()))})
    pq.write_table(ragged, root / "train" / "000.parquet")
    rc = cli.main(["run", "--set", f"data.dataset=arrow:{root}", "--set", "data.payload=features",
                   "--set", f"data.feature_dim={DIM}", "--set", "method.name=finetune",
                   "--set", f"runtime.out={tmp_path / 'runs'}", "--set", "runtime.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1].startswith("memcl: error: nothing was learned: 6 of 6 training rows refused (feature_dim 3, "
                              "null 2, non_finite 1); the commonest, feature_dim: the features do not have "
                              f"data.feature_dim values (column 'features': rows of [{DIM - 2}, {DIM - 1}] values, "
                              f"expected {DIM}); the rows are in ")
    assert "dead_letters" in err[-1]


def with_string_labels(table: pa.Table) -> pa.Table:
    idx = table.schema.get_field_index(S.LABEL)
    return table.set_column(idx, pa.field(S.LABEL, pa.string()), pc.cast(table.column(idx), pa.string()))


def run_cli(root, tmp_path, capsys, *extra):
    rc = cli.main(["run", "--set", f"data.dataset=arrow:{root}", "--set", "data.payload=features",
                   "--set", f"data.feature_dim={DIM}", "--set", "method.name=finetune",
                   "--set", f"runtime.out={tmp_path / 'runs'}", "--set", "runtime.progress=false", *extra])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err.strip().splitlines()


def test_refused_rows_are_reported_per_split_and_file_and_strict_fails_the_run(ray_session, tmp_path, capsys):
    """One train file and one test file whose label column is text: a closing warning counts training and test
    refusals apart (the test rows once, though every evaluation reads them), names the files, points at the dead
    letters (which name file and row); --strict makes it exit 1; the task's classes still have their names."""
    tables = synthetic_tables()
    tables["train"][3] = with_string_labels(tables["train"][3])  # task 1's second file
    tables["test"][1] = with_string_labels(tables["test"][1])  # task 1's test file
    write_ipc(tmp_path / "data", tables)
    rc, out, err = run_cli(tmp_path / "data", tmp_path, capsys)
    assert rc == 0
    run_dir = next((tmp_path / "runs").iterdir())
    assert err[-1] == (f"memcl: warning: 70 of 280 training rows refused (schema 70); 70 test rows refused "
                       f"(schema 70); by file: train/003.arrow 70, test/001.arrow 70; the commonest, schema: a "
                       f"column is missing or holds a type that does not convert to the contract's (column 'label': "
                       f"wrong type string, expected int32); the rows are in {run_dir}/dead_letters/")
    dead = pq.read_table(run_dir / "dead_letters")
    assert sorted(set(zip(dead.column("split").to_pylist(), dead.column("origin").to_pylist()))) == [
        ("test", "test/001.arrow"), ("train", "train/003.arrow")]
    train_dead = dead.filter(pc.equal(dead.column("split"), "train"))
    assert sorted(train_dead.column("position").to_pylist()) == list(range(70))  # rows of the file, not the batch
    assert sorted(train_dead.column(S.SAMPLE_ID).to_pylist()) == tables["train"][3].column(S.SAMPLE_ID).to_pylist()
    assert "task 2: eel, fox" in out  # the accepted file of task 1 still names its classes
    rc, _, err = run_cli(tmp_path / "data", tmp_path, capsys, "--strict")
    assert rc == 1 and err[-1].startswith("memcl: error: 70 of 280 training rows refused")


def test_labels_without_a_name_are_warned_and_data_labels_drop_them_from_the_tasks(ray_session, tmp_path, capsys,
                                                                                  caplog):
    tables = synthetic_tables()
    labels = tables["train"][0].column(S.LABEL).to_numpy().copy()
    labels[:5] = 7  # beyond classes.txt's four names
    idx = tables["train"][0].schema.get_field_index(S.LABEL)
    tables["train"][0] = tables["train"][0].set_column(idx, tables["train"][0].schema.field(idx),
                                                       pa.array(labels, pa.int32()))
    write_ipc(tmp_path / "data", tables)
    rc, out, err = run_cli(tmp_path / "data", tmp_path, capsys)
    warned = [r.getMessage() for r in caplog.records if "no class name" in r.getMessage()]
    assert rc == 0 and len(warned) == 1 and warned[0].startswith("data: labels 7 have no class name (4 names given")
    assert "task 1: cat, dog, 7" in out
    caplog.clear()
    rc, out, err = run_cli(tmp_path / "data", tmp_path, capsys, "--set", "data.labels=[0,1,2,3]")
    assert rc == 0 and not any("no class name" in r.getMessage() for r in caplog.records)
    assert "task 1: cat, dog\n" in out and "5 of 280 training rows refused (unknown_label 5)" in err[-1]


def test_an_empty_source_exits_non_zero(ray_session, tmp_path, capsys):
    root = tmp_path / "empty"
    (root / "train").mkdir(parents=True)
    pq.write_table(pa.Table.from_batches([S.feature_batch(np.arange(0), np.zeros((0, DIM)))]),
                   root / "train" / "000.parquet")
    rc = cli.main(["run", "--set", f"data.dataset=arrow:{root}", "--set", f"data.feature_dim={DIM}",
                   "--set", "method.name=finetune", "--set", f"runtime.out={tmp_path / 'runs'}",
                   "--set", "runtime.progress=false"])
    assert rc == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == "memcl: error: nothing was learned: the source " \
                                                               "streamed no rows"


def write_images(root, sizes):
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        for c, name in enumerate(["circle", "square"]):
            (root / split / name).mkdir(parents=True)
            for i, (w, h) in enumerate(sizes):
                pixels = np.clip(rng.normal(40, 10, size=(h, w, 3)), 0, 255)
                pixels[:, c * w // 2:(c + 1) * w // 2] += 150  # the left half bright, or the right half
                pixels = pixels.clip(0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")


def test_mixed_size_image_folder_runs_with_image_size(actors, tmp_path):
    write_images(tmp_path / "imgs", [(20, 20), (28, 24), (16, 30)] * 4)
    overrides = {"data.dataset": f"image-folder:{tmp_path / 'imgs'}", "stream.tasks": 1, "method.name": "simplecil",
                 "encoder.spec.name": "tiny", "encoder.spec.dim": 16, "encoder.threads": 1,
                 "stream.train_per_class": None, "stream.test_per_class": None,
                 "runtime.cache_dir": str(tmp_path / "cache"), "runtime.out": str(tmp_path / "runs"),
                 "runtime.progress": False, "runtime.actor_threads": 1}
    with pytest.raises(Exception, match=r"data\.image_size"):
        runner.run(load_config(overrides=overrides), actors=actors)
    metrics = runner.run(load_config(overrides={**overrides, "data.image_size": 24}), actors=actors).metrics
    assert metrics["samples"]["learned"] == metrics["samples"]["stream"] == 24
    assert metrics["class_names"] == ["circle", "square"]
    assert metrics["acc_matrix"][0][0] > 0.9  # left-bright against right-bright images


def test_text_folder_goes_through_the_content_cache(actors, tmp_path):
    rng = np.random.default_rng(2)
    words = [["goal", "match", "team", "score"], ["vote", "party", "law", "minister"]]
    root = tmp_path / "texts"
    for split, n in (("train", 40), ("test", 10)):
        (root / split).mkdir(parents=True)
        for task in (0, 1):
            labels = np.full(n, task)
            texts = [" ".join(rng.choice(words[task], 5)) + f" {split}{i}" for i in range(n)]
            batch = S.raw_batch(np.arange(n) + 100 * task, "text", texts, labels, labels)
            pq.write_table(pa.Table.from_batches([batch]), root / split / f"{task}.parquet")
    config = load_config(overrides={
        "data.dataset": f"arrow:{root}", "data.payload": "text", "encoder.spec.name": "tiny", "encoder.spec.dim": 16,
        "encoder.threads": 1, "method.name": "simplecil", "runtime.cache_dir": str(tmp_path / "cache"),
        "runtime.out": str(tmp_path / "runs"), "runtime.progress": False, "runtime.actor_threads": 1})
    first = runner.run(config, actors=actors).metrics
    files = sorted((tmp_path / "cache").glob("content-*/*.parquet"))
    assert len(files) == 1 and pq.read_table(files[0]).num_rows == 2 * (40 + 10)  # every distinct row, once
    again = runner.run(config, actors=actors).metrics
    assert sorted((tmp_path / "cache").glob("content-*/*.parquet")) == files  # nothing left to encode
    np.testing.assert_array_equal(first["acc_matrix"], again["acc_matrix"])
    assert first["samples"]["learned"] == 80 and first["summary"]["a_last"] > 0.9
