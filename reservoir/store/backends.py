"""The two on-disk backends of the feature store, behind the few operations it needs.

Arrays returned support numpy slicing. Attributes are JSON-serializable
dicts (HDF5 keeps each as a JSON string). HDF5 datasets are allocated in full
when created, so writing a chunk later touches only raw data, never the
file's metadata: a kill between two chunk writes cannot damage the file's
structure, only leave chunks unwritten (which their ``done`` flags record).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Literal

from reservoir.errors import ReservoirError
from reservoir.store import layout as lay
from reservoir.store.formats import odd_entries
from reservoir.store.remote import StoreURL

#: How a backend opens a store: read, read and write, or create (refusing an existing one).
Mode = Literal["r", "r+", "w"]


class Backend:
    """Per-backend operations of :class:`~reservoir.store.FeatureStore` (each backend implements all of them)."""

    def __init__(self, path: Path | StoreURL, mode: Mode):
        self.path = path
        self.mode = mode

    def read_attrs(self) -> dict[str, Any]:
        raise NotImplementedError

    def write_attrs(self, attrs: dict[str, Any], replace: bool = False) -> None:
        """Add (or with ``replace``, set exactly) the store's attributes."""
        raise NotImplementedError

    def array(self, name: str) -> Any:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        """Whether an array (or group) ``name`` exists at all (an unreadable one does)."""
        raise NotImplementedError

    def read(self, name: str, sel: Any = Ellipsis) -> Any:
        """``array(name)[sel]``; a failed read waits for the requests it left running before it raises."""
        try:
            return self.array(name)[sel]
        except Exception:  # not Ctrl-C: that one stops at once
            self.settle()
            raise

    def settle(self) -> None:
        """Wait for the requests a failed read or write left running (nothing to wait for by default)."""

    def create(self, name: str, shape, dtype, chunk_rows: int) -> Any:
        raise NotImplementedError

    def write_rows(self, name: str, start: int, values: Any) -> None:
        """Rows ``start .. start + len(values) - 1`` of array ``name`` (a backend may write them faster than a
        slice assignment does)."""
        self.array(name)[start : start + len(values)] = values

    def escape(self, names: list[str]) -> str | None:
        """Why the storage of arrays ``names`` reaches outside the store (a link, external or virtual storage), or
        ``None`` when it all lies inside."""
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


#: A chunk file's temporary while it is written (:func:`_put`): the chunk's name, 32 hex digits, this suffix.
PARTIAL = ".partial"


def _put(path: Path, data: Any) -> None:
    """``data``'s bytes as the file ``path``: written to a fresh temporary beside it (never through a link), then
    renamed into place, so a file linked from elsewhere is replaced, never written through."""
    import uuid

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with open(fd, "wb", buffering=0) as f:
            view = memoryview(data).cast("B")
            while view:
                view = view[f.write(view) :]
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_partial_chunks(folder: str | os.PathLike[str]) -> None:
    """Remove the chunk temporaries (:func:`_put`) that writes killed part-way left inside the store ``folder``
    (called with the store's write lock held, before anything is written); links are neither followed nor removed."""
    import re

    pattern = re.compile(r".+\.[0-9a-f]{32}" + re.escape(PARTIAL))
    for root, _, files in os.walk(os.fspath(folder), followlinks=False):
        for name in files:
            where = os.path.join(root, name)
            if pattern.fullmatch(name) and stat.S_ISREG(os.lstat(where).st_mode):
                os.unlink(where)


class ZarrBackend(Backend):
    def __init__(self, path: Path | StoreURL, mode: Mode):
        super().__init__(path, mode)
        import zarr

        where = path.zarr_store(read_only=mode == "r") if isinstance(path, StoreURL) else str(path)
        # On object storage a new store is built in place: the request that creates its root marks it ours and
        # unfinished, so a creation stopped at any point is recognised and rebuilt (never taken for another's).
        first: dict[str, Any] | None = dict(lay.BUILDING) if isinstance(path, StoreURL) and mode == "w" else None
        self.root = zarr.open_group(where, mode=mode, zarr_format=3, attributes=first)
        self._arrays: dict[str, Any] = {}
        self._raw: dict[str, int | None] = {}  # _raw_chunk_rows, per array

    def read_attrs(self):
        return dict(self.root.attrs)

    def write_attrs(self, attrs, replace=False):
        if replace:
            self.root.attrs.put(attrs)
        else:
            self.root.attrs.update(attrs)

    def array(self, name):
        # Opened once (its metadata read once). Every chunk is written, zeros included: no comparison against the
        # fill value per chunk, and a chunk's object exists once its done flag is set.
        if name not in self._arrays:
            self._arrays[name] = self.root[name].with_config({"write_empty_chunks": True})
        return self._arrays[name]

    def has(self, name):
        try:
            return name in self.root
        except Exception:  # noqa: BLE001 - metadata there that does not parse: present, and unreadable
            return True

    def settle(self):
        """Zarr reads and writes the chunks of one call as concurrent tasks on its event-loop thread, and one failing
        chunk does not cancel the others: left running, their callbacks would land in a loop closed at exit (a
        flood of tracebacks, at worst a crash). Wait for them (2 minutes at most), their outcomes ignored; the wait
        takes in whatever else runs on Zarr's loop then (another thread's reads or writes), which go on as before."""
        import asyncio

        from zarr.core import sync

        loop = sync.loop[0]
        if loop is None or loop.is_closed() or not loop.is_running():
            return

        async def rest() -> None:
            here = asyncio.current_task()
            await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not here), return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(rest(), loop).result(timeout=120)
        except Exception:  # noqa: BLE001 - the error being raised is the one to report
            pass

    def write_rows(self, name, start, values):
        """Whole chunks of a raw array of a local store go straight to their files, as Zarr would write them (the
        chunk's bytes, little-endian, the edge chunk padded with the fill value, written to a temporary and renamed
        into place); anything else through Zarr. Zarr encodes every chunk on its one event-loop thread, which holds
        several writer threads to the speed of one; a direct write releases the GIL for the copy."""
        import numpy as np

        arr = self.array(name)
        rows = self._raw_chunk_rows(name)
        end = start + len(values)
        whole = rows is not None and start % rows == 0 and (end % rows == 0 or end == arr.shape[0])
        if not whole or end > arr.shape[0] or np.shape(values)[1:] != arr.shape[1:]:
            arr[start:end] = values  # Zarr's own checks and read-modify-write
            return
        values = np.ascontiguousarray(values, dtype=arr.dtype.newbyteorder("<"))
        folder = Path(self.path, name)
        tail = (0,) * (arr.ndim - 1)
        for lo in range(0, len(values), rows):
            block = values[lo : lo + rows]
            if len(block) < rows:  # the edge chunk: stored whole, past the last row the fill value (0)
                block = np.concatenate([block, np.zeros((rows - len(block), *block.shape[1:]), block.dtype)])
            _put(folder / arr.metadata.encode_chunk_key(((start + lo) // rows, *tail)), block)

    def _raw_chunk_rows(self, name):
        """Rows per chunk of ``name`` when its chunk files are the raw bytes of whole row blocks on a local
        filesystem (chunked along rows only, the bytes codec alone, little-endian); ``None`` otherwise."""
        if name not in self._raw:
            self._raw[name] = self._find_raw_chunk_rows(name)
        return self._raw[name]

    def _find_raw_chunk_rows(self, name):
        if isinstance(self.path, StoreURL):
            return None
        import numpy as np
        from zarr.codecs import BytesCodec
        from zarr.codecs.bytes import Endian

        meta = self.array(name).metadata
        codecs, grid = getattr(meta, "codecs", ()), getattr(meta, "chunk_grid", None)
        shape, chunks = tuple(meta.shape), tuple(getattr(grid, "chunk_shape", ()))
        raw = (len(codecs) == 1 and isinstance(codecs[0], BytesCodec) and codecs[0].endian in (Endian.little, None))
        positive_zero = meta.fill_value == 0 and not np.signbit(meta.fill_value)  # the padding written below
        if not raw or not shape or len(chunks) != len(shape) or chunks[1:] != shape[1:] or not positive_zero:
            return None
        return chunks[0]

    def escape(self, names):
        if isinstance(self.path, StoreURL):
            return None  # objects under one prefix: nothing links elsewhere
        for where, st in odd_entries(self.path):
            if stat.S_ISLNK(st.st_mode):
                return f"{where} is a symbolic link (to {os.readlink(os.path.join(self.path, where))})"
        return None

    def create(self, name, shape, dtype, chunk_rows):
        import numpy as np

        chunks = (chunk_rows, *shape[1:]) if shape else ()
        self._arrays.pop(name, None)
        self._raw.pop(name, None)
        # Stored raw, every array: zstd saves about 8% of a float16 feature chunk and costs more CPU per megabyte
        # than writing it, and a chunk of labels, lengths, checksums or one done flag is too small to be worth a
        # codec (a raw chunk is also one that write_rows writes without Zarr's event loop).
        return self.root.create_array(name, shape=shape, chunks=chunks, dtype=np.dtype(dtype), fill_value=0,
                                      compressors=None)

    def flush(self):
        pass

    def close(self):
        self._raw.clear()
        self._arrays.clear()  # on object storage: no client kept alive past the store's use


class H5Backend(Backend):
    def __init__(self, path: Path | StoreURL, mode: Mode):
        if isinstance(path, StoreURL):
            raise ReservoirError(f"{path}: HDF5 stores stay on a local filesystem; pass a .zarr URL")
        super().__init__(path, mode)
        import h5py

        # Readers skip HDF5's own file lock: the store's write lock (reservoir.store.lock) is the one that counts.
        # Writers get no chunk cache: every write reaches the file inside the call that makes it, so a full disk
        # raises there (a cached chunk would be written when its dataset is closed, where errors are lost).
        kw = {"locking": False} if mode == "r" else {"rdcc_nbytes": 0}
        self.file = h5py.File(path, {"r": "r", "r+": "r+", "w": "w-"}[mode], **kw)
        self._arrays: dict[str, Any] = {}

    def read_attrs(self):
        out = {}
        for k, v in self.file.attrs.items():
            try:
                out[k] = json.loads(v)
            except (TypeError, ValueError, RecursionError):
                raise ReservoirError(f"{self.path}: expected a reservoir feature store, found an HDF5 file whose "
                                     f"attribute {k!r} is not reservoir's") from None
        return out

    def write_attrs(self, attrs, replace=False):
        if replace:
            for k in list(self.file.attrs):
                del self.file.attrs[k]
        for k, v in attrs.items():
            self.file.attrs[k] = json.dumps(v)

    def array(self, name):
        if name not in self._arrays:  # kept open: flush() then reaches (and reports) every write
            self._arrays[name] = self.file[name]
        return self._arrays[name]

    def has(self, name):
        try:
            return self.file.get(name, getlink=True) is not None
        except Exception:  # noqa: BLE001 - an entry there that does not read: present, and unreadable
            return True

    def escape(self, names):
        import h5py

        for name in names:
            parts = name.split("/")
            for i in range(1, len(parts) + 1):
                link = self.file.get("/".join(parts[:i]), getlink=True)
                if isinstance(link, h5py.ExternalLink):
                    return f"{'/'.join(parts[:i])} is an external link (to {link.filename})"
                if isinstance(link, h5py.SoftLink):
                    return f"{'/'.join(parts[:i])} is a soft link (to {link.path})"
            obj = self.file.get(name)
            if isinstance(obj, h5py.Dataset):
                if obj.is_virtual:
                    return f"{name} is a virtual dataset"
                if obj.external:
                    return f"{name} is stored in an external file ({obj.external[0][0]})"
        return None

    def create(self, name, shape, dtype, chunk_rows):
        import h5py

        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # chunk writes never touch metadata
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # unwritten chunks are known from their done flags
        chunks = (chunk_rows, *shape[1:]) if shape and shape[0] else None
        return self.file.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, fillvalue=0, dcpl=dcpl)

    def flush(self):
        self.file.flush()

    def close(self):
        self._arrays.clear()
        if self.file.id.valid:
            self.file.close()


BACKENDS = {"zarr": ZarrBackend, "hdf5": H5Backend}
