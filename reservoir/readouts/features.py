"""Reading one layer's features from a store, the way a readout sees them.

A depth-K readout reads layer K through the backbone's final norm (GPT-2's
``ln_f``; identity for post-LN models such as BERT), like Lu et al. Tables
11/12 when they keep the first K layers. Bit memory's ``n_out_tokens`` output
positions share one head, so they become rows. Every reader takes a
:class:`~reservoir.store.FeatureStore`; :func:`opened` lets a function take a
store or a path alike. What readouts do with the chunks read here (streamed
statistics, validation splits) is in :mod:`reservoir.readouts.stats`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.store import FeatureStore
from reservoir.store.remote import StoreURL


@contextlib.contextmanager
def opened(store: FeatureStore | StoreURL | str | os.PathLike) -> Iterator[FeatureStore]:
    """``store`` itself (left open: the caller owns it), or the store at a path, opened and then closed.

    Examples
    --------
    >>> with opened("cache/xor.zarr") as st:  # doctest: +SKIP
    ...     st.layers
    [0, 1, 2]
    """
    if isinstance(store, FeatureStore):
        yield store
    elif isinstance(store, (str, os.PathLike, StoreURL)):
        with FeatureStore.open(store) as st:
            yield st
    else:
        raise ReservoirError(f"expected a store: a path (.zarr or .h5), a store URL or a FeatureStore; found "
                             f"{options.shown(store)}")


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis, in float32."""
    x = x.astype(np.float32, copy=False)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis, in float32 (the weight is the scale applied: Gemma's ``1 + w`` already added)."""
    x = x.astype(np.float32, copy=False)
    return x / np.sqrt(np.square(x).mean(-1, keepdims=True) + eps) * weight


def apply_final_norm(x: np.ndarray, norm: dict[str, np.ndarray], backbone: dict) -> np.ndarray:
    """The store's final norm (its ``weight``/``bias`` arrays) applied as the backbone's ``attrs`` describe it."""
    eps = float(backbone["final_norm_eps"])
    if backbone.get("final_norm_kind") == "rms":
        return rms_norm(x, norm["weight"], eps)
    return layer_norm(x, norm["weight"], norm["bias"], eps)


def iter_layer(store: FeatureStore, split: str, layer: int, final_norm: bool = True,
               rows: int | None = None, pooling: str | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Features and labels of one split at one layer, ``rows`` store rows at a time.

    Non-finite features (NaN or inf, after the final norm) raise a
    ReservoirError naming the store, split and layer.

    Parameters
    ----------
    rows : int, optional
        Store rows per yielded chunk; default the store's chunk rows (a
        multiple of them reads each store chunk once).
    pooling : str, optional
        Which of the store's poolings (``last``, ``first``, ``mean``); default
        its first.

    Yields
    ------
    X : ndarray, float32, ``(rows * n_out_tokens, n_dim)``
    y : ndarray, int64, ``(rows * n_out_tokens, *head_shape)``

    Examples
    --------
    >>> for X, y in iter_layer(FeatureStore.open("cache/xor.zarr"), "train", 2):  # doctest: +SKIP
    ...     print(X.shape, y.shape)
    """
    if rows is not None and not (options.is_int(rows) and rows >= 1):
        raise ReservoirError(f"expected the rows read at a time (chunk_rows) to be an integer >= 1; found {rows!r}")
    k = store.layer_index(layer)
    feats, labels = store.features(split, pooling), store.labels(split, lazy=True)
    norm = store.final_norm() if final_norm else None
    step = rows or store.chunk_rows(split)
    for lo in range(0, feats.shape[0], step):
        X = np.asarray(feats[lo: lo + step, k], dtype=np.float32)  # (r, n_out, n_dim)
        if norm is not None:
            X = apply_final_norm(X, norm, store.attrs["backbone"])
        if not np.isfinite(X).all():
            where = f"split {split!r}, layer {layer}" + (" after the final norm" if norm is not None else "")
            raise ReservoirError(f"{store.path}: expected finite features; found NaN or inf in {where} (rows from "
                                 f"{lo}); extract again with --dtype float32 or a smaller --gain")
        y = np.asarray(labels[lo: lo + step])  # (r, *label_shape)
        r, n_out = X.shape[:2]
        if n_out > 1:
            y = y.reshape(r * n_out, *y.shape[2:])  # labels (r, n_out, bits) -> rows
        yield X.reshape(r * n_out, -1), y


#: Stored bytes read per call of :func:`read_layers` (whole store chunks; the store reads them concurrently).
READ_BYTES = 64 * 1024**2


def read_layers(store: FeatureStore, split: str, layers: list[int], final_norm: bool = True,
                pooling: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features of several layers of one split and their labels, reading each store chunk once.

    What :func:`load_layer` gives for each layer, stacked: a depth sweep reads
    the store once instead of once per layer (a chunk holds every layer of its
    rows). Non-finite features raise a ReservoirError naming the store, split
    and layer.

    Returns
    -------
    X : ndarray, float32, ``(len(layers), N * n_out_tokens, n_dim)``
    y : ndarray, int64, ``(N * n_out_tokens, *head_shape)``

    Examples
    --------
    >>> X, y = read_layers(FeatureStore.open("cache/xor.zarr"), "train", [0, 2])  # doctest: +SKIP
    >>> X.shape                                                                  # doctest: +SKIP
    (2, 4000, 32)
    """
    idx = [store.layer_index(k) for k in layers]
    feats = store.features(split, pooling)
    n, _, n_out, d = feats.shape
    norm = store.final_norm() if final_norm else None
    X = np.empty((len(layers), n * n_out, d), np.float32)
    chunk = store.chunk_rows(split)
    chunk_bytes = chunk * int(np.prod(feats.shape[1:])) * feats.dtype.itemsize  # as stored
    step = chunk * max(1, READ_BYTES // max(chunk_bytes, 1))  # whole chunks per read
    for lo in range(0, n, step):
        block = np.asarray(feats[lo: lo + step])  # (r, n_stored_layers, n_out, d): many chunks, read once
        r = len(block)
        for i, (k, j) in enumerate(zip(layers, idx)):
            out = X[i, lo * n_out: (lo + r) * n_out]  # (r * n_out, d), filled in place
            out[...] = block[:, j].reshape(r * n_out, d)  # the cast to float32 in the same pass
            if norm is not None:
                out[...] = apply_final_norm(out, norm, store.attrs["backbone"])
            if not np.isfinite(out).all():
                where = f"split {split!r}, layer {k}" + (" after the final norm" if norm is not None else "")
                raise ReservoirError(f"{store.path}: expected finite features; found NaN or inf in {where} (rows "
                                     f"from {lo}); extract again with --dtype float32 or a smaller --gain")
    labels = store.labels(split)  # (N, *label_shape)
    if n_out > 1:
        labels = labels.reshape(n * n_out, *labels.shape[2:])  # labels (N, n_out, bits) -> rows
    return X, labels


def load_layer(store: FeatureStore | str | os.PathLike, split: str, layer: int, final_norm: bool = True,
               chunk_rows: int | None = None, pooling: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of one split at one layer (all of :func:`iter_layer`, concatenated).

    Parameters
    ----------
    store : FeatureStore or path
        An open store (left open), or a store's path or URL (opened and closed here).
    split : str
        ``train``, ``val`` or ``test``.
    layer : int
        A layer the store holds (``store.layers``).
    final_norm : bool
        Apply the backbone's final norm, as the readouts do (the store keeps raw layer features).
    chunk_rows : int, optional
        Rows read at a time.
    pooling : str, optional
        One of the store's poolings (``last``, ``first``, ``mean``); default its first.

    Returns
    -------
    X : ndarray, float32, ``(N * n_out_tokens, n_dim)``
    y : ndarray, int64, ``(N * n_out_tokens, *head_shape)``

    Examples
    --------
    >>> X, y = load_layer("cache/xor.zarr", "train", 2)  # doctest: +SKIP
    """
    with opened(store) as st:
        parts = list(iter_layer(st, split, layer, final_norm, chunk_rows, pooling))
        if parts:
            return np.concatenate([X for X, _ in parts]), np.concatenate([y for _, y in parts])
        shape = st.features(split, pooling).shape  # (0, n_layers, n_out, n_dim)
        labels = st.labels(split)
        return np.zeros((0, shape[-1]), np.float32), labels.reshape(0, *labels.shape[1 + (shape[2] > 1):])


def layer_bytes(store: FeatureStore, split: str) -> int:
    """Bytes of one layer of ``split`` as float32 ``(N * n_out_tokens, n_dim)`` (reads no data)."""
    n, _, n_out, d = store.features(split).shape
    return int(n) * int(n_out) * int(d) * 4
