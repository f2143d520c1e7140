"""What keeps a store from lying: its layout, per-chunk checksums, and arrays that check what they return.

Every written chunk records a CRC32C of its rows in each row array
(``features``, ``labels``, ``lengths`` and, in split-point stores, ``states``)
in ``{split}/checksums`` before its ``done`` flag is set. Readers get
:class:`CheckedArray` views: the first read of a chunk reads the chunk whole
and compares its checksum, so a deleted chunk (Zarr reads it as zeros), a
truncated one or one edited on disk is refused in one line, never returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.store.layout import (  # noqa: F401 - re-exported: what a store's layout is
    ALGORITHM,
    MUTABLE_ATTRS,
    attrs_crc,
    crc,
    feature_array,
    finite_along,
    layout,
    pooling_attrs,
    poolings,
    row_arrays,
)

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.store.feature_store import FeatureStore

def check_layout(store: FeatureStore, missing_ok: bool = False) -> list[str]:
    """Refuse (one line) a store whose arrays are missing, unreadable, or not the recorded shape and dtype.

    With ``missing_ok``, arrays that are absent altogether (not unreadable) are returned instead of refused: a
    store reopened to be written makes them again."""
    a = store.attrs
    if a.get("attrs_crc32c") != attrs_crc(a) or not isinstance(a.get("complete"), bool):
        raise ReservoirError(f"{store.path}: damaged store: its attributes were changed after it was created "
                             "(they no longer match their checksum); delete it and extract again")
    expected = a.get("arrays")
    if not isinstance(expected, dict):
        raise ReservoirError(f"{store.path}: damaged store: its attributes lack the array layout; "
                             "delete it and extract again")
    escape = store.escape(list(expected))
    if escape is not None:  # never read through, and never repaired into
        raise ReservoirError(f"{store.path}: damaged store: {escape}, reaching outside the store; delete it and "
                             "extract again")
    missing = []
    for name, spec in expected.items():
        try:
            arr = store.backend_array(name)
            shape, dtype = list(arr.shape), str(np.dtype(arr.dtype))
        except Exception as err:  # noqa: BLE001 - a missing or garbled array, whatever the library says
            if missing_ok and not store.backend_has(name):
                missing.append(name)
                continue
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ReservoirError(f"{store.path}: damaged store: array {name} is missing or unreadable ({reason}); "
                                 "rerun the extract command that wrote it (it makes a missing array again), or "
                                 "delete it and extract again") from None
        if shape != spec["shape"] or dtype != spec["dtype"]:
            raise ReservoirError(f"{store.path}: damaged store: array {name} is {dtype} {tuple(shape)}, expected "
                                 f"{spec['dtype']} {tuple(spec['shape'])}; delete it and extract again")
    _check_attrs_agree(store, expected)
    return missing


def _check_attrs_agree(store: FeatureStore, arrays: dict[str, dict]) -> None:
    """Refuse a store whose attributes (layers, pooling, width, label shape, chunking) contradict its arrays."""
    a = store.attrs
    try:
        row = (len(a["layers"]), int(a["pooling"]["n_out_tokens"]), int(a["backbone"]["n_dim"]))
        label = tuple(a["task"]["label_shape"])
        feats = {feature_array(p): row for p in poolings(a)}
        wanted = {split: {**feats, "labels": label, "lengths": (),
                          "done": (-(-arrays[f"{split}/lengths"]["shape"][0] // int(a["chunk_rows"][split])),)}
                  for split in a["splits"]}
    except (KeyError, TypeError, ValueError) as err:
        raise ReservoirError(f"{store.path}: damaged store: its attributes lack {err} or hold the wrong type; "
                             "delete it and extract again") from None
    for split, names in wanted.items():
        for name, tail in names.items():
            shape = tuple(arrays[f"{split}/{name}"]["shape"])
            found = shape if name == "done" else shape[1:]
            if found != tail:
                raise ReservoirError(f"{store.path}: damaged store: {split}/{name} has shape {shape}, which its "
                                     "attributes (layers, pooling, backbone width, label shape, chunk rows) "
                                     "contradict; delete it and extract again")


class Damaged(ReservoirError):
    """A chunk or array of a store that does not read back as written; ``reason`` says how."""

    def __init__(self, store: FeatureStore, reason: str):
        self.reason = reason
        super().__init__(f"{store.path}: damaged store: {reason}; rerun the extract command that wrote it to "
                         "re-extract the damaged chunks (`reservoir info --verify` lists them)")


def _rows(key, n: int) -> tuple[int, int] | np.ndarray:
    """The rows a key's first index selects: ``(lo, hi)`` for a unit-step range, else an index array (in bounds;
    an index numpy would refuse is refused as numpy refuses it, with an ``IndexError`` or ``TypeError``)."""
    if key is Ellipsis:
        return 0, n
    if isinstance(key, slice):
        lo, hi, step = key.indices(n)
        return (lo, max(lo, hi)) if step == 1 else np.arange(lo, hi, step)
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        i = int(key) + (n if key < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"index {int(key)} is out of bounds for axis 0 with size {n}")
        return i, i + 1
    idx = np.asarray(key)
    if idx.size == 0 and not isinstance(key, np.ndarray):  # [] selects no rows (numpy reads it as integers)
        idx = idx.astype(np.intp)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise IndexError(f"boolean index of shape {idx.shape} does not match the rows' axis of size {n}")
        return np.flatnonzero(idx)
    if idx.dtype.kind not in "iu":
        found = f"an array of {idx.dtype}" if isinstance(key, np.ndarray) else repr(key)
        raise TypeError(f"expected rows selected by an int, a slice, or an integer or boolean array; found {found}")
    rows = np.where(idx < 0, idx + n, idx)
    bad = (rows < 0) | (rows >= n)
    if bad.any():
        raise IndexError(f"index {int(idx[bad].flat[0])} is out of bounds for axis 0 with size {n}")
    return rows


class CheckedArray:
    """A row array of a store whose chunks are checked against their checksums before rows are returned.

    Supports what readers use: ``shape``, ``dtype``, ``len`` and numpy
    indexing whose first index selects rows (an int, a slice of any step, an
    integer or boolean array, in any order). A chunk is read whole and checked
    the first time any of its rows is read; rows picked out of several chunks
    are taken from the checked chunks, so a backend's own limits on indexing
    (HDF5's increasing indices, Zarr's positive steps) never apply.
    """

    def __init__(self, store: FeatureStore, split: str, name: str):
        self._store, self._split, self._name = store, split, name
        arr = store.backend_array(f"{split}/{name}")
        self.shape = tuple(arr.shape)
        self.dtype = np.dtype(arr.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self[...], dtype=dtype)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if not key:
            key = (Ellipsis,)
        if key[0] is Ellipsis and len(key) > 1:
            key = (slice(None), *key)  # rows first
        if key[0] is None:
            raise TypeError("expected rows selected by an int, a slice, or an integer or boolean array; found None "
                            "(np.newaxis) first")
        n, r = self.shape[0], self._store.chunk_rows(self._split)
        rows = _rows(key[0], n)
        if isinstance(rows, tuple):
            lo, hi = rows
            if hi <= lo:  # no rows: nothing to read
                return np.empty((0, *self.shape[1:]), self.dtype)[(slice(None), *key[1:])]
            c0, c1 = lo // r, (hi - 1) // r + 1
            block = self._store.read_chunks(self._split, self._name, c0, c1)  # checked
            inner = (slice(lo - c0 * r, hi - c0 * r), *key[1:]) if not isinstance(key[0], (int, np.integer)) \
                else (lo - c0 * r, *key[1:])
            return block[inner]
        wanted, where = np.unique(rows, return_inverse=True)  # each row once; where: its place among them
        picked = np.empty((len(wanted), *self.shape[1:]), self.dtype)  # (k, ...) the wanted rows, in order
        chunk = wanted // r
        for c in np.unique(chunk):
            block = self._store.read_chunks(self._split, self._name, int(c), int(c) + 1)  # checked
            sel = chunk == c
            picked[sel] = block[wanted[sel] - int(c) * r]
        if isinstance(key[0], slice):  # rows kept as a slice keeps numpy's placement of the other indices
            return picked[where][(slice(None), *key[1:])]
        return picked[(where.reshape(np.shape(rows)), *key[1:])]


def verify(store: FeatureStore, progress: bool = False) -> dict[str, dict[int, str]]:
    """Check every written chunk of every row array; ``{split: {chunk: reason}}`` for the damaged ones."""
    from tqdm.auto import tqdm

    bad: dict[str, dict[int, str]] = {}
    total = sum(store.shape(s, "done")[0] for s in store.splits)
    with tqdm(total=total, desc="verify", unit="chunks", disable=None if progress else True, dynamic_ncols=True) as bar:
        for split in store.splits:
            bad[split] = {}
            n_chunks = store.shape(split, "done")[0]
            try:
                done, _ = store.done_and_sums(split)
            except Damaged as err:
                bad[split] = dict.fromkeys(range(n_chunks), err.reason)
                bar.update(n_chunks)
                continue
            if store.complete:  # a complete store has every chunk done: a cleared flag is damage
                bad[split].update(dict.fromkeys(map(int, np.flatnonzero(~done)), "marked unwritten in a complete store"))
            bad[split].update(store.unreadable_flags(split))  # a garbled flag or checksum file: its chunk alone
            for c in np.flatnonzero(done):
                for name in store.row_arrays():
                    try:
                        store.read_chunks(split, name, int(c), int(c) + 1)
                    except Damaged as err:
                        bad[split][int(c)] = err.reason
                        break
                bar.update(1)
            bar.update(n_chunks - int(done.sum()))
    return {s: b for s, b in bad.items() if b}


def check_finite(store: FeatureStore, split: str, lo: int, rows: dict[str, np.ndarray]) -> None:
    """Refuse (one line) a chunk's rows holding NaN or inf, naming the first such layer (or the states)."""
    where = None
    if "states" in rows and not finite_along(rows["states"]).all():
        where = f"the layer-{store.full_seq_layer} states"
    for pooling in store.poolings:
        feats = rows[feature_array(pooling)]  # (r, n_layers, n_out, n_dim)
        ok = finite_along(feats, axis=1)  # (n_layers,)
        if where is None and not ok.all():
            where = f"layer {store.layers[int(np.flatnonzero(~ok)[0])]}" + ("" if pooling == "last" else
                                                                            f" ({pooling} pooling)")
    if where is None:
        return
    raise ReservoirError(f"{store.path}: non-finite values (NaN or inf) in {where} of split {split!r} "
                         f"(rows from {lo}); nothing stored: extract with --dtype float32 "
                         "(float16 overflows above 65504) or a smaller --gain")


def verify_fixed(store: FeatureStore) -> dict[str, str]:
    """The fixed arrays (projection, final norm) that do not read back as written: ``{name: reason}``."""
    bad = {}
    for name in store.attrs["checksums"]["fixed"]:
        try:
            store.read_fixed(name)
        except Damaged as err:
            bad[name] = err.reason
    return bad
