"""The feature store: one layout over Zarr (v3) and HDF5.

Layout (same names in both backends)::

    attrs: schema, reservoir_version, complete, created,
           backbone{...}, projection{...}, task{...}, layers, pooling{...}, dtype
    projection/weight          (d_in, n_dim)
    final_norm/weight, bias    (n_dim,)           when the backbone has one
    {split}/features           (N, n_layers, n_out_tokens, n_dim)
    {split}/labels             (N, ...)
    {split}/lengths            (N,)               real length of each sequence
    {split}/done               (n_chunks,) bool   which row chunks are fully written
    {split}/states             (N, L, n_dim)      split-point stores only: every position at
                                                  layer ``full_seq_layer``, zero past the length

Rows are chunked (at least ~1 MiB of features per chunk). A chunk's ``done``
flag is set only after its features and labels are written, so an interrupted
extraction resumes where it stopped; ``complete`` is set last. The settings that
shape the features (:data:`KEY_FIELDS`) are the store's key: reopening it with
other settings is refused, naming the first differing field.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reservoir import __version__
from reservoir.errors import ReservoirError

SCHEMA = "reservoir.features/1"
#: Attributes that shape the features; a store is refused if any differs.
KEY_FIELDS = ("schema", "backbone", "projection", "task", "layers", "pooling", "dtype", "full_seq_layer")
MIN_CHUNK_BYTES = 1 << 20
Format = Literal["zarr", "hdf5"]


def detect_format(path: str | os.PathLike, fmt: str | None = None) -> Format:
    """Backend from an explicit choice, an existing store, or the suffix (``.zarr`` / ``.h5``)."""
    if fmt is not None:
        if fmt not in ("zarr", "hdf5"):
            raise ReservoirError(f"unknown store format {fmt!r}; expected zarr or hdf5")
        return fmt  # type: ignore[return-value]
    p = Path(path)
    if p.is_dir():
        return "zarr"
    if p.is_file():
        with open(p, "rb") as f:
            if f.read(8) == b"\x89HDF\r\n\x1a\n":
                return "hdf5"
        raise ReservoirError(f"{p}: expected a reservoir feature store (Zarr folder or HDF5 file), found another file")
    return "hdf5" if p.suffix.lower() in (".h5", ".hdf5", ".hdf") else "zarr"


def rows_per_chunk(row_bytes: int, n_rows: int) -> int:
    """Rows per chunk so that a chunk holds at least :data:`MIN_CHUNK_BYTES`."""
    return max(1, min(max(n_rows, 1), math.ceil(MIN_CHUNK_BYTES / max(row_bytes, 1))))


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: d}


def first_difference(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key field (dotted, e.g. ``backbone.init``) whose values differ."""
    for field in KEY_FIELDS:
        a, b = _flat(old.get(field), field), _flat(new.get(field), field)
        for k in [*b, *(k for k in a if k not in b)]:  # the new settings' order: task.params before fingerprint
            if a.get(k) != b.get(k):
                return k, a.get(k), b.get(k)
    return None


class _Backend:
    """Minimal per-backend operations; arrays returned support numpy slicing."""

    def __init__(self, path: Path, mode: str):
        self.path = path
        self.mode = mode

    # attrs are JSON-serializable dicts; HDF5 keeps each as a JSON string.
    def read_attrs(self) -> dict[str, Any]: ...
    def write_attrs(self, attrs: dict[str, Any]) -> None: ...
    def array(self, name: str): ...
    def create(self, name: str, shape, dtype, chunk_rows: int): ...
    def has(self, name: str) -> bool: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class _ZarrBackend(_Backend):
    def __init__(self, path: Path, mode: str):
        super().__init__(path, mode)
        import zarr

        self.root = zarr.open_group(str(path), mode=mode, zarr_format=3)

    def read_attrs(self):
        return dict(self.root.attrs)

    def write_attrs(self, attrs):
        self.root.attrs.update(attrs)

    def array(self, name):
        return self.root[name]

    def has(self, name):
        return name in self.root

    def create(self, name, shape, dtype, chunk_rows):
        chunks = (chunk_rows, *shape[1:]) if shape else ()
        return self.root.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=0)

    def flush(self):
        pass

    def close(self):
        pass


class _H5Backend(_Backend):
    def __init__(self, path: Path, mode: str):
        super().__init__(path, mode)
        import h5py

        self.file = h5py.File(path, {"r": "r", "r+": "r+", "w": "w"}[mode])

    def read_attrs(self):
        return {k: json.loads(v) for k, v in self.file.attrs.items()}

    def write_attrs(self, attrs):
        for k, v in attrs.items():
            self.file.attrs[k] = json.dumps(v)

    def array(self, name):
        return self.file[name]

    def has(self, name):
        return name in self.file

    def create(self, name, shape, dtype, chunk_rows):
        chunks = (chunk_rows, *shape[1:]) if shape and shape[0] else None
        return self.file.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, fillvalue=0)

    def flush(self):
        self.file.flush()

    def close(self):
        self.file.close()


_BACKENDS = {"zarr": _ZarrBackend, "hdf5": _H5Backend}


class FeatureStore:
    """A feature store on disk (Zarr folder or HDF5 file).

    Use :meth:`open` to read an existing store and :meth:`create` to start (or
    resume) writing one. Usable as a context manager.

    Examples
    --------
    >>> store = FeatureStore.open("cache/bit-xor-tiny.zarr")      # doctest: +SKIP
    >>> store.splits, store.layers, store.features("test").shape  # doctest: +SKIP
    (['train', 'test'], [0, 1, 2], (1000, 3, 1, 32))
    """

    def __init__(self, backend: _Backend, fmt: Format):
        self._b = backend
        self.format = fmt
        self.path = backend.path
        self.attrs = backend.read_attrs()

    # -- opening -----------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> "FeatureStore":
        """Open an existing store; refuses anything that is not one of ours."""
        p = Path(path)
        if not p.exists():
            raise ReservoirError(f"{p}: expected a feature store, found no such file or folder")
        fmt = detect_format(p)
        try:
            backend = _BACKENDS[fmt](p, mode)
        except Exception as err:  # noqa: BLE001 - any library error is a bad store
            raise ReservoirError(f"{p}: expected a readable {fmt} feature store, found: {err}") from err
        store = cls(backend, fmt)
        schema = store.attrs.get("schema")
        if schema != SCHEMA:
            store.close()
            raise ReservoirError(f"{p}: expected a store of schema {SCHEMA!r}, found schema {schema!r}")
        return store

    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        attrs: dict[str, Any],
        splits: dict[str, tuple[int, tuple[int, ...]]],
        feature_shape: tuple[int, int, int],
        projection_weight: np.ndarray,
        final_norm: dict[str, np.ndarray] | None = None,
        fmt: str | None = None,
        states_length: int | None = None,
    ) -> "FeatureStore":
        """Create a store, or reopen one written with identical settings to resume it.

        Parameters
        ----------
        attrs : dict
            Must contain every :data:`KEY_FIELDS` entry except ``schema``.
        splits : dict
            ``split -> (n_rows, label_shape)``.
        feature_shape : tuple
            ``(n_layers, n_out_tokens, n_dim)``.
        states_length : int, optional
            Sequence length of the full-sequence states of a split-point store.
        """
        p = Path(path)
        fmt = detect_format(p, fmt)
        key = {"schema": SCHEMA, **{k: attrs[k] for k in KEY_FIELDS if k != "schema"}}
        if p.exists():
            store = cls.open(p, mode="r+")
            diff = first_difference(store.attrs, key)
            if diff is not None:
                store.close()
                field, old, new = diff
                raise ReservoirError(
                    f"{p} was written with {field}={old!r}, this run has {new!r}; "
                    "pass another --out or delete the store"
                )
            return store
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            backend = _BACKENDS[fmt](p, "w")
        except OSError as err:
            raise ReservoirError(f"{p}: expected a writable output path, found: {err.strerror or err}") from err
        try:
            dtype = np.dtype(attrs["dtype"])
            backend.write_attrs(
                {
                    **attrs,
                    **key,
                    "reservoir_version": __version__,
                    "complete": False,
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
            )
            w = backend.create("projection/weight", projection_weight.shape, "float32", projection_weight.shape[0])
            w[...] = projection_weight
            for name, arr in (final_norm or {}).items():
                backend.create(f"final_norm/{name}", arr.shape, "float32", arr.shape[0])[...] = arr
            n_dim = feature_shape[-1]
            row_bytes = (int(np.prod(feature_shape)) + (states_length or 0) * n_dim) * dtype.itemsize
            for split, (n, label_shape) in splits.items():
                r = rows_per_chunk(row_bytes, n)
                backend.create(f"{split}/features", (n, *feature_shape), dtype, r)
                backend.create(f"{split}/labels", (n, *label_shape), "int64", r)
                backend.create(f"{split}/lengths", (n,), "int64", r)
                backend.create(f"{split}/done", (math.ceil(n / r),), "bool", 1)
                if states_length is not None:
                    backend.create(f"{split}/states", (n, states_length, n_dim), dtype, r)
            backend.write_attrs({"splits": list(splits),
                                 "chunk_rows": {s: rows_per_chunk(row_bytes, n) for s, (n, _) in splits.items()}})
            backend.flush()
        except BaseException:
            backend.close()
            remove(p)
            raise
        return cls(backend, fmt)

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

    def chunk_rows(self, split: str) -> int:
        return int(self.attrs["chunk_rows"][split])

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ReservoirError(f"{self.path}: expected a split among {self.splits}, found {split!r}")

    def features(self, split: str):
        """``(N, n_layers, n_out_tokens, n_dim)`` array (lazy; slice it)."""
        self._check_split(split)
        return self._b.array(f"{split}/features")

    def labels(self, split: str, lazy: bool = False):
        """``(N, ...)`` labels; ``lazy=True`` gives the store array to slice instead of loading it."""
        self._check_split(split)
        arr = self._b.array(f"{split}/labels")
        return arr if lazy else np.asarray(arr[...])

    def lengths(self, split: str) -> np.ndarray:
        self._check_split(split)
        return np.asarray(self._b.array(f"{split}/lengths")[...])

    @property
    def full_seq_layer(self) -> int | None:
        return self.attrs.get("full_seq_layer")

    def states(self, split: str):
        """``(N, L, n_dim)`` layer-``full_seq_layer`` states of a split-point store (lazy)."""
        self._check_split(split)
        if self.full_seq_layer is None:
            raise ReservoirError(f"{self.path}: expected a split-point store (extract --full-seq-layer S), "
                                 "found one without full-sequence states")
        return self._b.array(f"{split}/states")

    def done(self, split: str) -> np.ndarray:
        self._check_split(split)
        return np.asarray(self._b.array(f"{split}/done")[...], dtype=bool)

    def projection_weight(self) -> np.ndarray:
        return np.asarray(self._b.array("projection/weight")[...])

    def final_norm(self) -> dict[str, np.ndarray] | None:
        if not self._b.has("final_norm"):
            return None
        return {k: np.asarray(self._b.array(f"final_norm/{k}")[...]) for k in ("weight", "bias")}

    def layer_index(self, layer: int) -> int:
        """Position of ``layer`` along the store's layer axis."""
        if layer not in self.layers:
            raise ReservoirError(f"{self.path}: expected a layer among {self.layers}, found {layer}")
        return self.layers.index(layer)

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the features: the key fields plus the version that wrote them."""
        return {k: self.attrs.get(k) for k in (*KEY_FIELDS, "reservoir_version", "created")}

    # -- writing -----------------------------------------------------------
    def write_chunk(self, split: str, chunk: int, features: np.ndarray, labels: np.ndarray,
                    lengths: np.ndarray | None = None, states: np.ndarray | None = None) -> None:
        """Write rows of one chunk, then mark it done."""
        r = self.chunk_rows(split)
        lo = chunk * r
        hi = lo + len(features)
        self._b.array(f"{split}/features")[lo:hi] = features
        self._b.array(f"{split}/labels")[lo:hi] = labels
        if lengths is not None:
            self._b.array(f"{split}/lengths")[lo:hi] = lengths
        if states is not None:
            self._b.array(f"{split}/states")[lo:hi] = states
        self._b.flush()
        self._b.array(f"{split}/done")[chunk] = True
        self._b.flush()

    def mark_complete(self) -> None:
        """Set ``complete`` after checking that every chunk of every split is done."""
        for split in self.splits:
            done = self.done(split)
            assert done.all(), f"{split}: chunks {np.flatnonzero(~done)[:5].tolist()} not written"
        self.attrs["complete"] = True
        self._b.write_attrs({"complete": True})
        self._b.flush()

    def close(self) -> None:
        self._b.close()

    def __enter__(self) -> "FeatureStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def remove(path: str | os.PathLike) -> None:
    """Delete a store (folder or file) if it exists."""
    p = Path(path)
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()
