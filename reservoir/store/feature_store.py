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
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import settings
from reservoir.errors import ReservoirError
from reservoir.io import MAX_JSON_BYTES, fsync_dir
from reservoir.options import shown
from reservoir.store import checks
from reservoir.store import layout as lay
from reservoir.store import lock as locks
from reservoir.store.backends import BACKENDS, Backend, Format, Mode, detect_format, remove_partial_chunks
from reservoir.store.files import (build, cause, close_quietly, create_array, remove, remove_temporaries,
                                   store_path)
from reservoir.store.remote import StoreURL


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


class FeatureStore:
    """A feature store on disk (Zarr folder or HDF5 file) or on object storage (a Zarr store URL).

    Use :meth:`open` to read a complete store and :meth:`create` to start (or
    resume) writing one. Usable as a context manager; a writer's lock is
    released when the store is closed.

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
        # write_chunks may run on several threads (disjoint chunks); the checksums and done flags of many chunks
        # share a backend chunk, so their read-modify-write is one thread's at a time
        self._flags_lock = threading.Lock()
        #: Arrays of the recorded layout that are absent (a copy cut short, a folder deleted): found only when the
        #: store is reopened to be written (:meth:`create`), which makes them again.
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
    def open(cls, path: str | os.PathLike | StoreURL, mode: Mode = "r", allow_incomplete: bool = False,
             _lock: locks.StoreLock | locks.SharedLock | None = None, _missing_ok: bool = False) -> "FeatureStore":
        """Open an existing store for reading; refuses anything that is not a whole store of ours.

        A store being written, or left unfinished by an interrupted run, is
        refused unless ``allow_incomplete`` (what ``reservoir info`` uses).
        """
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

    @classmethod
    def create(
        cls,
        path: str | os.PathLike | StoreURL,
        attrs: dict[str, Any],
        splits: dict[str, tuple[int, tuple[int, ...]]],
        feature_shape: tuple[int, int, int],
        projection_weight: np.ndarray,
        final_norm: dict[str, np.ndarray] | None = None,
        fmt: str | None = None,
        states_length: int | None = None,
        progress: bool = False,
        job: str | None = None,
    ) -> "FeatureStore":
        """Create a store, or reopen one written with identical settings to resume (and repair) it.

        Takes the store's write lock first; the returned store holds it until closed. A store this call built
        and then found wrong (its attributes contradict its arrays) is removed again before the lock is
        released.

        Parameters
        ----------
        attrs : dict
            Must contain every :data:`KEY_FIELDS` entry except ``schema`` (``compute_dtype`` may be left out:
            recorded as unknown), among them ``backbone.n_dim``, ``task.label_shape``, ``pooling.n_out_tokens``
            and ``layers`` (what the arrays' shapes are checked against), all values JSON can write. They are
            stored as JSON reads them back (a tuple as a list), and compared so when a store is reopened.
        splits : dict
            ``split -> (n_rows, label_shape)``.
        feature_shape : tuple
            ``(n_layers, n_out_tokens, n_dim)``.
        states_length : int, optional
            Sequence length of the full-sequence states of a split-point store.
        progress : bool
            Show a progress bar while an existing store is verified.
        job : str, optional
            Recorded in a store URL's lease beside the writer's host and pid.
        """
        p = store_path(path)
        if isinstance(p, Path) and p.is_symlink() and not p.exists():
            raise ReservoirError(f"{p} is a symbolic link to {os.readlink(p)}, which does not exist; remove the link "
                                 "or pass another --out")
        fmt = detect_format(p, fmt)
        if isinstance(p, StoreURL):
            p.check_outside_stores()
        # a store made through this API by other code may not say what computed it: recorded as unknown
        attrs = {"compute_dtype": None, **_required_attrs(p, attrs)}
        attrs["pooling"] = lay.pooling_attrs(attrs["pooling"])
        key = store_key(attrs, p)
        lock = locks.writer_lock(p, job).acquire()
        built = False  # whether this call built the store (removed again if it is refused right after)

        def undo(backend: Backend | None) -> None:  # on a refusal: close, remove what this call built, unlock
            if backend is not None:
                close_quietly(backend)
            if built:
                remove(p, ignore_errors=True)
            lock.release()

        try:
            if isinstance(p, StoreURL):
                state = _state(p)
                if state == "foreign":
                    raise ReservoirError(f"{p}: expected a reservoir feature store or an empty prefix, found other "
                                         "objects there; pass another --out")
                if state == "building":
                    p.delete_all()  # a creation that was interrupted: no chunk of it was written
                if state != "whole":
                    build(p, fmt, {**attrs, **key}, splits, feature_shape, projection_weight, final_norm,
                          states_length)
                    built = True
            elif not p.exists():
                remove_temporaries(p)
                tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
                build(tmp, fmt, {**attrs, **key}, splits, feature_shape, projection_weight, final_norm,
                      states_length)
                os.rename(tmp, p)
                built = True
                fsync_dir(p.parent)
            store = cls.open(p, mode="r+", allow_incomplete=True, _lock=lock, _missing_ok=True)
        except BaseException:
            undo(None)
            raise
        try:
            if isinstance(p, Path) and store.format == "zarr":
                remove_partial_chunks(p)  # what a killed run was writing; none of it was marked done
        except OSError as err:
            undo(store._b)
            raise ReservoirError(f"{p}: could not remove the temporaries of an interrupted write ({cause(err)})") \
                from err
        try:
            diff = first_difference(store.attrs, key)
            if diff is not None:
                raise ReservoirError(f"{p} was written with {settings.describe_difference(diff)}; "
                                     "pass another --out or delete the store")
            store.recreate_missing()
            store.repair({"projection/weight": projection_weight,
                          **{f"final_norm/{k}": v for k, v in (final_norm or {}).items()}}, progress)
        except BaseException:
            undo(store._b)
            raise
        return store

    def writer(self) -> dict[str, Any] | None:
        """Who holds the write lock this store was opened under, as the lock recorded it (``{pid, host, started}``;
        a lease adds its job); ``None`` for a store opened for reading."""
        record = getattr(self._lock, "record", None)
        return None if record is None else dict(record)

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
                bad[c] = f"{name} of chunk {c} unreadable ({cause(err)})"
        return out, bad

    def read_fixed(self, name: str) -> np.ndarray:
        """``projection/weight`` or ``final_norm/{weight,bias}``, checked against its checksum."""
        try:
            value = np.asarray(self._b.read(name))
        except Exception as err:  # noqa: BLE001
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
        if layer not in self.layers:
            raise ReservoirError(f"{self.path}: expected a layer among {self.layers}, found {layer}")
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

    def repair(self, fixed: dict[str, np.ndarray], progress: bool = False) -> dict[str, dict[int, str]]:
        """Verify a store reopened for writing: rewrite damaged fixed arrays from ``fixed`` (the values this run
        computed, equal by the settings) and mark damaged chunks unwritten, so the extraction redoes them."""
        bad, bad_fixed = self.verify(progress), self.verify_fixed()
        if not bad and not bad_fixed:
            return bad
        listed = "; ".join([*(f"{s} {', '.join(map(str, sorted(b)))}" for s, b in bad.items()), *bad_fixed])
        logging.getLogger("reservoir").warning(
            "%s: %d damaged chunk(s) and %d damaged array(s) will be written again: %s",
            self.path, sum(map(len, bad.values())), len(bad_fixed), listed)
        self._check_lock()
        try:
            self._b.write_attrs({"complete": False})
            self.attrs["complete"] = False
            for name in bad_fixed:
                self._b.array(name)[...] = fixed[name]
            for split, chunks in bad.items():
                for c in chunks:
                    self._b.array(f"{split}/done")[c] = False
            self._b.flush()
        except Exception as err:  # noqa: BLE001 - a read-only store, a full disk
            self._b.settle()
            raise ReservoirError(f"{self.path}: could not repair the damaged store ({cause(err)}); "
                                 "delete it and extract again") from err
        self._sums.clear()
        self._unreadable.clear()
        self._verified.clear()
        return bad

    def recreate_missing(self) -> None:
        """Make the absent arrays of the layout (:attr:`missing`) again, empty, and mark every chunk of their splits
        unwritten, so the extraction writes them whole (a fixed array is rewritten by :meth:`repair`)."""
        if not self.missing:
            return
        logging.getLogger("reservoir").warning(
            "%s: %d missing array(s) will be made again (their splits extracted again): %s",
            self.path, len(self.missing), ", ".join(self.missing))
        self._check_lock()
        a = self.attrs
        try:
            self._b.write_attrs({"complete": False})
            self.attrs["complete"] = False
            splits = []
            for name in self.missing:
                create_array(self._b, name, a["arrays"][name], a["chunk_rows"])
                split = name.split("/")[0]
                if split in self.splits and split not in splits:
                    splits.append(split)
            for split in splits:
                self._b.array(f"{split}/done")[...] = False
            self._b.flush()
        except Exception as err:  # noqa: BLE001 - a read-only store, a full disk
            self._b.settle()
            raise ReservoirError(f"{self.path}: could not make its missing arrays again ({cause(err)}); "
                                 "delete it and extract again") from err
        self.missing = []
        self._sums.clear()
        self._unreadable.clear()
        self._verified.clear()

    def escape(self, names: list[str]) -> str | None:
        """Why the storage of arrays ``names`` reaches outside the store (a link, external or virtual storage)."""
        return self._b.escape(names)

    def backend_array(self, name: str) -> Any:
        """The backend's array ``name``, unchecked (what :mod:`reservoir.store.checks` reads through)."""
        return self._b.array(name)

    def backend_has(self, name: str) -> bool:
        """Whether the backend holds an array (or group) ``name`` at all, readable or not."""
        return self._b.has(name)

    # -- writing -----------------------------------------------------------
    def write_chunk(self, split: str, chunk: int, features: np.ndarray | dict[str, np.ndarray], labels: np.ndarray,
                    lengths: np.ndarray, states: np.ndarray | None = None) -> None:
        """Write the rows of one chunk and their checksums, then mark it done (:meth:`write_chunks` of one)."""
        self.write_chunks(split, [chunk], features, labels, lengths=lengths, states=states)

    def write_chunks(self, split: str, chunks: list[int], features: np.ndarray | dict[str, np.ndarray],
                     labels: np.ndarray, lengths: np.ndarray, states: np.ndarray | None = None) -> None:
        """Write the rows of several chunks and their checksums, then mark them done.

        ``chunks`` are ascending chunk indices; the arrays hold their rows one
        chunk after the other. ``features`` is ``{pooling: (r, n_layers, n_out,
        n_dim)}`` for every pooling of the store, or one array for a store of
        one pooling; ``labels`` ``(r, ...)``, ``lengths`` ``(r,)`` (each row's
        real length) and, in a split-point store, ``states`` ``(r, L, n_dim)``.
        Each run of consecutive chunks is one write per array (the backend's: a
        file per chunk, or its own encoding of them together), then every
        chunk's checksums, then the ``done`` flags: a kill in between leaves
        chunks written but not done, which a rerun writes again.

        Refuses, before anything is written, an array whose rows are not the
        chunks' ``r`` rows of the stored array's shape, and non-finite features
        or states; a failed write raises one line and leaves the chunks not done.
        """
        if self._lock is None:
            raise ReservoirError(f"{self.path}: opened for reading; write through FeatureStore.create")
        self._check_lock()
        if not isinstance(features, dict):
            if len(self.poolings) != 1:
                raise ReservoirError(f"{self.path}: expected features of every pooling {self.poolings} as a dict")
            features = {self.poolings[0]: features}
        self._check_split(split)
        r, n = self.chunk_rows(split), self.n_rows(split)
        spans = [(c * r, min((c + 1) * r, n)) for c in chunks]  # each chunk's rows in the store
        total = sum(hi - lo for lo, hi in spans)
        if list(chunks) != sorted(set(chunks)) or (chunks and (chunks[0] < 0 or spans[-1][0] >= n)):
            raise ReservoirError(f"{self.path}: expected ascending chunks of split {split!r} among "
                                 f"0..{self.shape(split, 'done')[0] - 1}, found chunks {list(chunks)[:5]}")
        given: dict[str, Any] = {**{lay.feature_array(p): features.get(p) for p in self.poolings},
                                 "labels": labels, "lengths": lengths, "states": states}
        for name in self.row_arrays():  # every array the rows of these chunks, each row of the stored shape
            want, found = (total, *self.shape(split, name)[1:]), None if given[name] is None else np.shape(given[name])
            if found != want:
                raise ReservoirError(f"{self.path}: expected {split}/{name} of shape {want} (the rows of chunks "
                                     f"{list(chunks)[:5]}), found {'none' if found is None else found}")
        dtype = np.dtype(self.attrs["dtype"])
        rows = {lay.feature_array(p): np.asarray(features[p], dtype=dtype) for p in self.poolings}
        rows.update({"labels": np.asarray(labels, dtype=np.int64), "lengths": np.asarray(lengths, dtype=np.int64)})
        if "states" in self.row_arrays():
            rows["states"] = np.asarray(states, dtype=dtype)
        checks.check_finite(self, split, spans[0][0] if spans else 0, rows)
        at = np.cumsum([0] + [hi - lo for lo, hi in spans])  # each chunk's first row in the given arrays
        sums = np.array([[lay.crc(rows[name][at[i] : at[i + 1]], f"{split}/{name}/{c}") for name in self.row_arrays()]
                         for i, c in enumerate(chunks)], dtype=np.uint32).reshape(len(chunks), -1)
        runs = _runs(chunks)  # (first index, end index) into chunks, of consecutive chunk numbers
        try:
            for name, values in rows.items():
                for i, j in runs:
                    self._b.write_rows(f"{split}/{name}", spans[i][0], values[at[i] : at[j]])
            with self._flags_lock:
                for i, j in runs:
                    self._b.write_rows(f"{split}/checksums", chunks[i], sums[i:j])
                self._b.flush()
                self._check_lock()  # the writes above may have taken long: still ours before anything is marked
                for i, j in runs:
                    self._b.write_rows(f"{split}/done", chunks[i], np.ones(j - i, bool))
                self._b.flush()
                self._sums.pop(split, None)
                self._unreadable.pop(split, None)
        except Exception as err:  # noqa: BLE001 - ENOSPC, EIO, ... whatever the backend raises
            self._b.settle()
            if isinstance(err, ReservoirError):  # the lock lost: its own line
                raise
            spans_text = ", ".join(f"{chunks[i]}-{chunks[j - 1]}" if j - i > 1 else str(chunks[i]) for i, j in runs)
            which = f"chunk {chunks[0]}" if len(chunks) == 1 else f"chunks {spans_text}"
            raise ReservoirError(f"{self.path}: could not write {which} of split {split!r} "
                                 f"({cause(err)}); {'it is' if len(chunks) == 1 else 'they are'} not marked done: "
                                 "fix the cause (e.g. free disk space) and rerun the same command to resume") from err

    def _check_lock(self) -> None:
        """Refuse to write once the write lock is not ours any more (a lease lost, rank 0's lock gone, the lock file
        removed)."""
        check = getattr(self._lock, "check", None)
        if check is not None:
            check()

    def mark_complete(self) -> None:
        """Set ``complete`` after checking that every chunk of every split is done."""
        self._check_lock()
        for split in self.splits:
            done = self.done(split)
            if not done.all():
                raise ReservoirError(f"{self.path}: cannot mark complete: chunks {np.flatnonzero(~done)[:5].tolist()} "
                                     f"of split {split!r} are not written")
        self._check_lock()
        try:
            self._b.write_attrs({"complete": True})
            self._b.flush()
        except Exception as err:  # noqa: BLE001 - a full disk, a request that failed past its retries
            raise ReservoirError(f"{self.path}: could not mark the store complete ({cause(err)}); every chunk is "
                                 "written: rerun the same command to finish it") from err
        self.attrs["complete"] = True

    def discard(self) -> None:
        """Close and delete the store if it holds no written chunk, then release the lock.

        What a run that created the store calls when it fails before writing
        anything, so no empty store is left at the path.
        """
        try:
            self._check_lock()  # a lease lost: the store may be another writer's now
            written = any(self.done(s).any() for s in self.splits)
        except Exception:  # noqa: BLE001 - unreadable: leave it for the next run to refuse or repair
            written = True
        if self._backend is not None:
            close_quietly(self._backend)
        self._backend = None
        try:
            if not written:
                remove(self.path, ignore_errors=True)
        finally:
            if self._lock is not None:
                self._lock.release()

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

    def __enter__(self) -> "FeatureStore":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except ReservoirError:
            if exc_type is None:
                raise  # otherwise the error already in flight is the one to report


def _required_attrs(path: Path | StoreURL, attrs: Any) -> dict[str, Any]:
    """``attrs`` checked to hold what :meth:`FeatureStore.create` needs (one line naming what is missing)."""
    if not isinstance(attrs, dict):
        raise ReservoirError(f"{path}: expected attrs a dict of the store's settings, found {type(attrs).__name__}")
    required = [k for k in KEY_FIELDS if k not in ("schema", "compute_dtype")]
    missing = [k for k in required if k not in attrs]
    for outer, inner in (("backbone", "n_dim"), ("task", "label_shape"), ("pooling", "n_out_tokens")):
        if outer in attrs and not (isinstance(attrs[outer], dict) and inner in attrs[outer]):
            missing.append(f"{outer}.{inner}")
    if missing:
        raise ReservoirError(f"{path}: expected attrs with {', '.join(required)} (and backbone.n_dim, "
                             f"task.label_shape, pooling.n_out_tokens), found no {', '.join(missing)}")
    return dict(attrs)


def _state(url: StoreURL) -> str:
    """What lies at a store URL: ``none`` (no object), ``whole`` (a store of ours, created whole: its attributes,
    written last, are there), ``building`` (a creation of ours that stopped before them), or ``foreign``."""
    if not url.exists():
        return "none"
    if not url.has_metadata():
        return "foreign"
    try:
        backend = BACKENDS["zarr"](url, "r")
    except Exception:  # noqa: BLE001 - unreadable metadata: not ours to rebuild
        return "foreign"
    try:
        attrs = backend.read_attrs()
    finally:
        close_quietly(backend)
    if "attrs_crc32c" in attrs:
        return "whole"
    return "building" if attrs == lay.BUILDING else "foreign"


def _runs(chunks: list[int]) -> list[tuple[int, int]]:
    """``(i, j)`` index ranges of ``chunks`` whose numbers are consecutive.

    Examples
    --------
    >>> _runs([2, 3, 4, 7, 9, 10])
    [(0, 3), (3, 4), (4, 6)]
    """
    runs, i = [], 0
    for j in range(1, len(chunks) + 1):
        if j == len(chunks) or chunks[j] != chunks[j - 1] + 1:
            runs.append((i, j))
            i = j
    return runs
