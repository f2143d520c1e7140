"""CIFAR-10's python batches: reading them (data only, never code), finding, downloading and extracting them.

The release ``cifar-10-python.tar.gz`` holds ``cifar-10-batches-py/`` with
``data_batch_1`` .. ``data_batch_5`` (train) and ``test_batch``: pickled dicts
with ``b"data"`` uint8 ``(10000, 3072)`` (channel-major rows: R, G, B planes
of 32x32, row-major) and ``b"labels"``.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zlib
from numbers import Integral
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.tasks.files import data_folder, download_file, load_pickle, one_line
from reservoir.tasks.params import bool_param

__all__ = ["CIFAR_FOLDER", "CIFAR_TEST", "CIFAR_TRAIN", "CIFAR_URL", "find_cifar10", "read_cifar10", "read_cifar_batch"]

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = ("test_batch",)


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
    checked = _labels(labels, len(data))
    if checked is None:
        raise ReservoirError(f"CIFAR-10 file {path}: expected {len(data)} integer labels (one per row of b'data'); "
                             f"found {_described(labels)}")
    if len(checked) and (checked.min() < 0 or checked.max() > 9):
        raise ReservoirError(f"CIFAR-10 file {path}: expected labels in 0..9; found {checked.min()}..{checked.max()}")
    return data, checked


def _labels(labels: Any, n: int) -> np.ndarray | None:
    """``n`` integer labels as int64, from the batches' flat list (each item checked before numpy walks it: a
    nested list of shared references is tiny in the pickle and huge once walked) or an integer array; else None."""
    if isinstance(labels, (list, tuple)):
        if len(labels) == n and all(isinstance(v, Integral) and not isinstance(v, bool) for v in labels):
            try:
                return np.asarray(labels, dtype=np.int64)
            except OverflowError:  # beyond int64: no CIFAR label
                return None
    elif isinstance(labels, np.ndarray) and labels.dtype.kind in "iu" and labels.shape == (n,):
        if labels.dtype != np.uint64 or not n or labels.max() <= np.iinfo(np.int64).max:
            return labels.astype(np.int64)
    return None


def _described(labels: Any) -> str:
    """What a batch's labels are, for a refusal."""
    if isinstance(labels, np.ndarray):
        return f"an array {labels.dtype} {labels.shape}"
    if isinstance(labels, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in labels[:1000]})
        return f"a list of {len(labels)} items ({', '.join(kinds) or 'none'})"
    return type(labels).__name__


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


def find_cifar10(name: str, data_dir: Any, download: bool) -> str:
    """The folder holding the batches for task ``name``: ``data_dir/cifar-10-batches-py`` or ``data_dir`` itself.

    With ``download`` and no batches there, the archive is fetched from
    :data:`CIFAR_URL` and extracted first. Missing batches are one line naming
    them and where they were looked for.
    """
    folder = data_folder(name, data_dir, bool(download), None, lambda d: _cifar_folder(d) is not None)
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
    return batches


def read_cifar10(name: str, data_dir: Any, download: bool, n_train: int | None, n_test: int | None
                 ) -> dict[str, tuple]:
    """Locate (or download, see :func:`find_cifar10`) and read the CIFAR-10 batches for task ``name``.

    Returns ``{"train": (data, labels), "test": (data, labels)}``: data uint8
    ``(N, 3072)``, labels int64 ``(N,)``, the first ``n_train`` / ``n_test``
    rows (train rows in batch order 1..5) when given (each ``None`` or an int >= 1).
    """
    batches = find_cifar10(name, data_dir, bool_param(name, "download", download))
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


