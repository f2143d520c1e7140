"""The image tasks: images cut into patches, one patch per token (continuous, 10 classes, train/test).

See :mod:`reservoir.tasks.images` for what each task reads and how it
normalizes; the files are read by :mod:`~reservoir.tasks.images.idx` and
:mod:`~reservoir.tasks.images.cifar`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.runtime import check_seed
from reservoir.tasks.base import Split, TaskData, TaskSpec, register
from reservoir.tasks.images.cifar import read_cifar10
from reservoir.tasks.images.idx import find_mnist, read_mnist
from reservoir.tasks.params import bool_param, check_size, int_param

__all__ = ["CIFAR_MEAN", "CIFAR_STD", "FASHION_MNIST_DIR", "GRAY_WEIGHTS", "build_cifar10", "build_cifar10_lra",
           "build_digits", "build_fashion_mnist", "build_mnist", "patchify"]  # fmt: skip

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # Debian package dataset-fashion-mnist
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)  # R, G, B (tf.image.rgb_to_grayscale)


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
    """Cut images into ``patch x patch`` tokens, row-major, channel last.

    Parameters
    ----------
    images : np.ndarray
        ``(N, H, W)`` or ``(N, H, W, C)``, any dtype; ``patch`` must divide H and W.
    patch : int
        Side of a square patch.

    Returns
    -------
    np.ndarray
        ``(N, (H/p)*(W/p), p*p*C)``, same dtype (a new array). Token ``t`` is
        the patch at patch-row ``t // (W/p)``, patch-column ``t % (W/p)``;
        within a token the values are ``patch[y, x, c]`` flattened row-major.
    """
    x = images[..., None] if images.ndim == 3 else images  # (N, H, W, C)
    n, h, w, c = x.shape
    if patch < 1 or h % patch or w % patch:
        raise ReservoirError(f"expected a patch size dividing the image size {h}x{w}; found patch={patch}")
    x = x.reshape(n, h // patch, patch, w // patch, patch, c)  # (N, H/p, p, W/p, p, C)
    x = x.transpose(0, 1, 3, 2, 4, 5)  # (N, H/p, W/p, p, p, C)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch * c)  # (N, T, p*p*C), copies


def _split(tokens: np.ndarray, labels: np.ndarray) -> Split:
    lengths = np.full(len(tokens), tokens.shape[1], dtype=np.int64)  # (N,)
    return Split(inputs=tokens, lengths=lengths, labels=labels.astype(np.int64, copy=False))


def _counts(task: str, n_train: Any, n_test: Any) -> tuple[int | None, int | None]:
    """``n_train`` and ``n_test`` checked: rows to keep from the start of each split, ``None`` for all."""
    return int_param(task, "n_train", n_train, 1, none_ok=True), int_param(task, "n_test", n_test, 1, none_ok=True)


def _build_idx_task(name: str, data_dir: Any, size: Any, patch: Any, download: bool, n_train: Any, n_test: Any,
                    default: str | None = None) -> TaskData:  # fmt: skip
    """An IDX task: images zero-padded to ``size`` x ``size``, /255, ``patch x patch`` tokens."""
    size, patch, n_train, n_test = _check_idx(name, size, patch, n_train, n_test)
    folder = find_mnist(name, data_dir, bool_param(name, "download", download), default)
    splits = {}
    side = None  # the train images' side
    for split, n in (("train", n_train), ("test", n_test)):
        try:
            images, labels = read_mnist(folder, split, n)  # uint8 (N, H, W), int64 (N,)
        except ReservoirError as err:
            raise ReservoirError(f"task {name!r}: {err}") from None
        check_size(name, len(images) * size * size * 5, f"{len(images):,} {split} images of {size}x{size} pixels")
        if images.shape[1] != images.shape[2]:  # MNIST's and Fashion-MNIST's are 28 x 28
            raise ReservoirError(f"task {name!r}: expected square {split} images in {folder}; found "
                                 f"{images.shape[1]} x {images.shape[2]}")
        if side is not None and images.shape[1] != side:  # padded by different amounts otherwise
            raise ReservoirError(f"task {name!r}: expected the test images of the train images' size, {side} x "
                                 f"{side}; found {images.shape[1]} x {images.shape[2]} in {folder}")
        side = images.shape[1]
        pad = size - images.shape[1]
        if pad < 0 or pad % 2:
            raise ReservoirError(f"task {name!r}: expected size >= the image side {images.shape[1]}, larger by an "
                                 f"even number; found size={size}")  # fmt: skip
        if pad:
            images = np.pad(images, ((0, 0), (pad // 2, pad // 2), (pad // 2, pad // 2)))  # (N, size, size)
        tokens = np.divide(patchify(images, patch), np.float32(255), dtype=np.float32)  # (N, T, p*p) in [0, 1]
        splits[split] = _split(tokens, labels)
    params = {"size": size, "patch": patch, "n_train": n_train, "n_test": n_test}
    return TaskData(name=name, params=params, kind="continuous", d_in=patch * patch, n_classes=10, splits=splits)


def _check_idx(name: str, size: Any, patch: Any, n_train: Any, n_test: Any) -> tuple[int, int, int | None, int | None]:
    """An IDX task's size, patch and counts checked (one line naming the first bad one)."""
    size = int_param(name, "size", size, 1)
    patch = int_param(name, "patch", patch, 1)
    n_train, n_test = _counts(name, n_train, n_test)
    if size % patch:
        raise ReservoirError(f"task {name!r}: patch must divide size={size}; found patch={patch}")
    return size, patch, n_train, n_test


def check_mnist(p: Mapping[str, Any]) -> None:
    """The ``mnist`` parameters checked, without reading a file."""
    _check_idx("mnist", p["size"], p["patch"], p["n_train"], p["n_test"])
    bool_param("mnist", "download", p["download"])


def check_fashion_mnist(p: Mapping[str, Any]) -> None:
    """The ``fashion-mnist`` parameters checked, without reading a file."""
    _check_idx("fashion-mnist", p["size"], p["patch"], p["n_train"], p["n_test"])
    bool_param("fashion-mnist", "download", p["download"])


def build_mnist(data_dir: Any = None, size: int = 32, patch: int = 4, download: bool = False,
                n_train: int | None = None, n_test: int | None = None) -> TaskData:  # fmt: skip
    """Build ``mnist`` from the four IDX files in ``data_dir``.

    Parameters
    ----------
    data_dir : str or path-like or None
        Folder of the IDX files; None: ``~/.cache/reservoir/mnist`` (where download puts them).
    size : int
        32: zero-pad to 32x32 (paper; 64 tokens at patch 4); 28: native (official code; 49 tokens).
    patch : int
        Patch side; must divide ``size``.
    download : bool
        Fetch missing files from the PyTorch MNIST mirror first.
    n_train, n_test : int or None
        Keep the first n rows of each split (file order); None keeps all (60000 / 10000).

    Returns
    -------
    TaskData
        inputs float32 ``(N, (size/patch)**2, patch**2)`` in [0, 1], labels int64
        ``(N,)``; ``params`` leaves out ``data_dir`` and ``download``.
    """
    return _build_idx_task("mnist", data_dir, size, patch, download, n_train, n_test)


def build_fashion_mnist(data_dir: Any = FASHION_MNIST_DIR, size: int = 32, patch: int = 4, download: bool = False,
                        n_train: int | None = None, n_test: int | None = None) -> TaskData:  # fmt: skip
    """Build ``fashion-mnist``: as :func:`build_mnist`, default folder ``/usr/share/datasets/fashion-mnist``.

    With ``download=True`` and that system folder lacking the files, they are
    fetched into ``~/.cache/reservoir/fashion-mnist`` instead.
    """
    return _build_idx_task("fashion-mnist", data_dir, size, patch, download, n_train, n_test, FASHION_MNIST_DIR)


def build_digits(test_fraction: float = 0.2, seed: int = 0, patch: int = 2) -> TaskData:
    """Build ``digits``: scikit-learn's 8x8 digits /16, ``patch x patch`` tokens (patch divides 8).

    The split is ``train_test_split(..., test_size=test_fraction, stratify=y,
    random_state=seed)``: 1437 train / 360 test, ``(N, 16, 4)`` at the defaults.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    name = "digits"
    test_fraction, seed, patch = check_digits({"test_fraction": test_fraction, "seed": seed, "patch": patch})
    data = load_digits()
    images = (data.images / 16).astype(np.float32)  # (1797, 8, 8) in [0, 1]
    labels = data.target.astype(np.int64)  # (1797,)
    tokens = patchify(images, patch)  # (1797, T, p*p)
    idx_train, idx_test = train_test_split(np.arange(len(labels)), test_size=float(test_fraction),
                                           stratify=labels, random_state=seed)  # fmt: skip
    splits = {"train": _split(tokens[idx_train], labels[idx_train]), "test": _split(tokens[idx_test], labels[idx_test])}
    params = {"test_fraction": float(test_fraction), "seed": seed, "patch": patch}
    return TaskData(name=name, params=params, kind="continuous", d_in=patch * patch, n_classes=10, splits=splits)


#: scikit-learn's 8x8 digits: images and classes.
DIGITS_ROWS, DIGITS_CLASSES = 1797, 10


def check_digits(p: Mapping[str, Any]) -> tuple[float, int, int]:
    """The ``digits`` parameters checked (one line naming the first bad one): test fraction, seed, patch."""
    name = "digits"
    seed = check_seed(p["seed"], f"task {name!r}: seed")  # scikit-learn's random_state takes 0..2**32-1
    patch = int_param(name, "patch", p["patch"], 1)
    test_fraction = p["test_fraction"]
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, Real) or not 0 < test_fraction < 1:
        raise ReservoirError(f"task {name!r}: test_fraction must be a number in (0, 1); found {test_fraction!r}")
    if 8 % patch:
        raise ReservoirError(f"task {name!r}: patch must divide 8; found patch={patch}")
    n_test = math.ceil(float(test_fraction) * DIGITS_ROWS)  # as train_test_split rounds it
    if min(n_test, DIGITS_ROWS - n_test) < DIGITS_CLASSES:  # a stratified split needs each class on both sides
        raise ReservoirError(f"task {name!r}: test_fraction must leave at least {DIGITS_CLASSES} of the "
                             f"{DIGITS_ROWS} images (one per class) in each split; found {test_fraction!r}: "
                             f"{DIGITS_ROWS - n_test} train, {n_test} test")
    return float(test_fraction), seed, patch


def build_cifar10(data_dir: Any = None, *, download: bool = False, n_train: int | None = None,
                  n_test: int | None = None, patch: int = 4) -> TaskData:  # fmt: skip
    """Build ``cifar10``: colour 32x32, per-channel normalised, ``patch x patch x 3`` tokens.

    Parameters
    ----------
    data_dir : str or path-like or None
        Folder holding ``cifar-10-batches-py/`` (or the batches); None:
        ``~/.cache/reservoir/cifar10``. The batches are pickles, which can run
        code: read only trusted files (:func:`~reservoir.tasks.files.load_pickle` refuses all but data).
    download : bool
        Fetch and extract ``cifar-10-python.tar.gz`` (Toronto) when missing.
    n_train, n_test : int or None
        Keep the first n rows (train: batches 1..5 in order); None keeps all.
    patch : int
        Patch side; must divide 32.

    Returns
    -------
    TaskData
        inputs float32 ``(N, (32/patch)**2, 3*patch**2)``, values ``patch[y, x, c]``; 64 x 48 at patch 4.
    """
    name = "cifar10"
    patch, n_train, n_test = check_cifar10({"patch": patch, "n_train": n_train, "n_test": n_test,
                                            "download": download})
    raw = read_cifar10(name, data_dir, download, n_train, n_test)
    mean, std = np.array(CIFAR_MEAN, np.float32), np.array(CIFAR_STD, np.float32)
    splits = {}
    for split, (data, labels) in raw.items():
        images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, 32, 32, 3) view, channel last
        tokens = np.divide(patchify(images, patch), np.float32(255), dtype=np.float32)  # (N, T, p*p*3) in [0, 1]
        pixels = tokens.reshape(len(tokens), -1, 3)  # (N, T*p*p, 3) view
        pixels -= mean
        pixels /= std
        splits[split] = _split(tokens, labels)
    params = {"patch": patch, "n_train": n_train, "n_test": n_test}
    return TaskData(name=name, params=params, kind="continuous", d_in=3 * patch * patch, n_classes=10, splits=splits)


def check_cifar10(p: Mapping[str, Any]) -> tuple[int, int | None, int | None]:
    """The ``cifar10`` parameters checked (one line naming the first bad one): patch and counts."""
    name = "cifar10"
    patch = int_param(name, "patch", p["patch"], 1)
    if 32 % patch:
        raise ReservoirError(f"task {name!r}: patch must divide 32; found patch={patch}")
    bool_param(name, "download", p["download"])
    return (patch, *_counts(name, p["n_train"], p["n_test"]))


def check_cifar10_lra(p: Mapping[str, Any]) -> None:
    """The ``cifar10-lra`` parameters checked, without reading a file."""
    _counts("cifar10-lra", p["n_train"], p["n_test"])
    bool_param("cifar10-lra", "download", p["download"])


def build_cifar10_lra(data_dir: Any = None, download: bool = False,
                      n_train: int | None = None, n_test: int | None = None) -> TaskData:  # fmt: skip
    """Build ``cifar10-lra``: grayscale in [-1, 1], one pixel per token, row-major.

    Parameters are those of :func:`build_cifar10` but ``patch``.

    Returns
    -------
    TaskData
        inputs float32 ``(N, 1024, 1)``: ``2 (0.2989 R + 0.5870 G + 0.1140 B) / 255 - 1``.
    """
    name = "cifar10-lra"
    n_train, n_test = _counts(name, n_train, n_test)
    raw = read_cifar10(name, data_dir, download, n_train, n_test)
    w = [np.float32(v) for v in GRAY_WEIGHTS]
    splits = {}
    for split, (data, labels) in raw.items():
        gray = data[:, :1024].astype(np.float32) * w[0]  # (N, 1024) R, row-major pixels
        gray += data[:, 1024:2048] * w[1]  # G
        gray += data[:, 2048:] * w[2]  # B
        gray /= np.float32(255)
        gray *= 2
        gray -= 1  # [-1, 1]
        splits[split] = _split(gray[:, :, None], labels)  # (N, 1024, 1)
    params = {"n_train": n_train, "n_test": n_test}
    return TaskData(name=name, params=params, kind="continuous", d_in=1, n_classes=10, splits=splits)


_IDX_FACTS = {"tokens": "(size/patch)**2 (64; 49 at size 28)", "d_in": "patch**2 (16)", "classes": "10"}
for _spec in (
    TaskSpec(name="mnist", build=build_mnist, check=check_mnist,
             summary="MNIST digits zero-padded to 32x32, 4x4 patches: 64 tokens x 16",
             source="IDX files (data_dir, or download=true: PyTorch mirror)", **_IDX_FACTS),
    TaskSpec(name="fashion-mnist", build=build_fashion_mnist, check=check_fashion_mnist,
             summary="Fashion-MNIST zero-padded to 32x32, 4x4 patches: 64 tokens x 16",
             source=f"IDX files ({FASHION_MNIST_DIR}, data_dir, or download=true)", **_IDX_FACTS),
    TaskSpec(name="digits", build=build_digits, check=check_digits,
             summary="scikit-learn 8x8 digits, 2x2 patches: 16 tokens x 4",
             source="bundled with scikit-learn (seeded stratified split)",
             tokens="(8/patch)**2 (16)", d_in="patch**2 (4)", classes="10"),
    TaskSpec(name="cifar10", build=build_cifar10, check=check_cifar10,
             summary="CIFAR-10 colour, normalised per channel, 4x4x3 patches: 64 tokens x 48",
             source="CIFAR-10 python batches (data_dir, or download=true: Toronto)",
             tokens="(32/patch)**2 (64)", d_in="3*patch**2 (48)", classes="10"),
    TaskSpec(name="cifar10-lra", build=build_cifar10_lra, check=check_cifar10_lra,
             summary="CIFAR-10 grayscale in [-1, 1], one pixel per token: 1024 tokens x 1",
             source="CIFAR-10 python batches (data_dir, or download=true: Toronto)",
             tokens="1024", d_in="1", classes="10"),
):  # fmt: skip
    register(_spec)
