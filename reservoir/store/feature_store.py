"""The feature store: one layout over Zarr (v3) and HDF5, written by one process at a time, read only when whole.

Layout (same names in both backends)::

    attrs: schema, reservoir_version, complete, created, arrays{name: shape, dtype}, checksums{...},
           backbone{...}, projection{...}, task{...}, layers, pooling{kinds, n_out_tokens}, dtype
    projection/weight          (d_in, n_dim)
    final_norm/weight, bias    (n_dim,)           when the backbone has one
    {split}/features           (N, n_layers, n_out_tokens, n_dim)   pooling ``last``: the last real token(s)
    {split}/features_first     (N, n_layers, 1, n_dim)              pooling ``first``, when stored
    {split}/features_mean      (N, n_layers, 1, n_dim)              pooling ``mean`` (over real tokens), when stored
    {split}/labels             (N, ...)
    {split}/lengths            (N,)               real length of each sequence
    {split}/done               (n_chunks,) bool   which row chunks are fully written
    {split}/checksums          (n_chunks, k)      CRC32C of each chunk's rows in features, labels, lengths(, states)
    {split}/states             (N, L, n_dim)      split-point stores only: every position at
                                                  layer ``full_seq_layer``, zero past the length

What a store guarantees:

- **Creation is atomic.** A new store is built under a hidden temporary name
  beside its path (attributes, projection, final norm, every array) and
  renamed into place, so a store at its path always has its whole layout. On
  object storage (a URL, :mod:`reservoir.store.remote`) it is built in place
  with its attributes written last, and is a store only once they are.
- **One writer.** Writing holds an exclusive lock (:mod:`reservoir.store.lock`;
  a lease object on object storage, :mod:`reservoir.store.lease`) taken before
  anything at the path is opened; a second writer is refused in one line
  naming the holder, and a lock left by a killed process is free.
- **Chunks are verified.** Rows are chunked (at least ~1 MiB of features per
  chunk). A chunk's checksums are recorded, then its ``done`` flag set;
  ``complete`` is set last. Readers check every chunk they read against its
  checksums (:mod:`reservoir.store.checks`), and reopening a store for writing
  verifies it and re-extracts the damaged chunks.
- **Nothing non-finite is stored**, and a failed write stops the run with the
  chunk not marked done, so the same command resumes bit-identically.

The settings that shape the features (:data:`KEY_FIELDS`) are the store's key:
reopening it with other settings is refused, naming the first differing field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from reservoir import options, settings
from reservoir.errors import ReservoirError
from reservoir.io import MAX_JSON_BYTES
from reservoir.options import shown
from reservoir.store import checks
from reservoir.store import layout as lay
from reservoir.store import lock as locks
from reservoir.store.backends import BACKENDS, Backend, Mode
from reservoir.store.formats import Format, detect_format
from reservoir.store.files import cause, store_path
from reservoir.store.remote import StoreURL, request_failed


SCHEMA = "reservoir.features/2"
#: Attributes that shape the features; a store is refused if any differs (reported in this order).
KEY_FIELDS = ("schema", "task", "backbone", "projection", "layers", "pooling", "dtype", "compute_dtype",
              "full_seq_layer")


def first_difference(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key field (dotted, e.g. ``task.name``, ``backbone.init``) whose values differ."""
    return settings.first_difference(old, new, KEY_FIELDS)


def store_key(attrs: dict[str, Any], where: Any = "store") -> dict[str, Any]:
    """The key of a store with settings ``attrs`` (its :data:`KEY_FIELDS`, ``schema`` :data:`SCHEMA`) as the store's
    attributes read it back: through JSON, so a tuple comes back a list and a key a str; what a reopened store's
    attributes are compared with. Values JSON cannot write (or NaN) are refused in one line naming ``where``.

    Examples
    --------
    >>> store_key({"task": {"params": {"window": (2, 3)}}})["task"]
    {'params': {'window': [2, 3]}}
    """
    key = {"schema": SCHEMA, **{k: attrs[k] for k in KEY_FIELDS if k != "schema" and k in attrs}}
    try:
        return json.loads(json.dumps(key, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ReservoirError(f"{where}: expected store attributes that JSON can write, found {err}") from None


S = TypeVar("S", bound="FeatureStore")


class FeatureStore:
    """A feature store on disk (Zarr folder or HDF5 file) or on object storage (a Zarr store URL).

    Use :meth:`open` to read a complete store, and
    :meth:`reservoir.store.WritableStore.create` to start (or resume) writing
    one: a :class:`~reservoir.store.WritableStore` is a store that holds the
    write lock. Usable as a context manager; a writer's lock is released when
    the store is closed.

    Examples
    --------
    >>> store = FeatureStore.open("cache/bit-xor-tiny.zarr")      # doctest: +SKIP
    >>> store.splits, store.layers, store.features("test").shape  # doctest: +SKIP
    (['train', 'test'], [0, 1, 2], (1000, 3, 1, 32))
    """

    def __init__(self, backend: Backend, fmt: Format, lock: locks.StoreLock | locks.SharedLock | None = None):
        self._backend: Backend | None = backend  # None once closed
        self._lock = lock
        self.format = fmt
        self.path = backend.path
        self.attrs = backend.read_attrs()
        self._verified: set[tuple[str, str, int]] = set()
        self._sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._unreadable: dict[str, dict[int, str]] = {}  # per split: chunks whose flag or checksums do not read
        #: Arrays of the recorded layout that are absent (a copy cut short, a folder deleted): found only when the
        #: store is reopened to be written (:meth:`WritableStore.create`), which makes them again.
        self.missing: list[str] = []

    @property
    def _b(self) -> Backend:
        """The open backend; a closed store is one line (HDF5 would raise its own error, Zarr read on)."""
        if self._backend is None:
            raise ReservoirError(f"{self.path}: expected an open store; found it closed (FeatureStore.open "
                                 "opens it again)")
        return self._backend

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or the ``with`` block) has closed the store."""
        return self._backend is None

    # -- opening -----------------------------------------------------------
    @classmethod
    def open(cls: type[S], path: str | os.PathLike | StoreURL, mode: Mode = "r", allow_incomplete: bool = False,
             _lock: locks.StoreLock | locks.SharedLock | None = None, _missing_ok: bool = False) -> S:
        """Open an existing store for reading; refuses anything that is not a whole store of ours.

        A store being written, or left unfinished by an interrupted run, is
        refused unless ``allow_incomplete`` (what ``reservoir info`` uses).
        ``mode`` is ``"r"``: a store is written by ``extract`` alone (``"r+"``
        is its writers', under the lock they hold; ``"w"``, which would empty
        the store, is refused before anything is opened).
        """
        if mode not in ("r", "r+") or (mode == "r+" and _lock is None):
            raise ReservoirError(f"expected mode 'r' (a store is opened to be read; extract writes it); found "
                                 f"{mode!r}")
        p = store_path(path)
        # on object storage, one listing says whether anything is there and refuses oversized metadata objects
        # before Zarr reads them whole (as detect_format's check of the files of a store on disk does)
        if not (p.check_metadata(MAX_JSON_BYTES) if isinstance(p, StoreURL) else p.exists()):
            raise ReservoirError(f"{p}: expected a feature store, found no such file or folder"
                                 f"{' (no object under that prefix)' if isinstance(p, StoreURL) else ''}")
        fmt = detect_format(p)
        if isinstance(p, Path) and p.is_dir() and not (p / "zarr.json").is_file():  # an empty or a results folder
            raise ReservoirError(f"{p}: expected a feature store (a Zarr folder holding zarr.json); found a folder "
                                 "without one")
        writer = locks.holder(p) if _lock is None else None
        if writer is not None and not allow_incomplete:
            raise ReservoirError(f"{p} is being written by {locks.describe(writer)}; wait for it to finish")
        try:
            backend = BACKENDS[fmt](p, mode)
        except Exception as err:  # noqa: BLE001 - any library error is a bad store
            raise ReservoirError(f"{p}: expected a readable {fmt} feature store, found: {cause(err)}") from None
        try:
            store = cls(backend, fmt, _lock)
            if isinstance(p, StoreURL) and "attrs_crc32c" not in store.attrs:  # built in place, attributes last
                if store.attrs != lay.BUILDING:
                    raise ReservoirError(f"{p}: expected a reservoir feature store, found other objects there")
                writer = locks.holder(p) if _lock is None else None
                raise ReservoirError(f"{p} is being created by {locks.describe(writer)}; wait for it to finish"
                                     if writer is not None else f"{p} is incomplete (its creation was interrupted); "
                                     "rerun the same `reservoir extract` command to create it")
            schema = store.attrs.get("schema")
            if schema != SCHEMA:
                hint = "; it was written by an older reservoir: extract it again" \
                    if str(schema).startswith("reservoir.features/") else ""
                raise ReservoirError(f"{p}: expected a store of schema {SCHEMA!r}, found schema {shown(schema)}{hint}")
            store.missing = checks.check_layout(store, missing_ok=_missing_ok)
            store.attrs["pooling"] = lay.pooling_attrs(store.attrs["pooling"])  # stores written before poolings
            if not store.complete and not allow_incomplete:
                raise ReservoirError(f"{p} is incomplete (an extraction was interrupted); rerun the same "
                                     "`reservoir extract` command to finish it")
        except BaseException:
            backend.close()
            raise
        return store

    # -- reading -----------------------------------------------------------
    @property
    def splits(self) -> list[str]:
        return list(self.attrs.get("splits", []))

    @property
    def layers(self) -> list[int]:
        return list(self.attrs["layers"])

    @property
    def complete(self) -> bool:
        return bool(self.attrs.get("complete", False))

    @property
    def n_out_tokens(self) -> int:
        return int(self.attrs["pooling"]["n_out_tokens"])

    @property
    def poolings(self) -> list[str]:
        """How each layer was read into a row (``last``, ``first``, ``mean``), in the store's order."""
        return lay.poolings(self.attrs)

    def pooling(self, pooling: str | None = None) -> str:
        """``pooling`` checked to be in the store (one line if not), or the store's first when ``None``."""
        if pooling is None:
            return self.poolings[0]
        if pooling not in self.poolings:
            raise ReservoirError(f"{self.path}: expected a pooling among {self.poolings}, found {pooling!r} "
                                 "(extract --pooling to store it)")
        return pooling

    @property
    def full_seq_layer(self) -> int | None:
        return self.attrs.get("full_seq_layer")

    def chunk_rows(self, split: str) -> int:
        return int(self.attrs["chunk_rows"][split])

    def row_arrays(self) -> list[str]:
        """The per-row arrays of each split, in the column order of ``checksums``."""
        return list(self.attrs["checksums"]["arrays"])

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ReservoirError(f"{self.path}: expected a split among {self.splits}, found {split!r}")

    def features(self, split: str, pooling: str | None = None) -> checks.CheckedArray:
        """``(N, n_layers, n_out_tokens, n_dim)`` array of one pooling (default the store's first; lazy: slice it;
        rows are checked when read)."""
        self._check_split(split)
        return checks.CheckedArray(self, split, lay.feature_array(self.pooling(pooling)))

    def n_rows(self, split: str) -> int:
        """Rows of ``split`` (reads no data)."""
        return self.shape(split, "lengths")[0]

    def labels(self, split: str, lazy: bool = False):
        """``(N, ...)`` labels; ``lazy=True`` gives the (checked) store array to slice instead of loading it."""
        self._check_split(split)
        arr = checks.CheckedArray(self, split, "labels")
        return arr if lazy else np.asarray(arr[...])

    def lengths(self, split: str) -> np.ndarray:
        self._check_split(split)
        return np.asarray(checks.CheckedArray(self, split, "lengths")[...])

    def states(self, split: str) -> checks.CheckedArray:
        """``(N, L, n_dim)`` layer-``full_seq_layer`` states of a split-point store (lazy, checked)."""
        self._check_split(split)
        if self.full_seq_layer is None:
            raise ReservoirError(f"{self.path}: expected a split-point store (extract --full-seq-layer S), "
                                 "found one without full-sequence states")
        return checks.CheckedArray(self, split, "states")

    def shape(self, split: str, name: str) -> tuple[int, ...]:
        """Shape of ``{split}/{name}`` as recorded when the store was created (reads no data)."""
        return tuple(self.attrs["arrays"][f"{split}/{name}"]["shape"])

    def done(self, split: str) -> np.ndarray:
        """``{split}/done`` ``(n_chunks,)``, read now; a chunk whose flag does not read counts as not done."""
        self._check_split(split)
        return self._by_chunk(f"{split}/done")[0].astype(bool)

    def _by_chunk(self, name: str) -> tuple[np.ndarray, dict[int, str]]:
        """A per-chunk array (``done``, ``checksums``: one chunk of the store each) and ``{chunk: reason}`` for the
        chunks that do not read: one garbled flag file costs its own chunk, not the split's."""
        try:
            return np.asarray(self._b.read(name)), {}
        except Exception:  # noqa: BLE001 - a garbled chunk file somewhere in it: read chunk by chunk
            pass
        shape = self.shape(*name.split("/"))
        out, bad = np.zeros(shape, dtype=self._b.array(name).dtype), {}
        for c in range(shape[0]):
            try:
                out[c] = np.asarray(self._b.read(name, slice(c, c + 1)))[0]
            except Exception as err:  # noqa: BLE001
                self._check_request(name, err)
                bad[c] = f"{name} of chunk {c} unreadable ({cause(err)})"
        return out, bad

    def _check_request(self, name: str, err: BaseException) -> None:
        """Raise (one line) a read that failed as an object store's request, or because the store was closed under
        it (a view read after ``close``, another thread's ``with`` block ending), not as its data: the store is not
        damaged, and nothing is marked to re-extract."""
        if self._backend is None:
            self._b  # noqa: B018 - raises the closed store's one line
        if isinstance(self.path, StoreURL) and request_failed(err):
            raise ReservoirError(f"{self.path}: could not read {name} ({cause(err)}); the store is not damaged by "
                                 "it: rerun when the object store answers") from None

    def read_fixed(self, name: str) -> np.ndarray:
        """``projection/weight`` or ``final_norm/{weight,bias}``, checked against its checksum."""
        try:
            value = np.asarray(self._b.read(name))
        except Exception as err:  # noqa: BLE001
            self._check_request(name, err)
            raise checks.Damaged(self, f"{name} unreadable ({cause(err)})") from None
        if lay.crc(value, name) != self.attrs["checksums"]["fixed"][name]:
            raise checks.Damaged(self, f"{name} does not match its checksum")
        return value

    def projection_weight(self) -> np.ndarray:
        return self.read_fixed("projection/weight")

    def final_norm(self) -> dict[str, np.ndarray] | None:
        if "final_norm/weight" not in self.attrs["arrays"]:
            return None
        return {k: self.read_fixed(f"final_norm/{k}") for k in ("weight", "bias")}

    def layer_index(self, layer: int) -> int:
        """Position of ``layer`` along the store's layer axis."""
        integer = options.is_int(layer)  # not True, 2.0 or "2"
        if not integer or layer not in self.layers:
            raise ReservoirError(f"{self.path}: expected a layer among {self.layers}, found "
                                 f"{int(layer) if integer else repr(layer)}")
        return self.layers.index(layer)

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the features: the key fields plus the version that wrote them."""
        return {k: self.attrs.get(k) for k in (*KEY_FIELDS, "reservoir_version", "created")}

    # -- checking ----------------------------------------------------------
    def done_and_sums(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """``{split}/done`` ``(n_chunks,)`` and ``{split}/checksums`` ``(n_chunks, k)``, read once (``Damaged`` if
        unreadable)."""
        if split not in self._sums:
            try:
                done, bad_done = self._by_chunk(f"{split}/done")
                sums, bad_sums = self._by_chunk(f"{split}/checksums")
            except Exception as err:  # noqa: BLE001 - their metadata, say
                self._check_request(f"{split}/done", err)
                raise checks.Damaged(self, f"{split}/done or {split}/checksums unreadable ({cause(err)})") from None
            done = done.astype(bool)
            done[list({**bad_done, **bad_sums})] = False  # a chunk vouched for by nothing readable is not done
            self._sums[split], self._unreadable[split] = (done, sums), {**bad_sums, **bad_done}
        return self._sums[split]

    def unreadable_flags(self, split: str) -> dict[int, str]:
        """The chunks of ``split`` whose ``done`` flag or checksums do not read, with why (:meth:`done_and_sums`)."""
        self.done_and_sums(split)
        return self._unreadable[split]

    def read_chunks(self, split: str, name: str, c0: int, c1: int) -> np.ndarray:
        """Rows of chunks ``c0..c1-1`` of ``{split}/{name}``, each checked against its checksum."""
        r, n = self.chunk_rows(split), self.shape(split, name)[0]
        lo, hi = c0 * r, min(c1 * r, n)
        try:
            block = np.asarray(self._b.read(f"{split}/{name}", slice(lo, hi)))
        except Exception as err:  # noqa: BLE001 - a truncated or garbled chunk
            self._check_request(f"{split}/{name}", err)
            raise checks.Damaged(self, f"{split}/{name} rows {lo}-{hi - 1} unreadable ({cause(err)})") from None
        done, sums = self.done_and_sums(split)
        col = self.row_arrays().index(name)
        for c in range(c0, c1):
            if (split, name, c) in self._verified:
                continue
            if not done[c]:
                if self.complete:
                    raise checks.Damaged(self, f"chunk {c} of split {split!r} is marked unwritten")
                raise ReservoirError(f"{self.path}: chunk {c} of split {split!r} is not written yet (the store is "
                                     "incomplete); rerun the extract command to finish it")
            part = block[(c - c0) * r: (c - c0 + 1) * r]
            if lay.crc(part, f"{split}/{name}/{c}") != int(sums[c, col]):
                raise checks.Damaged(self, f"chunk {c} of {split}/{name} (rows {c * r}-{c * r + len(part) - 1}) "
                                           "does not match its checksum")
            self._verified.add((split, name, c))
        return block

    def verify(self, progress: bool = False) -> dict[str, dict[int, str]]:
        """Check every written chunk of every row array; ``{split: {chunk: reason}}`` for the damaged ones."""
        return checks.verify(self, progress)

    def verify_fixed(self) -> dict[str, str]:
        """The fixed arrays (projection, final norm) that do not read back as written: ``{name: reason}``."""
        return checks.verify_fixed(self)

    def escape(self, names: list[str]) -> str | None:
        """Why the storage of arrays ``names`` reaches outside the store (a link, external or virtual storage)."""
        return self._b.escape(names)

    def backend_array(self, name: str) -> Any:
        """The backend's array ``name``, unchecked (what :mod:`reservoir.store.checks` reads through)."""
        return self._b.array(name)

    def backend_has(self, name: str) -> bool:
        """Whether the backend holds an array (or group) ``name`` at all, readable or not."""
        return self._b.has(name)

    def close(self) -> None:
        """Close the store (and release the write lock); a failing close is one line. Closing again does nothing."""
        if self._backend is None:
            return
        backend, self._backend = self._backend, None
        try:
            backend.close()
        except Exception as err:  # noqa: BLE001 - e.g. HDF5 flushing onto a full disk
            raise ReservoirError(f"{self.path}: could not close the store ({cause(err)}); rerun the same "
                                 "command to resume") from err
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except ReservoirError:
            if exc_type is None:
                raise  # otherwise the error already in flight is the one to report
