"""The sweep engine behind ``fit-linear``: every asked layer of a store read once, each fitted over its L2 path.

A store chunk holds every layer of its rows, so the layers of a sweep are read
together (:func:`~reservoir.readouts.features.read_layers`): as many layers at
a time as fit in :data:`SWEEP_BYTES` of float32 features, one read of the
store per group. Each layer is then fitted with its readout (the logistic
readout fits its whole L2 path as one batched problem on a subsample and the
chosen strength on all rows; the ridge readout its path from one
eigendecomposition), scored on the full test split row by row, and given 95%
intervals (:mod:`reservoir.readouts.intervals`). With ``train_sizes`` the same
layer is also fitted on nested, seeded subsets of the training rows (a
learning curve). A layer too large for memory is fitted from store chunks
(``streamed``), every pass reading the store again.

What a layer's fit produced is a :class:`LayerFit`; :func:`reservoir.readouts.fit_linear`
turns it into a :class:`~reservoir.readouts.FitResult`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.readouts.features import iter_layer, layer_bytes, read_layers
from reservoir.readouts.intervals import accuracy_metrics
from reservoir.readouts.logistic import LogisticReadout
from reservoir.readouts.ridge import RidgeReadout
from reservoir.store import FeatureStore

#: Float32 bytes of features (all splits) read into memory at once; more layers are read in groups.
SWEEP_BYTES = 4 * 1024**3
#: Bytes (float32) of features per chunk when streaming, rounded to whole store chunks.
STREAM_CHUNK_BYTES = 64 * 1024**2


def make_readout(kind: str, seed: int, device: str, **kwargs) -> LogisticReadout | RidgeReadout:
    """The ``kind`` readout, seeded; ``device`` and ``kwargs`` go to the logistic one (ridge runs in numpy)."""
    if kind == "logistic":
        return LogisticReadout(random_state=seed, device=device, **kwargs)
    return RidgeReadout(random_state=seed)


def store_readout(store: FeatureStore, kind: str, seed: int, device: str) -> LogisticReadout | RidgeReadout:
    """The readout for a store's features: a row's output tokens are one example to its validation split
    (``group_rows``); the ridge one is told the stored dtype's precision, so it takes its statistics in float32
    where float16 rounding dwarfs float32's."""
    group = store.n_out_tokens
    if kind == "logistic":
        return make_readout(kind, seed, device, group_rows=group)
    return RidgeReadout(random_state=seed, precision=float(np.finfo(np.dtype(store.attrs["dtype"])).eps),
                        group_rows=group)


@dataclass
class LayerFit:
    """One layer's readout: the fitted estimator, its metrics and timings, and the test rows it got right.

    ``test_correct`` counts the correct heads of each test row of the store (a
    row with ``n_out_tokens`` output tokens of ``H`` heads has ``heads =
    n_out_tokens * H``), what paired comparisons between readouts resample.
    """

    layer: int
    estimator: LogisticReadout | RidgeReadout
    metrics: dict[str, Any]
    timings: dict[str, float]
    test_correct: np.ndarray
    heads: int
    curve: list[dict[str, Any]] = field(default_factory=list)


def scored(est, X: np.ndarray, y: np.ndarray, n_out: int) -> tuple[float, np.ndarray, int]:
    """One prediction pass: the accuracy (the share of correct heads, as a ratio of counts: the same float
    whoever computes it), the correct heads of each store row ``(N,)`` (``n_out`` readout rows make one store row)
    and the heads a store row has."""
    hit = est.hits(X, y)  # (N * n_out, H)
    per_row = hit.reshape(len(y) // n_out, -1)  # (N, n_out * H)
    return int(hit.sum()) / max(hit.size, 1), per_row.sum(1), per_row.shape[1]


def test_metrics(est, X: np.ndarray, y: np.ndarray, n_out: int) -> tuple[dict[str, Any], np.ndarray, int]:
    """``test_accuracy`` and ``test_interval`` of ``est`` on ``(X, y)``, the per-row counts and heads per row."""
    accuracy, correct, heads = scored(est, X, y, n_out)
    return accuracy_metrics("test", correct, heads, accuracy=accuracy), correct, heads


def validation_metrics(est) -> dict[str, Any]:
    """The chosen strength's validation accuracy and interval (from the estimator's per-row record)."""
    if getattr(est, "val_correct_", None) is None:
        return {"val_accuracy": float("nan"), "val_interval": [float("nan"), float("nan")]}
    heads = (est.n_heads_ or 1) * est.group_rows  # val_correct_ counts per example
    out = accuracy_metrics("val", est.val_correct_, heads)
    out["val_accuracy"] = est.val_scores_[est.alpha_]
    return out


def _layer_groups(store: FeatureStore, layers: list[int], splits: list[str]) -> list[list[int]]:
    """``layers`` cut into groups whose float32 features over ``splits`` fit :data:`SWEEP_BYTES`."""
    per_layer = sum(layer_bytes(store, s) for s in splits)
    size = max(1, SWEEP_BYTES // max(per_layer, 1))
    return [layers[i: i + size] for i in range(0, len(layers), size)]


def sweep(store: FeatureStore, layers: list[int], readout: str, *, seed: int, device: str, final_norm: bool,
          streamed: bool, train_sizes: list[int | None] | None = None, pooling: str | None = None
          ) -> Iterator[LayerFit]:
    """Fit ``readout`` on each of ``layers``, yielding each :class:`LayerFit` as soon as it is done."""
    has_val = "val" in store.splits
    splits = ["train", "test", *(["val"] if has_val else [])]
    if streamed:
        for k in layers:
            yield _fit_streamed(store, k, readout, seed, device, final_norm, has_val, pooling)
        return
    n_out = store.n_out_tokens
    for group in _layer_groups(store, layers, splits):
        t0 = time.perf_counter()
        data = {s: read_layers(store, s, group, final_norm, pooling) for s in splits}
        load_s = (time.perf_counter() - t0) / len(group)  # the group's read, shared out
        (X, y), (Xt, yt) = data["train"], data["test"]
        majority = int(np.bincount(y.ravel()).argmax())
        for i, k in enumerate(group):
            est = store_readout(store, readout, seed, device)
            val = (data["val"][0][i], data["val"][1]) if has_val else None
            t0 = time.perf_counter()
            est.fit(X[i], y, validation_data=val)
            fit_s = time.perf_counter() - t0
            test, correct, heads = test_metrics(est, Xt[i], yt, n_out)
            metrics = {"train_accuracy": est.score(X[i], y), **validation_metrics(est), **test}
            metrics.update(_path_metrics(est, len(X[i]), len(Xt[i]), float(np.mean(yt == majority))))
            curve = _learning_curve(store, readout, seed, device, X[i], y, Xt[i], yt, val, n_out, train_sizes)
            yield LayerFit(k, est, metrics, {"load_s": load_s, "fit_s": fit_s}, correct, heads, curve)


def _path_metrics(est, n_train: int, n_test: int, chance: float) -> dict[str, Any]:
    return {"alpha": est.alpha_, "val_scores": {str(a): s for a, s in est.val_scores_.items()},
            "n_train": n_train, "n_test": n_test, "chance": chance,
            "interval": "95% Wilson score: over rows (one head per row), over the rows' effective trials (several)"}


def _learning_curve(store, readout, seed, device, X, y, Xt, yt, val, n_out, sizes) -> list[dict[str, Any]]:
    """Test accuracy (with its interval) of the readout fitted on nested, seeded subsets of the training rows.

    The subsets are the first ``s`` store rows of one seeded permutation (a row's ``n_out`` output tokens stay
    together), so each is contained in the next; ``None`` is every row.
    """
    if not sizes:
        return []
    n_rows = len(y) // n_out
    largest = max((s for s in sizes if s is not None), default=0)
    if largest > n_rows:  # fit_linear refuses this before any fit; a guard for other callers
        raise ReservoirError(f"{store.path}: expected train sizes up to the {n_rows:,} training rows; found "
                             f"{largest:,}")
    order = np.random.default_rng([seed, 2]).permutation(n_rows)  # nested subsets: prefixes of one permutation
    curve = []
    for size in sizes:
        s = n_rows if size is None else int(size)
        rows = (np.sort(order[:s])[:, None] * n_out + np.arange(n_out)).ravel()
        seen = np.unique(y[rows])
        if len(seen) < 2:  # a few rows of one class (a readout refuses them): what they teach is that class
            curve.append({"n_train": s, **test_metrics(_Constant(seen[0]), Xt, yt, n_out)[0], "alpha": None,
                          "fit_s": 0.0, "one_class": seen[0].item()})
            continue
        est = store_readout(store, readout, seed, device)
        t0 = time.perf_counter()
        est.fit(X[rows], y[rows], validation_data=val)
        fit_s = time.perf_counter() - t0
        curve.append({"n_train": s, **test_metrics(est, Xt, yt, n_out)[0], "alpha": est.alpha_,
                      "fit_s": fit_s})
    return curve


class _Constant:
    """The predictor a training subset of one class gives: that class, for every row and head."""

    def __init__(self, label: Any):
        self.label = label

    def hits(self, X, y) -> np.ndarray:
        y = np.asarray(y)
        return (y == self.label).reshape(len(y), -1)  # (n, n_heads or 1)


def _fit_streamed(store: FeatureStore, k: int, readout: str, seed: int, device: str, final_norm: bool,
                  has_val: bool, pooling: str | None) -> LayerFit:
    """One layer fitted from store chunks (``fit_chunks``) and scored chunk by chunk; nothing held whole."""
    read_s = [0.0]
    n_out = store.n_out_tokens

    def chunks(split):
        _, _, n_o, d = store.features(split).shape
        step = store.chunk_rows(split)
        rows = step * max(1, STREAM_CHUNK_BYTES // max(step * n_o * d * 4, 1))  # whole store chunks

        def source():
            it = iter_layer(store, split, k, final_norm, rows, pooling)
            while True:
                t0 = time.perf_counter()
                item = next(it, None)
                read_s[0] += time.perf_counter() - t0
                if item is None:
                    return
                yield item
        return source

    est = store_readout(store, readout, seed, device)
    t0 = time.perf_counter()
    est.fit_chunks(chunks("train"), chunks("val") if has_val else None)
    fit_s = time.perf_counter() - t0
    hits, rows, counts = 0, 0, np.zeros(0, np.int64)
    for X, y in chunks("train")():
        hits += est.score(X, y) * len(X)
        rows += len(X)
        c = np.bincount(y.ravel())
        counts = np.pad(counts, (0, max(0, len(c) - len(counts)))) + np.pad(c, (0, max(0, len(counts) - len(c))))
    majority = int(counts.argmax())
    parts, same, entries, heads = [], 0.0, 0, 1
    for X, y in chunks("test")():
        _, correct, heads = scored(est, X, y, n_out)
        parts.append(correct)
        same, entries = same + float((y == majority).sum()), entries + y.size
    correct = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    metrics = {"train_accuracy": hits / max(rows, 1), **validation_metrics(est),
               **accuracy_metrics("test", correct, heads)}
    metrics.update(_path_metrics(est, rows, len(correct) * n_out, same / max(entries, 1)))
    return LayerFit(k, est, metrics, {"load_s": read_s[0], "fit_s": fit_s}, correct, heads)
