"""Store files: building a new store whole, chunk sizes, removing stores and half-built leftovers.

A new store on disk is built by :func:`build` under a temporary name beside
its path; :meth:`~reservoir.store.WritableStore.create` renames it into place
once whole. On object storage there is no rename: :func:`build` writes the
store in place with its attributes last, so it is a store of ours only once
whole (:mod:`reservoir.store.remote`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import __version__
from reservoir.errors import ReservoirError
from reservoir.io import cause, check_name
from reservoir.store import layout as lay
from reservoir.store.backends import BACKENDS, Backend
from reservoir.store.formats import Format
from reservoir.store.remote import StoreURL, is_url

#: Smallest chunk (bytes of one row array's block); a split smaller than that is one chunk.
MIN_CHUNK_BYTES = 1 << 20
#: Largest chunk a split is cut into for its size alone.
MAX_CHUNK_BYTES = 8 << 20
#: Chunks a split is cut into between those bounds: enough to share among the ranks of a job.
CHUNKS_PER_SPLIT = 64


def rows_per_chunk(row_bytes: int, n_rows: int) -> int:
    """Rows per chunk: the split's bytes over :data:`CHUNKS_PER_SPLIT`, within :data:`MIN_CHUNK_BYTES` and
    :data:`MAX_CHUNK_BYTES`.

    Every chunk costs one object per row array (rows, labels, lengths,
    checksums, done flag) and its share of the backend's per-call work, so a
    large split writes faster in larger chunks.

    Examples
    --------
    >>> rows_per_chunk(20_000, 20_000)  # 400 MB: 64 chunks of 6.25 MB
    313
    """
    target = min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, n_rows * row_bytes // CHUNKS_PER_SPLIT))
    return max(1, min(max(n_rows, 1), math.ceil(target / max(row_bytes, 1))))


def build(tmp: Path | StoreURL, fmt: Format, attrs: dict[str, Any], splits, feature_shape, projection_weight,
           final_norm, states_length) -> None:
    """Write a new store's whole layout at ``tmp`` (removed again if anything fails); its attributes last."""
    dtype = np.dtype(attrs["dtype"])
    kinds = lay.poolings(attrs)
    row_bytes = (len(kinds) * int(np.prod(feature_shape)) + (states_length or 0) * feature_shape[-1]) * dtype.itemsize
    chunk_rows = {s: rows_per_chunk(row_bytes, n) for s, (n, _) in splits.items()}
    layout = lay.layout(attrs, splits, feature_shape, chunk_rows, states_length, projection_weight.shape[0],
                           final_norm is not None)
    try:
        backend = BACKENDS[fmt](tmp, "w")
    except Exception as err:  # noqa: BLE001 - the library's error for an unwritable place
        remove(tmp, ignore_errors=True)
        raise ReservoirError(f"{_folder(tmp)}: expected a writable output folder, found: {cause(err)}") from None
    try:
        fixed = {"projection/weight": projection_weight,
                 **{f"final_norm/{k}": v for k, v in (final_norm or {}).items()}}
        full = json.loads(json.dumps({
            **attrs,
            "reservoir_version": __version__,
            "complete": False,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "splits": list(splits),
            "chunk_rows": chunk_rows,
            "arrays": layout,
            "checksums": {"algorithm": lay.ALGORITHM, "arrays": lay.row_arrays(states_length is not None, kinds),
                          "fixed": {k: lay.crc(np.asarray(v, np.float32), k) for k, v in fixed.items()}},
        }))  # as the attributes read back
        for name, spec in layout.items():
            create_array(backend, name, spec, chunk_rows)
        for name, arr in fixed.items():
            backend.array(name)[...] = arr
        backend.write_attrs({**full, "attrs_crc32c": lay.attrs_crc(full)}, replace=True)  # last: whole now
        backend.flush()
    except BaseException as err:
        close_quietly(backend)
        remove(tmp, ignore_errors=True)
        if isinstance(err, Exception) and not isinstance(err, ReservoirError):
            raise ReservoirError(f"{_folder(tmp)}: could not create the store ({cause(err)})") from err
        raise
    try:
        backend.close()
    except Exception as err:  # noqa: BLE001 - e.g. HDF5 flushing onto a full disk
        remove(tmp, ignore_errors=True)
        raise ReservoirError(f"{_folder(tmp)}: could not create the store ({cause(err)})") from err


def create_array(backend: Backend, name: str, spec: dict[str, Any], chunk_rows: dict[str, int]) -> None:
    """Create the layout's array ``name`` (``spec``: its shape and dtype), chunked as a store chunks it: a split's
    rows by its ``chunk_rows``, a done flag or a checksum row one a chunk, a fixed array whole."""
    shape = tuple(spec["shape"])
    rows = 1 if name.endswith(("/done", "/checksums")) else chunk_rows.get(name.split("/")[0], shape[0])
    backend.create(name, shape, spec["dtype"], rows)


def _folder(tmp: Path | StoreURL) -> Path | StoreURL:
    """Where a store was being built, as errors name it: the folder of a temporary on disk, a URL itself."""
    return tmp if isinstance(tmp, StoreURL) else tmp.parent


def close_quietly(backend: Backend) -> None:
    """Close a backend whose write already failed (the first error is the one reported)."""
    try:
        backend.close()
    except Exception:  # noqa: BLE001
        pass


def remove_temporaries(path: Path) -> None:
    """Remove half-built stores of killed runs beside ``path`` (called with its write lock held)."""
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        remove(tmp, ignore_errors=True)


def remove(path: str | os.PathLike | StoreURL, ignore_errors: bool = False) -> None:
    """Delete a store (folder, file, or the objects under a URL) if it exists."""
    if isinstance(path, StoreURL) or is_url(path):
        try:
            (path if isinstance(path, StoreURL) else StoreURL(str(path))).delete_all()
        except ReservoirError:
            if not ignore_errors:
                raise
        return
    p = Path(os.fspath(path))
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=ignore_errors)
    elif p.exists() or p.is_symlink():
        try:
            p.unlink()
        except OSError:
            if not ignore_errors:
                raise


def store_path(path: str | os.PathLike | StoreURL) -> Path | StoreURL:
    """``path`` as given, or absolute when it has no name of its own (``.``, ``..``); the root is refused.

    A URL (``s3://bucket/x.zarr``) is a :class:`~reservoir.store.remote.StoreURL`.
    """
    if isinstance(path, StoreURL):
        return path
    if is_url(path):
        return StoreURL(str(path))
    p = Path(path)
    if p.name in ("", ".", ".."):
        p = Path(os.path.abspath(p))
    if not p.name:
        raise ReservoirError(f"expected a store path (a .zarr folder or .h5 file), found {str(path)!r}")
    check_name(p)  # the store's temporary and lock names must fit the filesystem too
    return p
