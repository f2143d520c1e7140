"""What a store path holds, or will hold: a Zarr folder or an HDF5 file, from the files already there, an explicit
``--format``, or the path's suffix. Folders and files that no library should open (a FIFO, a device, a metadata
file past the JSON limit) are refused here, before any backend touches them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import HDF5_MAGIC, MAX_JSON_BYTES, file_kind, size_text
from reservoir.store.remote import StoreURL, is_url

__all__ = ["Format", "detect_format", "existing_format", "odd_entries"]

Format = Literal["zarr", "hdf5"]


def existing_format(path: Path | StoreURL) -> Format | None:
    """The backend of whatever is at ``path`` (``None`` when nothing is); refuses other files."""
    if isinstance(path, StoreURL):
        return "zarr" if path.check_metadata(MAX_JSON_BYTES) else None
    expected = "a reservoir feature store (Zarr folder or HDF5 file)"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ReservoirError(f"{path}: expected {expected}, could not inspect it: {err.strerror or err}") from None
    if stat.S_ISDIR(mode):
        # a FIFO would block its reader, a device never end: refused before any library opens them (links are the
        # layout check's to name, :meth:`ZarrBackend.escape`)
        # and a metadata file past the JSON limit is refused before Zarr parses it whole
        for where, st in odd_entries(path, MAX_JSON_BYTES):
            if stat.S_ISREG(st.st_mode):
                raise ReservoirError(f"{path}: expected {expected} whose metadata files are at most "
                                     f"{size_text(MAX_JSON_BYTES)}; found {where} of {st.st_size:,} bytes")
            if not stat.S_ISLNK(st.st_mode):
                raise ReservoirError(f"{path}: expected {expected} of folders and regular files; found "
                                     f"{file_kind(st.st_mode)} at {where}")
        return "zarr"
    if stat.S_ISREG(mode):
        with open(path, "rb") as f:
            if f.read(8) == HDF5_MAGIC:
                return "hdf5"
        raise ReservoirError(f"{path}: expected {expected}, found another file")
    raise ReservoirError(f"{path}: expected {expected}; found {file_kind(mode)}")


def odd_entries(folder: str | os.PathLike, max_meta: int | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry inside ``folder`` that is neither a folder nor a regular file (a link, a FIFO, a device, a
    socket), as ``(path relative to folder, its stat)``; links are not followed. With ``max_meta``, also every
    ``zarr.json`` larger than that many bytes (a regular file's stat)."""
    stack = [os.fspath(folder)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif not e.is_file(follow_symlinks=False):
                    yield os.path.relpath(e.path, folder), e.stat(follow_symlinks=False)
                elif max_meta is not None and e.name == "zarr.json" and e.stat().st_size > max_meta:
                    yield os.path.relpath(e.path, folder), e.stat()


def detect_format(path: str | os.PathLike | StoreURL, fmt: str | None = None) -> Format:
    """Backend from an existing store, an explicit choice, or the suffix (``.zarr`` / ``.h5``).

    An explicit choice that contradicts the store already at ``path`` is
    refused, as is HDF5 on object storage (a URL is a Zarr store).
    """
    if fmt is not None and fmt not in options.FORMATS:
        raise ReservoirError(f"unknown store format {fmt!r}; expected zarr or hdf5")
    loc = path if isinstance(path, StoreURL) else StoreURL(str(path)) if is_url(path) else Path(path)
    if isinstance(loc, StoreURL):
        url = loc
        if fmt == "hdf5" or url.suffix.lower() in (".h5", ".hdf5", ".hdf"):
            raise ReservoirError(f"{url}: expected a Zarr store on object storage (every chunk its own object), "
                                 "found an HDF5 store: HDF5 stores stay on a local filesystem; pass a .zarr URL")
        return "zarr"
    p = loc
    found = existing_format(p)
    if found is not None:
        if fmt is not None and fmt != found:
            raise ReservoirError(f"{p} is an existing {found} store, --format asks for {fmt}; "
                                 "drop --format or pass another --out")
        return found
    by_suffix: Format | None = "hdf5" if p.suffix.lower() in (".h5", ".hdf5", ".hdf") else \
        "zarr" if p.suffix.lower() == ".zarr" else None
    if fmt is not None:
        if by_suffix is not None and by_suffix != fmt:  # an HDF5 file named .zarr (or the reverse) misleads its reader
            raise ReservoirError(f"{p}: --format {fmt} contradicts the path's suffix {p.suffix} ({by_suffix}); drop "
                                 "--format or pass a path with its format's suffix")
        return fmt  # type: ignore[return-value]
    return by_suffix or "zarr"
