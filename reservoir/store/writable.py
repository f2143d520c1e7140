"""A feature store open for writing: created (or reopened and repaired) under its write lock, written chunk by
chunk, marked complete last.

:class:`WritableStore` is a :class:`~reservoir.store.FeatureStore` that holds
the store's write lock (:mod:`reservoir.store.lock`; a lease on object
storage): everything a reader has, plus :meth:`WritableStore.write_chunks`,
:meth:`WritableStore.mark_complete` and what a writer does to a store it
reopens (make its missing arrays again, mark its damaged chunks unwritten).
What the layout is and what it guarantees is in
:mod:`reservoir.store.feature_store`.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import settings
from reservoir.errors import ReservoirError
from reservoir.io import fsync_dir
from reservoir.store import checks
from reservoir.store import layout as lay
from reservoir.store import lock as locks
from reservoir.store.backends import BACKENDS, Backend, remove_partial_chunks
from reservoir.store.formats import Format, detect_format
from reservoir.store.feature_store import KEY_FIELDS, FeatureStore, first_difference, store_key
from reservoir.store.files import build, cause, close_quietly, create_array, remove, remove_temporaries, store_path
from reservoir.store.remote import StoreURL


class WritableStore(FeatureStore):
    """A store open for writing, holding its write lock until closed: made by :meth:`create` (or, for the other
    ranks of a sharded job, opened under rank 0's lock).

    Examples
    --------
    >>> with WritableStore.create("x.zarr", attrs, {"train": (10, ())}, (2, 1, 3), weight) as st:  # doctest: +SKIP
    ...     st.write_chunk("train", 0, features, labels, lengths)
    ...     st.mark_complete()
    """

    def __init__(self, backend: Backend, fmt: Format, lock: locks.StoreLock | locks.SharedLock | None = None):
        super().__init__(backend, fmt, lock)
        # write_chunks may run on several threads (disjoint chunks); the checksums and done flags of many chunks
        # share a backend chunk, so their read-modify-write is one thread's at a time
        self._flags_lock = threading.Lock()

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
    ) -> "WritableStore":
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
            raise ReservoirError(f"{self.path}: opened without the write lock; write through WritableStore.create")
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


def _required_attrs(path: Path | StoreURL, attrs: Any) -> dict[str, Any]:
    """``attrs`` checked to hold what :meth:`WritableStore.create` needs (one line naming what is missing)."""
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
