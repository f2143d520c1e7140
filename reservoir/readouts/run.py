"""``reservoir fit-linear``: a linear readout per stored layer, from the store alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.readouts.features import iter_layer, load_layer
from reservoir.results import writable_folder, write_result
from reservoir.runtime import check_seed, resolve_device
from reservoir.store import FeatureStore

READOUTS = ("logistic", "ridge")
#: ``stream="auto"`` streams a layer whose train features exceed this many bytes as float32.
STREAM_AUTO_BYTES = 2 * 1024**3
#: Bytes (float32) of features per chunk when streaming, rounded to whole store chunks.
STREAM_CHUNK_BYTES = 64 * 1024**2


def _make_readout(kind: str, seed: int, device: str, **kwargs):
    if kind == "logistic":
        from reservoir.readouts.logistic import LogisticReadout

        return LogisticReadout(random_state=seed, device=device, **kwargs)
    if kind == "ridge":
        from reservoir.readouts.ridge import RidgeReadout

        return RidgeReadout(random_state=seed)
    raise ReservoirError(f"unknown readout {kind!r}; expected one of: {', '.join(READOUTS)}")


def layer_bytes(store: FeatureStore, split: str) -> int:
    """Bytes of one layer of ``split`` as float32 ``(N * n_out_tokens, n_dim)``."""
    n, _, n_out, d = store.features(split).shape
    return int(n) * int(n_out) * int(d) * 4


def _stream_eval(est, chunks, majority=None):
    """Accuracy, rows, label counts and the share of labels equal to ``majority``, one pass over the chunks."""
    hits = same = entries = 0.0
    rows, counts = 0, np.zeros(0, np.int64)
    for X, y in chunks():
        hits += est.score(X, y) * len(X)
        rows += len(X)
        c = np.bincount(y.ravel())
        counts = np.pad(counts, (0, max(0, len(c) - len(counts)))) + np.pad(c, (0, max(0, len(counts) - len(c))))
        if majority is not None:
            same, entries = same + float((y == majority).sum()), entries + y.size
    return hits / max(rows, 1), rows, counts, same / max(entries, 1)


def fit_linear(
    store_path: str | Path,
    layers: str | int | list[int] = "all",
    readout: str = "logistic",
    seed: int = 0,
    results_dir: str | Path | None = "results/fit-linear",
    device: str = "cpu",
    final_norm: bool = True,
    on_result: Callable[[dict[str, Any] | None], None] | None = None,
    stream: bool | Literal["auto"] = False,
) -> list[dict[str, Any]]:
    """Fit a linear readout on each asked layer of a store; return (and write) one result per layer.

    The L2 strength is chosen on the store's ``val`` split when it has one,
    else on a validation split carved from train (``val_fraction`` of it,
    seeded). Accuracy is on the full test split (each bit counts once for bit
    tasks).

    ``readout`` is ``"logistic"`` (:class:`LogisticReadout`) or ``"ridge"``
    (:class:`RidgeReadout`). ``stream=True`` fits from :func:`iter_layer`
    chunks (about 64 MB each) with ``fit_chunks`` and scores chunk by chunk,
    so no split is ever held whole; ``"auto"`` streams a layer whose train
    features exceed :data:`STREAM_AUTO_BYTES` (2 GiB) as float32. Streaming
    carves its validation rows by a hash of the row index, not the
    permutation ``fit`` uses, so the carved split (and the result) differs
    slightly from an in-memory fit; ``timings.load_s`` is then the time spent
    reading chunks over all passes, inside and outside ``fit_s``.

    ``on_result`` is called with ``None`` once every layer has been checked
    (and ``results_dir`` proved writable), then with each result as soon as
    it is ready (the CLI prints a table row). A bad ``device`` or ``seed`` is
    refused before the store is opened.

    Examples
    --------
    >>> rows = fit_linear("cache/bit-xor-minilm-pretrained.zarr", layers=[6])  # doctest: +SKIP
    >>> rows[0]["metrics"]["test_accuracy"]                                    # doctest: +SKIP
    """
    if readout not in READOUTS:
        raise ReservoirError(f"unknown readout {readout!r}; expected one of: {', '.join(READOUTS)}")
    if stream not in (True, False, "auto"):
        raise ReservoirError(f"expected stream to be true, false or 'auto', found {stream!r}")
    seed, device = check_seed(seed), str(resolve_device(device))
    with FeatureStore.open(store_path) as store:
        if not store.complete:
            raise ReservoirError(f"{store_path}: expected a complete store, found an unfinished extraction (rerun it)")
        if "train" not in store.splits or "test" not in store.splits:
            raise ReservoirError(f"{store_path}: expected train and test splits, found {store.splits}")
        if layers == "all":
            wanted = store.layers
        elif isinstance(layers, int):
            wanted = [layers]
        else:
            wanted = list(layers)
        for k in wanted:
            store.layer_index(k)
        name = Path(store_path).name.split(".")[0]
        if results_dir is not None:  # refused now, not after the fits
            writable_folder(Path(results_dir) / name)
        if on_result is not None:
            on_result(None)
        has_val = "val" in store.splits
        streamed = stream is True or (stream == "auto" and layer_bytes(store, "train") > STREAM_AUTO_BYTES)
        rows = []
        for k in wanted:
            est = _make_readout(readout, seed, device)
            fit = _fit_streamed if streamed else _fit_in_memory
            metrics, timings = fit(est, store, k, final_norm, has_val)
            result = {
                "kind": "fit-linear",
                "config": {"store": str(store_path), "layer": k, "readout": readout, "seed": seed,
                           "final_norm": final_norm, "alphas": sorted(est.val_scores_),
                           "validation": "store val split" if has_val else "carved from train",
                           "stream": streamed},
                "store": store.fingerprint(),
                "metrics": {
                    "train_accuracy": metrics["train_accuracy"],
                    "val_accuracy": max(est.val_scores_.values()) if est.val_scores_ else float("nan"),
                    "test_accuracy": metrics["test_accuracy"],
                    "alpha": est.alpha_,
                    "val_scores": {str(a): s for a, s in est.val_scores_.items()},
                    "n_train": metrics["n_train"],
                    "n_test": metrics["n_test"],
                    "chance": metrics["chance"],
                },
                "timings": timings,
            }
            if results_dir is not None:
                result["path"] = str(write_result(Path(results_dir) / name / f"{readout}-layer{k}.json", result))
            rows.append(result)
            if on_result is not None:
                on_result(result)
        return rows


def _fit_in_memory(est, store, k, final_norm, has_val):
    t0 = time.perf_counter()
    X, y = load_layer(store, "train", k, final_norm)
    Xt, yt = load_layer(store, "test", k, final_norm)
    val = load_layer(store, "val", k, final_norm) if has_val else None
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    est.fit(X, y, validation_data=val)
    t_fit = time.perf_counter() - t0
    metrics = {"train_accuracy": est.score(X, y), "test_accuracy": est.score(Xt, yt),
               "n_train": len(X), "n_test": len(Xt),
               "chance": float(np.mean(yt == np.bincount(y.ravel()).argmax()))}
    return metrics, {"load_s": t_load, "fit_s": t_fit}


def _fit_streamed(est, store, k, final_norm, has_val):
    read_s = [0.0]

    def chunks(split):
        _, _, n_out, d = store.features(split).shape
        step = store.chunk_rows(split)
        rows = step * max(1, STREAM_CHUNK_BYTES // max(step * n_out * d * 4, 1))  # whole store chunks

        def source():
            it = iter_layer(store, split, k, final_norm, rows)
            while True:
                t0 = time.perf_counter()
                item = next(it, None)
                read_s[0] += time.perf_counter() - t0
                if item is None:
                    return
                yield item
        return source

    t0 = time.perf_counter()
    est.fit_chunks(chunks("train"), chunks("val") if has_val else None)
    t_fit = time.perf_counter() - t0
    train_acc, n_train, counts, _ = _stream_eval(est, chunks("train"))
    test_acc, n_test, _, chance = _stream_eval(est, chunks("test"), majority=int(counts.argmax()))
    metrics = {"train_accuracy": train_acc, "test_accuracy": test_acc, "n_train": n_train, "n_test": n_test,
               "chance": chance}
    return metrics, {"load_s": read_s[0], "fit_s": t_fit}


def fit_raw(task: str, task_params: dict[str, Any] | None = None, readout: str = "logistic", seed: int = 0,
            device: str = "cpu") -> dict[str, Any]:
    """The no-backbone baseline: the same readout on a continuous task's flattened raw inputs.

    Lu et al. quote 92% for a linear classifier on raw MNIST; Fashion-MNIST's
    published raw-pixel logistic baseline is about 84%.

    Examples
    --------
    >>> fit_raw("digits")["metrics"]["test_accuracy"]  # doctest: +SKIP
    """
    from reservoir.tasks import load_task

    seed, device = check_seed(seed), str(resolve_device(device))
    data = load_task(task, task_params)
    if data.kind != "continuous" or data.n_out_tokens != 1:
        raise ReservoirError(f"a raw-input baseline needs a continuous task with one output token; found {task!r} "
                             f"({data.kind}, {data.n_out_tokens} output tokens)")
    tr, te = data.splits["train"], data.splits["test"]
    X, Xt = tr.inputs.reshape(len(tr), -1), te.inputs.reshape(len(te), -1)
    val = None
    if "val" in data.splits:
        va = data.splits["val"]
        val = (va.inputs.reshape(len(va), -1), va.labels)
    # the textbook baseline: L2 on standardized pixels (whitening raw pixels amplifies near-constant ones)
    est = _make_readout(readout, seed, device, **({"penalty": "standardized"} if readout == "logistic" else {}))
    t0 = time.perf_counter()
    est.fit(X, tr.labels, validation_data=val)
    t_fit = time.perf_counter() - t0
    return {
        "kind": "fit-raw",
        "config": {"task": task, "task_params": data.params, "readout": readout, "seed": seed},
        "task": {"name": data.name, "fingerprint": data.fingerprint},
        "metrics": {"train_accuracy": est.score(X, tr.labels), "test_accuracy": est.score(Xt, te.labels),
                    "alpha": est.alpha_, "n_features": int(X.shape[1]), "n_train": len(X), "n_test": len(Xt)},
        "timings": {"fit_s": t_fit},
    }
