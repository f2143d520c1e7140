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
from reservoir.io import check_local, one_line, publish

__all__ = ["data_folder", "download_file", "download_folder", "load_pickle"]


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


def download_folder(task: str) -> str:
    """Where a download puts task ``task``'s files: ``~/.cache/reservoir/<task>``."""
    return os.path.join(os.path.expanduser("~"), ".cache", "reservoir", task)


def data_folder(task: str, data_dir: Any, download: bool, default: str | None,
                complete: Callable[[str], bool]) -> str:
    """The folder a task reads its files from: ``data_dir``, else ``default``, else :func:`download_folder`.

    ``complete(folder)`` says whether a folder holds every file. A
    ``default`` (system) folder that lacks them gives way to the download
    folder when that one holds them (an earlier download put them there), or
    with ``download`` (the download writes there).
    """
    cache = download_folder(task)
    if data_dir is not None:
        check_local(data_dir, "a data folder (data_dir)")
        folder = os.fspath(data_dir)
        if folder != default:
            return folder
    elif default is None:
        return cache
    else:
        folder = default
    if complete(folder) or not (download or complete(cache)):
        return folder
    return cache


#: Bytes a pickle may have its constructors allocate beyond its own size (an array's data is in the pickle itself,
#: so a data file never needs more; a few bytes asking for gigabytes are refused).
PICKLE_SLACK = 1 << 20


class _ArrayType:
    """What ``numpy.ndarray`` unpickles as: the type :func:`numpy._core.multiarray._reconstruct` is given, never a
    constructor called with a shape (which would allocate before any check)."""

    def __new__(cls, *args, **kwargs):
        raise pickle.UnpicklingError("refusing to call numpy.ndarray (arrays unpickle through _reconstruct)")


def _multiarray() -> tuple[Any, Any]:
    try:
        from numpy._core import multiarray, numeric  # numpy >= 2
    except ImportError:  # pragma: no cover
        from numpy.core import multiarray, numeric
    return multiarray, numeric


class _DataUnpickler(pickle.Unpickler):
    """Unpickles only data: containers, strings, numbers and numpy arrays; no other callables, and no allocation
    a pickle's own bytes do not pay for (a running total against its size plus :data:`PICKLE_SLACK`)."""

    def __init__(self, f: BinaryIO, encoding: str, size: int):
        super().__init__(f, encoding=encoding)
        self.budget = size + PICKLE_SLACK
        multiarray, numeric = _multiarray()
        allowed: dict[str, Any] = {
            "numpy.ndarray": _ArrayType, "numpy.dtype": np.dtype, "_codecs.encode": self._encode,
            "builtins.set": set, "builtins.frozenset": frozenset, "builtins.complex": complex,
            "builtins.bytearray": self._bytearray,
        }
        for mod in ("numpy.core", "numpy._core"):
            allowed[f"{mod}.multiarray._reconstruct"] = self._reconstruct
            allowed[f"{mod}.multiarray.scalar"] = self._scalar
            if hasattr(numeric, "_frombuffer"):
                allowed[f"{mod}.numeric._frombuffer"] = numeric._frombuffer  # a view of bytes in the pickle
        allowed.update({k.replace("builtins.", "__builtin__."): v for k, v in allowed.items() if "builtins." in k})
        self.allowed, self._make = allowed, multiarray

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[f"{module}.{name}"]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only arrays and plain data)") from None

    def _spend(self, n_bytes: int, what: str) -> None:
        self.budget -= n_bytes
        if self.budget < 0:
            raise pickle.UnpicklingError(f"refusing {what}: more memory than the pickle's own bytes account for")

    def _reconstruct(self, subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        if subtype is not _ArrayType:
            raise pickle.UnpicklingError("refusing an array of a type other than numpy.ndarray")
        dims = [shape] if isinstance(shape, int) else list(shape)
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            raise pickle.UnpicklingError(f"refusing an array of shape {shape!r}")
        self._spend(int(np.prod(dims, dtype=object)) * np.dtype(dtype).itemsize, f"an array of shape {tuple(dims)}")
        return self._make._reconstruct(np.ndarray, shape, dtype)

    def _scalar(self, dtype: np.dtype, *obj: Any) -> Any:
        self._spend(np.dtype(dtype).itemsize, f"a scalar of {dtype}")
        return self._make.scalar(dtype, *obj)

    def _bytearray(self, *args: Any) -> bytearray:
        if args and isinstance(args[0], int):  # bytearray(n): n zero bytes (data pickles hold the bytes instead)
            self._spend(args[0], f"bytearray({args[0]})")
        return bytearray(*args)

    @staticmethod
    def _encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        # how Python 2 and numpy pickles carry bytes: text encoded as latin-1; no other codec is looked up
        if encoding.lower().replace("-", "").replace("_", "") not in ("latin1", "latin", "iso88591", "l1"):
            raise pickle.UnpicklingError(f"refusing _codecs.encode to {encoding!r} (only latin-1)")
        return codecs.encode(obj, "latin-1", errors)


def load_pickle(data: bytes | BinaryIO, encoding: str = "ASCII") -> Any:
    """Unpickle plain data (dicts, lists, strings, numbers, numpy arrays) and nothing else.

    ``pickle.load`` can run arbitrary code; this refuses every global but
    numpy's array reconstructors, so a tampered file fails instead of running,
    and refuses arrays (or byte arrays) larger than the pickle's own bytes
    account for, so a few bytes cannot ask for gigabytes. Still, read only
    files from a source you trust. ``encoding="bytes"`` reads Python 2
    pickles such as the CIFAR-10 batches.
    """
    if hasattr(data, "read"):
        f = data
        try:
            size = os.fstat(f.fileno()).st_size
        except (AttributeError, OSError, io.UnsupportedOperation):
            size = len(f.getbuffer()) if isinstance(f, io.BytesIO) else 0
    else:
        f, size = io.BytesIO(data), len(data)
    return _DataUnpickler(f, encoding=encoding, size=size).load()
