"""Reading one layer's features from a store, the way a readout sees them.

A depth-K readout reads layer K through the backbone's final norm (GPT-2's
``ln_f``; identity for post-LN models such as BERT), like Lu et al. Tables
11/12 when they keep the first K layers. Bit memory's ``n_out_tokens`` output
positions share one head, so they become rows.
"""

from __future__ import annotations

import numpy as np

from reservoir.store import FeatureStore


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis, in float32."""
    x = x.astype(np.float32, copy=False)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def load_layer(store: FeatureStore, split: str, layer: int, final_norm: bool = True,
               chunk_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of one split at one layer.

    Returns
    -------
    X : ndarray, float32, ``(N * n_out_tokens, n_dim)``
    y : ndarray, int64, ``(N * n_out_tokens, *head_shape)``

    Examples
    --------
    >>> X, y = load_layer(FeatureStore.open("cache/xor.zarr"), "train", 2)  # doctest: +SKIP
    """
    k = store.layer_index(layer)
    feats = store.features(split)
    n = feats.shape[0]
    step = chunk_rows or store.chunk_rows(split)
    X = np.concatenate([np.asarray(feats[lo: lo + step, k], dtype=np.float32) for lo in range(0, n, step)]) \
        if n else np.zeros((0, *feats.shape[2:]), np.float32)  # (N, n_out, n_dim)
    norm = store.final_norm() if final_norm else None
    if norm is not None:
        X = layer_norm(X, norm["weight"], norm["bias"], float(store.attrs["backbone"]["final_norm_eps"]))
    y = store.labels(split)
    n_out = X.shape[1]
    if n_out > 1:
        y = y.reshape(n * n_out, *y.shape[2:])  # labels (N, n_out, bits) -> rows
    return X.reshape(n * n_out, -1), y
