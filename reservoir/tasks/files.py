"""Reading data files safely: where they lie, downloads that never leave partial files, pickles that only hold
data.

Shared by the task modules that read files a researcher downloads (images,
remote homology). The low-level helpers every package shares (one-line
errors, JSON, atomic publishing) live in :mod:`reservoir.io`.
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import one_line, publish

__all__ = ["data_folder", "download_file", "load_pickle"]


def download_file(url: str, dest: str, names: str) -> None:
    """Fetch ``url`` into ``dest`` through a temporary file renamed only when complete.

    Any failure (no network, HTTP error, short read, unwritable folder) removes
    the partial file and raises ReservoirError: ``could not download <url>
    (<reason>); place the files <names> in <folder>``.
    """
    folder = os.path.dirname(os.path.abspath(dest))

    def fail(reason: Any) -> ReservoirError:
        return ReservoirError(f"could not download {url} ({one_line(reason)}); place the files {names} in {folder}")

    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", suffix=".part", dir=folder)
    except OSError as err:
        raise fail(err.strerror or err) from None
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            shutil.copyfileobj(resp, out, 1 << 20)
            expected = getattr(resp, "headers", {}).get("Content-Length")
            if expected is not None and out.tell() != int(expected):
                raise OSError(f"received {out.tell()} of {expected} bytes")
        publish(tmp, dest)
    except BaseException as err:  # KeyboardInterrupt too: never leave a partial file
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(err, urllib.error.HTTPError):
            raise fail(f"HTTP {err.code} {err.reason}") from None
        if isinstance(err, urllib.error.URLError):
            raise fail(err.reason) from None
        if isinstance(err, (OSError, ValueError, EOFError)) or type(err).__module__ == "http.client":
            raise fail(err) from None
        raise


def data_folder(task: str, data_dir: Any, download: bool, default: str | None,
                complete: Callable[[str], bool]) -> str:
    """The folder a task reads its files from: ``data_dir``, else ``default``, else ``~/.cache/reservoir/<task>``.

    ``complete(folder)`` says whether a folder holds every file. With
    ``download``, a ``default`` (system) folder that lacks them gives way to
    the cache folder, where the download can write.
    """
    cache = os.path.join(os.path.expanduser("~"), ".cache", "reservoir", task)
    if data_dir is not None:
        folder = os.fspath(data_dir)
        if download and folder == default and not complete(folder):
            return cache  # a system folder without the files: download into the cache instead
        return folder
    return default if default is not None and (complete(default) or not download) else cache


def _numpy_globals() -> dict[tuple[str, str], Any]:
    try:
        from numpy._core import multiarray, numeric  # numpy >= 2
    except ImportError:  # pragma: no cover
        from numpy.core import multiarray, numeric
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): codecs.encode}
    for mod in ("numpy.core", "numpy._core"):
        allowed[(f"{mod}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{mod}.multiarray", "scalar")] = multiarray.scalar
        if hasattr(numeric, "_frombuffer"):
            allowed[(f"{mod}.numeric", "_frombuffer")] = numeric._frombuffer
    for mod in ("builtins", "__builtin__"):
        allowed.update({(mod, t.__name__): t for t in (set, frozenset, bytearray, complex)})
    return allowed


class _DataUnpickler(pickle.Unpickler):
    """Unpickles only data: containers, strings, numbers and numpy arrays; no other callables."""

    allowed = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only arrays and plain data)") from None


def load_pickle(data: bytes | BinaryIO, encoding: str = "ASCII") -> Any:
    """Unpickle plain data (dicts, lists, strings, numbers, numpy arrays) and nothing else.

    ``pickle.load`` can run arbitrary code; this refuses every global but
    numpy's array reconstructors, so a tampered file fails instead of running.
    Still, read only files from a source you trust. ``encoding="bytes"``
    reads Python 2 pickles such as the CIFAR-10 batches.
    """
    f = data if hasattr(data, "read") else io.BytesIO(data)
    return _DataUnpickler(f, encoding=encoding).load()
