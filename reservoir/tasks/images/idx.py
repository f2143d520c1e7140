"""MNIST-format IDX files: reading them (plain or ``.gz``; plain wins), finding or downloading the four of a task.

An IDX file is a big-endian header (a magic number whose last byte is the
number of dims, then one uint32 per dim) and the unsigned bytes.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import check_memory, check_regular
from reservoir.tasks.files import data_folder, download_file, one_line

__all__ = ["IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "MNIST_FILES", "MNIST_URLS", "find_mnist", "read_idx", "read_mnist"]

IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dims (N, H, W)
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dim (N,)
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}  # fmt: skip
MNIST_URLS = {"mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/",
              "fashion-mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"}  # fmt: skip


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
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    kind = "gzip-compressed IDX data" if path.endswith(".gz") else "a readable IDX file"
    if not os.path.exists(path):
        raise ReservoirError(f"IDX file {path}: expected it to exist; found no such file")
    check_regular(path, kind)
    try:  # the header first: the data are read only as far as it says (a small .gz can inflate to gigabytes)
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            head = f.read(header)
            found = struct.unpack(">I", head[:4])[0] if len(head) >= 4 else None
            if found is not None and found != magic:
                raise ReservoirError(f"IDX file {path}: expected magic number 0x{magic:08X} (unsigned bytes, {ndim} "
                                     f"dims); found 0x{found:08X}")  # fmt: skip
            if len(head) < header:
                raise ReservoirError(f"IDX file {path}: expected a header of {header} bytes; found a "
                                     f"{len(head)}-byte file")
            dims = struct.unpack(f">{ndim}I", head[4:header])
            n_bytes = math.prod(dims)  # Python ints: no product wraps
            if not path.endswith(".gz"):  # a plain file's size says at once whether the data are all there
                _check_size(path, dims, header + n_bytes, os.fstat(f.fileno()).st_size)
            check_memory(path, n_bytes)
            data = f.read(n_bytes + 1)  # one byte more tells trailing bytes apart
    except (OSError, EOFError, zlib.error) as err:
        raise ReservoirError(f"IDX file {path}: expected {kind}; found a corrupted file ({one_line(err)})") from None
    if len(data) != n_bytes:
        _check_size(path, dims, header + n_bytes, header + len(data))
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def _check_size(path: str, dims: tuple[int, ...], expected: int, found: int) -> None:
    """Refuse (one line) an IDX file of another size than its header's dims make (``found`` past ``expected`` as far
    as it was read)."""
    if found != expected:
        state = f"found {found} (truncated)" if found < expected else "found trailing bytes"
        raise ReservoirError(f"IDX file {path}: expected {expected} bytes for dims {'x'.join(map(str, dims))}; "
                             f"{state}")


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



def find_mnist(name: str, data_dir: Any, download: bool, default: str | None = None) -> str:
    """The folder holding task ``name``'s four IDX files (fetched first from :data:`MNIST_URLS` with ``download``).

    ``data_dir`` and ``default`` are as for :func:`~reservoir.tasks.files.data_folder`;
    without ``download``, a folder lacking a file is one line naming the files
    and where they were looked for.
    """
    gz_names = [f + ".gz" for files in MNIST_FILES.values() for f in files]

    def complete(folder: str) -> bool:
        return all(_idx_path(folder, f) for files in MNIST_FILES.values() for f in files)

    folder = data_folder(name, data_dir, bool(download), default, complete)
    if download:
        for gz in gz_names:
            if _idx_path(folder, gz[:-3]) is None:
                download_file(MNIST_URLS[name] + gz, os.path.join(folder, gz), ", ".join(gz_names))
    elif not complete(folder):
        if data_dir is None and not default:
            where = f"data_dir=None and none in {folder}"
        else:
            where = f"not all in {folder}" if os.path.isdir(folder) else f"no folder {folder}"
        raise ReservoirError(f"task {name!r}: expected the files {', '.join(gz_names)} (or unzipped) in data_dir; "
                             f"found {where}; place them there, or pass download=True (--download, or -p "
                             "download=true)")
    return folder
