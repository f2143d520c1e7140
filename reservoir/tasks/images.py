"""Image tasks: images cut into patches, one patch per token (continuous, 10 classes, train/test).

``mnist``, ``fashion-mnist``: IDX files (plain or ``.gz``; plain wins), /255
    into [0, 1]; ``size=32`` zero-pads 28x28 by 2 pixels a side (the paper:
    64 x 16 at patch 4), ``size=28`` is native (the official code: 49 x 16).
``digits``: scikit-learn's 8x8 digits, /16, 2x2 patches (16 x 4), seeded stratified split.
``cifar10``: the python batches, /255 then ``(x - mean_c) / std_c`` per
    channel, 4x4x3 patches (64 x 48, the official code's width).
``cifar10-lra``: grayscale ``0.2989 R + 0.5870 G + 0.1140 B`` (TF/LRA
    weights, on 0..255, /255, not rounded to integers as LRA's uint8 is) then
    ``2 x - 1`` into [-1, 1] (the official code's ``Normalize(0.5, 0.5)``), one
    pixel per token (1024 x 1).

Patch order (:func:`patchify`): token ``t`` is the patch at patch-row
``t // (W/p)``, patch-column ``t % (W/p)`` (top-left first, then along the
row), values ``patch[y, x, c]`` flattened row-major, channel last. No
augmentation (the official code crops/flips/rotates CIFAR): features are
extracted once. ``download=True`` fetches missing files with urllib into
``data_dir`` (default ``~/.cache/reservoir/<task>``).
"""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import tarfile
import tempfile
import zlib
from numbers import Integral, Real
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.runtime import check_seed
from reservoir.tasks.base import Split, TaskData, TaskSpec, register
from reservoir.tasks.files import download_file, load_pickle, one_line

__all__ = ["MNIST_FILES", "CIFAR_MEAN", "CIFAR_STD", "GRAY_WEIGHTS", "read_idx", "read_mnist", "patchify",
           "read_cifar_batch", "read_cifar10", "build_mnist", "build_fashion_mnist",
           "build_digits", "build_cifar10", "build_cifar10_lra"]  # fmt: skip

IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dims (N, H, W)
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dim (N,)
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}  # fmt: skip
MNIST_URLS = {"mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
              "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"}  # fmt: skip
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # Debian package dataset-fashion-mnist
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = ("test_batch",)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)  # R, G, B (tf.image.rgb_to_grayscale)


def _int_param(task: str, name: str, value: Any, lo: int, none_ok: bool = False) -> int | None:
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < lo:
        what = f"an integer >= {lo}" + (" or None" if none_ok else "")
        raise ReservoirError(f"task {task!r}: {name} must be {what}; found {value!r}")
    return int(value)


# ------------------------------------------------------------------ patches


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


# --------------------------------------------------------------- download


def _resolve_dir(task: str, data_dir: Any, download: bool, default: str | None, complete) -> str:
    """The folder to read: ``data_dir``, else the default, else ``~/.cache/reservoir/<task>``."""
    cache = os.path.join(os.path.expanduser("~"), ".cache", "reservoir", task)
    if data_dir is not None:
        folder = os.fspath(data_dir)
        if download and folder == default and not complete(folder):
            return cache  # a system folder without the files: download into the cache instead
        return folder
    return default if default is not None and (complete(default) or not download) else cache


# -------------------------------------------------------------------- IDX


def read_idx(path: str, magic: int) -> np.ndarray:
    """Read one IDX file of unsigned bytes (plain, or gzip when the name ends in ``.gz``).

    Parameters
    ----------
    path : str
        The file.
    magic : int
        Expected magic number: ``0x00000803`` images ``(N, H, W)``,
        ``0x00000801`` labels ``(N,)``; its last byte is the number of dims.

    Returns
    -------
    np.ndarray
        uint8 with the header's dims (big-endian uint32 each), read-only.
        A missing, truncated or corrupted file, another magic number or a size
        that does not match the header raises ReservoirError (one line).
    """
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ReservoirError(f"IDX file {path}: expected it to exist; found no such file") from None
    except (OSError, EOFError, zlib.error) as err:
        kind = "gzip-compressed IDX data" if path.endswith(".gz") else "a readable IDX file"
        raise ReservoirError(f"IDX file {path}: expected {kind}; found a corrupted file ({one_line(err)})") from None
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    found = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else None
    if found is not None and found != magic:
        raise ReservoirError(f"IDX file {path}: expected magic number 0x{magic:08X} (unsigned bytes, {ndim} dims); "
                             f"found 0x{found:08X}")  # fmt: skip
    if len(raw) < header:
        raise ReservoirError(f"IDX file {path}: expected a header of {header} bytes; found a {len(raw)}-byte file")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    size = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != size:
        state = "truncated" if len(raw) < size else "trailing bytes"
        raise ReservoirError(f"IDX file {path}: expected {size} bytes for dims {'x'.join(map(str, dims))}; "
                             f"found {len(raw)} ({state})")  # fmt: skip
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _idx_path(folder: str, name: str) -> str | None:
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    return None


def read_mnist(folder: str, split: str, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read one MNIST-format split (``"train"`` or ``"test"``) from ``folder``.

    Returns images uint8 ``(N, H, W)`` and labels int64 ``(N,)`` in 0..9, the
    first ``n`` rows when ``n`` is given. Raises ReservoirError (one line) when
    a file is missing or malformed or the two files disagree.
    """
    paths = []
    for name in MNIST_FILES[split]:
        path = _idx_path(folder, name)
        if path is None:
            raise ReservoirError(f"expected {name} or {name}.gz in {folder}; found neither")
        paths.append(path)
    images = read_idx(paths[0], IDX_IMAGES_MAGIC)  # (N, H, W)
    labels = read_idx(paths[1], IDX_LABELS_MAGIC)  # (N,)
    if not images.size:
        n, h, w = images.shape
        raise ReservoirError(f"IDX file {paths[0]}: expected at least one image of at least 1x1 pixels; "
                             f"found a header giving {n} images of {h}x{w}")  # fmt: skip
    if len(images) != len(labels):
        raise ReservoirError(f"IDX files {paths[0]} and {paths[1]}: expected as many labels as images; "
                             f"found {len(labels)} labels for {len(images)} images")  # fmt: skip
    if len(labels) and labels.max() > 9:
        raise ReservoirError(f"IDX file {paths[1]}: expected labels in 0..9; found {labels.max()}")
    if n is not None and n > len(labels):
        raise ReservoirError(f"IDX file {paths[0]}: expected at least n_{split}={n} images; found {len(labels)}")
    return images[:n], labels[:n].astype(np.int64)


def _build_idx_task(name: str, data_dir: Any, size: Any, patch: Any, download: bool, n_train: Any, n_test: Any,
                    default: str | None = None) -> TaskData:  # fmt: skip
    size = _int_param(name, "size", size, 1)
    patch = _int_param(name, "patch", patch, 1)
    n_train = _int_param(name, "n_train", n_train, 1, none_ok=True)
    n_test = _int_param(name, "n_test", n_test, 1, none_ok=True)
    if size % patch:
        raise ReservoirError(f"task {name!r}: patch must divide size={size}; found patch={patch}")
    gz_names = [f + ".gz" for files in MNIST_FILES.values() for f in files]

    def complete(folder: str) -> bool:
        return all(_idx_path(folder, f) for files in MNIST_FILES.values() for f in files)

    folder = _resolve_dir(name, data_dir, bool(download), default, complete)
    if download:
        for gz in gz_names:
            if _idx_path(folder, gz[:-3]) is None:
                download_file(MNIST_URLS[name] + gz, os.path.join(folder, gz), ", ".join(gz_names))
    elif not complete(folder):
        where = f"not all in {folder}" if data_dir is not None or default else f"data_dir=None and none in {folder}"
        raise ReservoirError(f"task {name!r}: expected the files {', '.join(gz_names)} (or unzipped) in data_dir; "
                             f"found {where}; place them there, or pass download=True (-p download=true)")  # fmt: skip
    splits = {}
    for split, n in (("train", n_train), ("test", n_test)):
        try:
            images, labels = read_mnist(folder, split, n)  # uint8 (N, H, W), int64 (N,)
        except ReservoirError as err:
            raise ReservoirError(f"task {name!r}: {err}") from None
        pad = size - images.shape[1]
        if pad < 0 or pad % 2 or images.shape[1] != images.shape[2]:
            raise ReservoirError(f"task {name!r}: expected size >= the image side {images.shape[1]}, larger by an "
                                 f"even number; found size={size}")  # fmt: skip
        if pad:
            images = np.pad(images, ((0, 0), (pad // 2, pad // 2), (pad // 2, pad // 2)))  # (N, size, size)
        tokens = np.divide(patchify(images, patch), np.float32(255), dtype=np.float32)  # (N, T, p*p) in [0, 1]
        splits[split] = _split(tokens, labels)
    params = {"size": size, "patch": patch, "n_train": n_train, "n_test": n_test}
    return TaskData(name=name, params=params, kind="continuous", d_in=patch * patch, n_classes=10, splits=splits)


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
    seed = check_seed(seed, f"task {name!r}: seed")  # scikit-learn's random_state takes 0..2**32-1
    patch = _int_param(name, "patch", patch, 1)
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, Real) or not 0 < test_fraction < 1:
        raise ReservoirError(f"task {name!r}: test_fraction must be a number in (0, 1); found {test_fraction!r}")
    if 8 % patch:
        raise ReservoirError(f"task {name!r}: patch must divide 8; found patch={patch}")
    data = load_digits()
    images = (data.images / 16).astype(np.float32)  # (1797, 8, 8) in [0, 1]
    labels = data.target.astype(np.int64)  # (1797,)
    tokens = patchify(images, patch)  # (1797, T, p*p)
    idx_train, idx_test = train_test_split(np.arange(len(labels)), test_size=float(test_fraction),
                                           stratify=labels, random_state=seed)  # fmt: skip
    splits = {"train": _split(tokens[idx_train], labels[idx_train]), "test": _split(tokens[idx_test], labels[idx_test])}
    params = {"test_fraction": float(test_fraction), "seed": seed, "patch": patch}
    return TaskData(name=name, params=params, kind="continuous", d_in=patch * patch, n_classes=10, splits=splits)


# --------------------------------------------------------------- CIFAR-10


def read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch: a pickled dict with ``b"data"`` and ``b"labels"``.

    Only trusted files should be read (pickles can run code; :func:`load_pickle`
    refuses anything but plain data and numpy arrays).

    Returns
    -------
    data : np.ndarray
        uint8 ``(n, 3072)``, channel-major per row: R (32x32 row-major), G, B.
    labels : np.ndarray
        int64 ``(n,)`` in 0..9.
    """
    try:
        with open(path, "rb") as f:
            obj = load_pickle(f, encoding="bytes")
    except FileNotFoundError:
        raise ReservoirError(f"CIFAR-10 file {path}: expected it to exist; found no such file") from None
    except Exception as err:  # unpickling raises many types on bad bytes
        raise ReservoirError(f"CIFAR-10 file {path}: expected a pickled batch dict; found unreadable data "
                             f"({type(err).__name__}: {one_line(err)})") from None  # fmt: skip
    if not isinstance(obj, dict):
        raise ReservoirError(f"CIFAR-10 file {path}: expected a pickled dict; found {type(obj).__name__}")
    data = obj.get(b"data", obj.get("data"))
    labels = obj.get(b"labels", obj.get("labels"))
    if data is None or labels is None:
        found = ", ".join(repr(k) for k in list(obj)[:6])
        raise ReservoirError(f"CIFAR-10 file {path}: expected keys b'data' and b'labels'; found {found or 'none'}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ReservoirError(f"CIFAR-10 file {path}: expected b'data' uint8 (n, 3072); found {found}")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        labels = np.zeros((0, 0))  # reported below
    if labels.shape != (len(data),):
        raise ReservoirError(f"CIFAR-10 file {path}: expected {len(data)} integer labels (one per row of b'data'); "
                             f"found {labels.size} values of shape {labels.shape}")  # fmt: skip
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise ReservoirError(f"CIFAR-10 file {path}: expected labels in 0..9; found {labels.min()}..{labels.max()}")
    return data, labels


def _cifar_folder(folder: str) -> str | None:
    for candidate in (os.path.join(folder, CIFAR_FOLDER), folder):
        if all(os.path.isfile(os.path.join(candidate, f)) for f in CIFAR_TRAIN + CIFAR_TEST):
            return candidate
    return None


def _extract_cifar(archive: str, folder: str) -> None:
    """Extract ``cifar-10-batches-py/`` from the tarball into ``folder``, refusing unsafe members."""
    tmp = tempfile.mkdtemp(prefix=".cifar-10-extract-", dir=folder)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                parts = m.name.replace("\\", "/").split("/")
                unsafe = m.name.startswith(("/", "\\")) or os.path.isabs(m.name) or ".." in parts
                if unsafe or not (m.isfile() or m.isdir()):
                    raise ReservoirError(f"CIFAR-10 archive {archive}: expected regular files under relative paths; "
                                         f"found member {m.name!r}; refusing to extract")  # fmt: skip
            tar.extractall(tmp, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        src = os.path.join(tmp, CIFAR_FOLDER)
        if not os.path.isdir(src):
            raise ReservoirError(f"CIFAR-10 archive {archive}: expected a folder {CIFAR_FOLDER}/ inside; found none")
        os.replace(src, os.path.join(folder, CIFAR_FOLDER))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise ReservoirError(f"CIFAR-10 archive {archive}: expected a complete tar.gz to extract into {folder}; "
                             f"found an error ({one_line(err)})") from None  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_cifar10(name: str, data_dir: Any, download: bool, n_train: Any, n_test: Any) -> dict[str, tuple]:
    """Locate (or download) and read the CIFAR-10 batches for task ``name``.

    Returns ``{"train": (data, labels), "test": (data, labels)}``: data uint8
    ``(N, 3072)``, labels int64 ``(N,)``, the first ``n_train`` / ``n_test``
    rows (train rows in batch order 1..5) when given.
    """
    n_train = _int_param(name, "n_train", n_train, 1, none_ok=True)
    n_test = _int_param(name, "n_test", n_test, 1, none_ok=True)
    folder = _resolve_dir(name, data_dir, bool(download), None, lambda d: _cifar_folder(d) is not None)
    batches = _cifar_folder(folder)
    names = ", ".join(CIFAR_TRAIN + CIFAR_TEST)
    if batches is None and download:
        if os.path.isdir(os.path.join(folder, CIFAR_FOLDER)):
            raise ReservoirError(f"task {name!r}: expected all of {names} in {os.path.join(folder, CIFAR_FOLDER)}; "
                                 "found an incomplete folder; remove it to download again")  # fmt: skip
        archive = os.path.join(folder, os.path.basename(CIFAR_URL))
        download_file(CIFAR_URL, archive, f"{names} (from {os.path.basename(CIFAR_URL)})")
        try:
            _extract_cifar(archive, folder)
        finally:
            os.unlink(archive)
        batches = _cifar_folder(folder)
    if batches is None:
        where = f"data_dir=None and none in {folder}" if data_dir is None else f"not all of them in {folder}"
        raise ReservoirError(f"task {name!r}: expected the CIFAR-10 python batches {names} in data_dir/{CIFAR_FOLDER} "
                             f"or data_dir; found {where}; place them there, or pass download=True "
                             "(-p download=true)")  # fmt: skip
    out = {}
    for split, files, n in (("train", CIFAR_TRAIN, n_train), ("test", CIFAR_TEST, n_test)):
        parts, have = [], 0
        for f in files:
            if n is not None and have >= n:
                break
            data, labels = read_cifar_batch(os.path.join(batches, f))  # (n_i, 3072), (n_i,)
            parts.append((data, labels))
            have += len(labels)
        if n is not None and have < n:
            raise ReservoirError(f"task {name!r}: expected at least n_{split}={n} images in {batches}; found {have}")
        data = np.concatenate([p[0] for p in parts])[:n]  # (N, 3072)
        if not len(data):
            raise ReservoirError(f"task {name!r}: expected at least one {split} image in {', '.join(files)} in "
                                 f"{batches}; found none")  # fmt: skip
        out[split] = (data, np.concatenate([p[1] for p in parts])[:n])
    return out


def build_cifar10(data_dir: Any = None, patch: int = 4, download: bool = False,
                  n_train: int | None = None, n_test: int | None = None) -> TaskData:  # fmt: skip
    """Build ``cifar10``: colour 32x32, per-channel normalised, ``patch x patch x 3`` tokens.

    Parameters
    ----------
    data_dir : str or path-like or None
        Folder holding ``cifar-10-batches-py/`` (or the batches); None:
        ``~/.cache/reservoir/cifar10``. The batches are pickles, which can run
        code: read only trusted files (:func:`load_pickle` refuses all but data).
    patch : int
        Patch side; must divide 32.
    download : bool
        Fetch and extract ``cifar-10-python.tar.gz`` (Toronto) when missing.
    n_train, n_test : int or None
        Keep the first n rows (train: batches 1..5 in order); None keeps all.

    Returns
    -------
    TaskData
        inputs float32 ``(N, (32/patch)**2, 3*patch**2)``, values ``patch[y, x, c]``; 64 x 48 at patch 4.
    """
    name = "cifar10"
    patch = _int_param(name, "patch", patch, 1)
    if 32 % patch:
        raise ReservoirError(f"task {name!r}: patch must divide 32; found patch={patch}")
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


_IDX_DEFAULTS = {"size": 32, "patch": 4, "download": False, "n_train": None, "n_test": None}
_CIFAR_DEFAULTS = {"data_dir": None, "download": False, "n_train": None, "n_test": None}
_IDX_FACTS = {"tokens": "(size/patch)**2 (64; 49 at size 28)", "d_in": "patch**2 (16)", "classes": "10"}
for _spec in (
    TaskSpec(name="mnist", build=build_mnist, defaults={"data_dir": None, **_IDX_DEFAULTS},
             summary="MNIST digits zero-padded to 32x32, 4x4 patches: 64 tokens x 16",
             source="IDX files (data_dir, or download=true: PyTorch mirror)", **_IDX_FACTS),
    TaskSpec(name="fashion-mnist", build=build_fashion_mnist, defaults={"data_dir": FASHION_MNIST_DIR, **_IDX_DEFAULTS},
             summary="Fashion-MNIST zero-padded to 32x32, 4x4 patches: 64 tokens x 16",
             source=f"IDX files ({FASHION_MNIST_DIR}, data_dir, or download=true)", **_IDX_FACTS),
    TaskSpec(name="digits", build=build_digits, defaults={"test_fraction": 0.2, "seed": 0, "patch": 2},
             summary="scikit-learn 8x8 digits, 2x2 patches: 16 tokens x 4",
             source="bundled with scikit-learn (seeded stratified split)",
             tokens="(8/patch)**2 (16)", d_in="patch**2 (4)", classes="10"),
    TaskSpec(name="cifar10", build=build_cifar10, defaults={**_CIFAR_DEFAULTS, "patch": 4},
             summary="CIFAR-10 colour, normalised per channel, 4x4x3 patches: 64 tokens x 48",
             source="CIFAR-10 python batches (data_dir, or download=true: Toronto)",
             tokens="(32/patch)**2 (64)", d_in="3*patch**2 (48)", classes="10"),
    TaskSpec(name="cifar10-lra", build=build_cifar10_lra, defaults=dict(_CIFAR_DEFAULTS),
             summary="CIFAR-10 grayscale in [-1, 1], one pixel per token: 1024 tokens x 1",
             source="CIFAR-10 python batches (data_dir, or download=true: Toronto)",
             tokens="1024", d_in="1", classes="10"),
):  # fmt: skip
    register(_spec)
