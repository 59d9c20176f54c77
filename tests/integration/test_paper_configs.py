"""The paper-setting configs (pipeline/configs/: CIFAR-100 and Tiny-ImageNet, 10 tasks, open_clip ViT-B/16) need
data and weights that cannot be had offline. Here they run unchanged except for the paths: on an image folder
the test writes, with a tiny open_clip architecture (a model-config JSON) and a checkpoint the test saves.
In-process in the default tier; through the whole actor pipeline in the slow tier (the encoder actor's start-up
alone costs tens of seconds on a busy 2-core machine)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import memcl.pipeline
from memcl.pipeline import runner
from memcl.pipeline.config import load_config
from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import DatasetUnavailable, load_dataset
from memcl_ops.data.feature_cache import FeatureCache
from memcl_ops.data.streams import make_plan
from memcl_ops.models.encoders import build_encoder

CONFIGS = Path(memcl.pipeline.__file__).parent / "configs"
PAPER = ["cifar100-10", "tinyimagenet-10"]
CLASSES, TRAIN, TEST, EMBED = 20, 3, 2, 16


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """20 classes of 16x16 PNGs (a colour per class plus noise), a tiny ViT config and its saved weights."""
    root = tmp_path_factory.mktemp("assets")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        colour = rng.integers(30, 226, size=3)
        for split, n in (("train", TRAIN), ("test", TEST)):
            folder = root / "images" / split / f"class{c:02d}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(colour + rng.normal(scale=20, size=(16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    model_json = root / "memcl-tiny-vit.json"
    vision = {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16}
    text = {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 1, "layers": 1}
    model_json.write_text(json.dumps({"embed_dim": EMBED, "vision_cfg": vision, "text_cfg": text}))
    import open_clip

    open_clip.add_model_config(model_json)
    torch.manual_seed(0)
    checkpoint = root / "tiny-vit.pt"
    torch.save(open_clip.create_model("memcl-tiny-vit").state_dict(), checkpoint)
    return root / "images", model_json, checkpoint


@pytest.mark.parametrize("name", PAPER)
def test_config_states_the_paper_setting_and_names_the_missing_data(name):
    config = load_config(CONFIGS / f"{name}.yaml")
    assert config.stream.tasks == 10 and config.stream.train_per_class is None
    assert config.method.name == "mars"
    spec = config.encoder.spec
    assert spec.name == "open_clip:ViT-B-16" and spec.image_size == 224
    assert Path(spec.pretrained).is_absolute()
    assert config.data.dataset.startswith("image-folder:/")
    with pytest.raises(DatasetUnavailable, match="train/<class>/ and test/<class>/"):
        load_dataset(config.data.dataset)  # the documented path is not on this machine


def on_fixture(name: str, assets, tmp_path, **extra):
    """The shipped config with only the data path, the model and its checkpoint (and the input size) swapped."""
    images, model_json, checkpoint = assets
    return load_config(CONFIGS / f"{name}.yaml", overrides={
        "data.dataset": f"image-folder:{images}", "encoder.spec.name": f"open_clip:{model_json}",
        "encoder.spec.pretrained": str(checkpoint), "encoder.spec.image_size": 32, **extra})


@pytest.mark.parametrize("name", PAPER)
def test_config_stream_and_encoder_work_on_a_fixture_folder(tmp_path, assets, name):
    config = on_fixture(name, assets, tmp_path, **{"encoder.spec.device": "cpu"})
    data = load_dataset(config.data.dataset)
    plan = make_plan(data.train_y, data.test_y, data.num_classes, config.stream)
    assert len(plan.classes) == 10 and sorted(c for cs in plan.classes for c in cs) == list(range(CLASSES))
    encoder = build_encoder(config.encoder.spec)
    feats = encoder.encode(S.raw_batch(np.arange(len(data.test_y)), "image", data.test_x, data.test_y,
                                       image_shape=data.image_shape))
    assert feats.shape == (CLASSES * TEST, EMBED) and encoder.dim == EMBED
    # the checkpoint's weights are the ones in use, and features carry the class: same-colour images are closer
    reference = torch.load(assets[2])
    assert all(torch.equal(encoder.model.state_dict()[k], v) for k, v in reference.items())
    dist = np.linalg.norm(feats[:, None] - feats[None], axis=-1)
    same = data.test_y[:, None] == data.test_y[None]
    assert dist[same & ~np.eye(len(feats), dtype=bool)].mean() < 0.5 * dist[~same].mean()


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("name", PAPER)
def test_config_runs_through_the_pipeline_on_a_fixture_folder(actors, tmp_path, assets, name):
    config = on_fixture(name, assets, tmp_path, **{
        "encoder.threads": 1, "stream.batch_size": 16, "method.router.initial_slots": 4,
        "method.stage1.optim.epochs": 1, "runtime.cache_dir": str(tmp_path / "cache"), "runtime.out": str(tmp_path),
        "runtime.progress": False, "runtime.actor_threads": 1})
    checkpoint = assets[2]
    metrics = runner.run(config, actors=actors).metrics
    assert len(metrics["task_classes"]) == 10 and all(len(c) == CLASSES // 10 for c in metrics["task_classes"])
    acc = np.array(metrics["acc_matrix"], dtype=float)
    assert acc.shape == (10, 10) and not np.isnan(acc[np.tril_indices(10)]).any()
    assert metrics["samples"]["learned"] == metrics["samples"]["unique_learned"] == CLASSES * TRAIN
    # the features came from the checkpoint's model, through the feature cache
    cached = sorted(p.name for p in (tmp_path / "cache").glob("*.parquet"))
    assert len(cached) == 2 and all("memcl-tiny-vit" in p and checkpoint.name in p for p in cached)
    rows, feats = FeatureCache(tmp_path / "cache").load(cached[0][:-len(".parquet")])
    assert feats.shape == (len(rows), EMBED) and np.isfinite(feats).all() and feats.std() > 0
