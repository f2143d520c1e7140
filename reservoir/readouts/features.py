"""Reading one layer's features from a store, the way a readout sees them, and streaming them.

A depth-K readout reads layer K through the backbone's final norm (GPT-2's
``ln_f``; identity for post-LN models such as BERT), like Lu et al. Tables
11/12 when they keep the first K layers. Bit memory's ``n_out_tokens`` output
positions share one head, so they become rows.

Readouts that fit from a stream take a *chunk source*: a callable returning a
fresh iterable of ``(X_chunk, y_chunk)`` each time it is called (every pass over
the data calls it again), e.g. ``lambda: iter_layer(store, "train", 6)``. The
helpers below are what both readouts share: streamed moments, a validation
split by row index that does not depend on how rows are chunked, and label
checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from reservoir.errors import ReservoirError
from reservoir.store import FeatureStore

Chunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis, in float32."""
    x = x.astype(np.float32, copy=False)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def iter_layer(store: FeatureStore, split: str, layer: int, final_norm: bool = True,
               rows: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Features and labels of one split at one layer, ``rows`` store rows at a time.

    Non-finite features (NaN or inf, after the final norm) raise a
    ReservoirError naming the store, split and layer.

    Parameters
    ----------
    rows : int, optional
        Store rows per yielded chunk; default the store's chunk rows (a
        multiple of them reads each store chunk once).

    Yields
    ------
    X : ndarray, float32, ``(rows * n_out_tokens, n_dim)``
    y : ndarray, int64, ``(rows * n_out_tokens, *head_shape)``

    Examples
    --------
    >>> for X, y in iter_layer(FeatureStore.open("cache/xor.zarr"), "train", 2):  # doctest: +SKIP
    ...     print(X.shape, y.shape)
    """
    k = store.layer_index(layer)
    feats, labels = store.features(split), store.labels(split, lazy=True)
    norm = store.final_norm() if final_norm else None
    eps = float(store.attrs["backbone"]["final_norm_eps"]) if norm is not None else 0.0
    step = rows or store.chunk_rows(split)
    for lo in range(0, feats.shape[0], step):
        X = np.asarray(feats[lo: lo + step, k], dtype=np.float32)  # (r, n_out, n_dim)
        if norm is not None:
            X = layer_norm(X, norm["weight"], norm["bias"], eps)
        if not np.isfinite(X).all():
            where = f"split {split!r}, layer {layer}" + (" after the final norm" if norm is not None else "")
            raise ReservoirError(f"{store.path}: expected finite features; found NaN or inf in {where} (rows from "
                                 f"{lo}); extract again with --dtype float32 or a smaller --gain")
        y = np.asarray(labels[lo: lo + step])  # (r, *label_shape)
        r, n_out = X.shape[:2]
        if n_out > 1:
            y = y.reshape(r * n_out, *y.shape[2:])  # labels (r, n_out, bits) -> rows
        yield X.reshape(r * n_out, -1), y


def load_layer(store: FeatureStore, split: str, layer: int, final_norm: bool = True,
               chunk_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of one split at one layer (all of :func:`iter_layer`, concatenated).

    Returns
    -------
    X : ndarray, float32, ``(N * n_out_tokens, n_dim)``
    y : ndarray, int64, ``(N * n_out_tokens, *head_shape)``

    Examples
    --------
    >>> X, y = load_layer(FeatureStore.open("cache/xor.zarr"), "train", 2)  # doctest: +SKIP
    """
    parts = list(iter_layer(store, split, layer, final_norm, chunk_rows))
    if parts:
        return np.concatenate([X for X, _ in parts]), np.concatenate([y for _, y in parts])
    shape = store.features(split).shape  # (0, n_layers, n_out, n_dim)
    labels = store.labels(split)
    return np.zeros((0, shape[-1]), np.float32), labels.reshape(0, *labels.shape[1 + (shape[2] > 1):])


# -- streams of chunks, shared by the readouts --------------------------------
def chunk_source(chunks, name: str = "train_chunks") -> Chunks:
    """A callable giving a fresh iterable per pass, from a callable or a list of ``(X, y)``."""
    if callable(chunks):
        return chunks
    if isinstance(chunks, Iterator):
        raise TypeError(f"{name} must be a callable returning a fresh iterable of (X, y) chunks, or a list; "
                        f"got a one-shot {type(chunks).__name__} (the fit reads the chunks more than once)")
    return lambda: chunks


def checked_chunks(est, chunks: Chunks, first: bool = False, dtype=np.float32):
    """Yield ``(X, y)`` validated like ``fit`` input; ``first=True`` sets ``n_features_in_`` from chunk one."""
    head_shape = None
    for X, y in chunks():
        X, y = validate_data(est, X, y, reset=first, multi_output=True, dtype=dtype, y_numeric=False)
        check_classification_targets(y)
        if head_shape is not None and y.shape[1:] != head_shape:
            raise ValueError(f"every chunk's y must have shape (n, *{head_shape}); got a chunk with {y.shape}")
        head_shape, first = y.shape[1:], False
        yield X, y


def encode_labels(classes: np.ndarray, y, what: str = "validation labels") -> np.ndarray:
    """Class indices of ``y`` in ``classes``; a ``ValueError`` for labels outside them."""
    y = np.asarray(y)
    idx = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
    if not np.all(classes[idx] == y):
        raise ValueError(f"{what} must be among the training classes {classes.tolist()}")
    return idx


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def holdout_mask(start: int, n: int, fraction: float, seed: int) -> np.ndarray:
    """Which of the global rows ``start..start+n-1`` are held out for validation.

    A seeded hash of the row index (splitmix64), so the split is the same
    however the rows are chunked; about ``fraction`` of the rows are held out.
    """
    key = _splitmix64(np.array([seed % 2**64], dtype=np.uint64))
    z = _splitmix64(np.arange(start, start + n, dtype=np.uint64) ^ key)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53 < fraction  # (n,) bool


class Moments:
    """Streamed row count, mean and scatter of feature rows, in float64.

    Rows are shifted by a fixed vector (the first chunk's mean unless given)
    before accumulating, so features with large means (hidden states have a
    few huge dimensions) do not cancel catastrophically. Two ``Moments`` with
    the same shift add up with ``+``. ``full=False`` keeps only the diagonal.
    """

    def __init__(self, shift: np.ndarray | None = None, full: bool = True):
        self.shift, self.full, self.n = shift, full, 0
        self.s1 = self.sxx = None

    def update(self, X: np.ndarray) -> np.ndarray:
        """Add rows ``X (n, d)``; returns them shifted, float64 ``(n, d)``."""
        if self.shift is None:
            self.shift = X.astype(np.float64).mean(0) if len(X) else np.zeros(X.shape[1])
        Xs = X.astype(np.float64) - self.shift  # (n, d)
        sxx = Xs.T @ Xs if self.full else (Xs * Xs).sum(0)  # (d, d) or (d,)
        if self.s1 is None:
            self.s1, self.sxx = Xs.sum(0), sxx
        else:
            self.s1, self.sxx = self.s1 + Xs.sum(0), self.sxx + sxx
        self.n += len(X)
        return Xs

    def __add__(self, other: Moments) -> Moments:
        assert other.shift is self.shift or np.array_equal(other.shift, self.shift), "different shifts"
        if other.s1 is None:
            return self
        if self.s1 is None:
            return other
        out = Moments(self.shift, self.full)
        out.n, out.s1, out.sxx = self.n + other.n, self.s1 + other.s1, self.sxx + other.sxx
        return out

    @property
    def mean(self) -> np.ndarray:
        return self.shift + self.s1 / max(self.n, 1)  # (d,)

    def scatter(self) -> np.ndarray:
        """Centred ``Xcᵀ Xc`` ``(d, d)`` (its diagonal ``(d,)`` when ``full=False``)."""
        m = self.s1 / max(self.n, 1)
        return self.sxx - (np.outer(self.s1, m) if self.full else self.s1 * m)
