"""Readouts as experiments: :func:`fit_linear` (a readout per stored layer) and :func:`fit_raw` (raw inputs).

Both return :class:`FitResult` objects and write nothing unless asked:
:func:`fit_linear` writes one JSON per layer into a ``results_dir`` it is
given (the ``reservoir fit-linear`` command passes ``results/fit-linear``);
whoever owns another output (``reservoir fit-raw --out``, a recipe's run
folder) writes the result there with :meth:`FitResult.write`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.readouts.features import iter_layer, layer_bytes, load_layer, opened
from reservoir.readouts.logistic import LogisticReadout
from reservoir.readouts.ridge import RidgeReadout
from reservoir.results import Result, writable_folder
from reservoir.runtime import check_seed, resolve_device
from reservoir.store import FeatureStore

if TYPE_CHECKING:
    from reservoir.tasks import TaskData

READOUTS = ("logistic", "ridge")
KINDS = ("fit-linear", "fit-raw")
#: ``stream="auto"`` streams a layer whose train features exceed this many bytes as float32.
STREAM_AUTO_BYTES = 2 * 1024**3
#: Bytes (float32) of features per chunk when streaming, rounded to whole store chunks.
STREAM_CHUNK_BYTES = 64 * 1024**2


@dataclasses.dataclass(kw_only=True)
class FitResult(Result):
    """One readout fit: a store's layer (``kind="fit-linear"``) or a task's raw inputs (``"fit-raw"``).

    The fields are the results file's top-level keys; files written before
    this type existed load with :meth:`FitResult.read` (keys such as
    ``environment``, ``written`` or a recipe's ``recipe`` land in ``extra``).

    Attributes
    ----------
    kind : {"fit-linear", "fit-raw"}
    config : dict
        What was asked: ``readout``, ``seed``; for fit-linear ``store`` (its
        path), ``layer``, ``final_norm``, ``alphas``, ``validation`` and
        ``stream``; for fit-raw ``task`` and ``task_params``.
    store : dict or None
        fit-linear: the store's fingerprint (its key fields and version).
    task : dict or None
        fit-raw: the task's ``name`` and ``fingerprint``.
    metrics : dict
        ``train_accuracy``, ``test_accuracy`` (full test split; each bit
        counts once), ``alpha``, ``n_train``, ``n_test``; fit-linear adds
        ``val_accuracy``, ``val_scores`` and ``chance`` (majority-class test
        accuracy), fit-raw ``n_features``.
    timings : dict
        Seconds: ``fit_s``, and fit-linear's ``load_s``.

    Examples
    --------
    >>> r = FitResult(kind="fit-raw", config={"task": "digits"}, metrics={"test_accuracy": 0.96},
    ...               timings={"fit_s": 0.1})
    >>> FitResult.from_dict(r.to_dict()) == r, r.metrics["test_accuracy"]
    (True, 0.96)
    """

    kind: str
    config: dict[str, Any]
    store: dict[str, Any] | None = None
    task: dict[str, Any] | None = None
    metrics: dict[str, Any]
    timings: dict[str, float]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ReservoirError(f"expected a FitResult of kind {' or '.join(map(repr, KINDS))}, found kind "
                                 f"{self.kind!r}")


def _check_readout(readout: str) -> None:
    """Refuse a readout name other than those of :data:`READOUTS` (one line)."""
    if readout not in READOUTS:
        raise ReservoirError(f"unknown readout {readout!r}; expected one of: {', '.join(READOUTS)}")


def _make_readout(kind: str, seed: int, device: str, **kwargs):
    """The ``kind`` readout, seeded; ``device`` and ``kwargs`` go to the logistic one (ridge runs in numpy)."""
    if kind == "logistic":
        return LogisticReadout(random_state=seed, device=device, **kwargs)
    return RidgeReadout(random_state=seed)


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


def _wanted_layers(store: FeatureStore, layers: str | int | list[int]) -> list[int]:
    """The asked layers, each checked to be in the store (before anything is fitted)."""
    if layers == "all":
        wanted = store.layers
    elif isinstance(layers, int):
        wanted = [layers]
    else:
        wanted = list(layers)
    for k in wanted:
        store.layer_index(k)
    return wanted


def fit_linear(
    store: FeatureStore | str | os.PathLike,
    layers: str | int | list[int] = "all",
    readout: str = "logistic",
    *,
    seed: int = 0,
    device: str = "cpu",
    final_norm: bool = True,
    stream: bool | Literal["auto"] = False,
    results_dir: str | os.PathLike | None = None,
    on_result: Callable[[FitResult | None], None] | None = None,
) -> list[FitResult]:
    """Fit a linear readout on each asked layer of a store; one :class:`FitResult` per layer.

    The L2 strength is chosen on the store's ``val`` split when it has one,
    else on a validation split carved from train (``val_fraction`` of it,
    seeded). Accuracy is on the full test split (each bit counts once for bit
    tasks).

    Parameters
    ----------
    store : FeatureStore or path
        A complete store; a path is opened and closed here, a store object is
        left open for the caller.
    layers : "all", int or list of int
        Stored layers to fit, all checked before the first fit.
    readout : {"logistic", "ridge"}
        :class:`~reservoir.readouts.LogisticReadout` or
        :class:`~reservoir.readouts.RidgeReadout`.
    seed : int
        Seed of the carved validation split.
    device : str
        Torch device of the logistic fit (``cpu``, ``cuda``, ``cuda:N``, ``auto``).
    final_norm : bool
        Read each layer through the backbone's final norm (a depth-K readout).
    stream : bool or "auto"
        ``True`` fits from :func:`iter_layer` chunks (about 64 MB each) with
        ``fit_chunks`` and scores chunk by chunk, so no split is ever held
        whole; ``"auto"`` streams when a layer's train features exceed
        :data:`STREAM_AUTO_BYTES` (2 GiB) as float32. Streaming carves its
        validation rows by a hash of the row index, not the permutation
        ``fit`` uses, so a carved split (and the result) differs slightly from
        an in-memory fit; ``timings.load_s`` is then the time spent reading
        chunks over all passes, inside and outside ``fit_s``.
    results_dir : path, optional
        When given, each result is also written to
        ``results_dir/<store name>/<readout>-layer<K>.json`` (the folder is
        proved writable before any fit). Nothing is written without it.
    on_result : callable, optional
        Called with ``None`` once every layer has been checked (and
        ``results_dir`` proved writable), then with each result as soon as it
        is ready (the CLI prints a table row).

    A bad ``readout``, ``stream``, ``device`` or ``seed`` is refused before
    the store is opened.

    Examples
    --------
    >>> results = fit_linear("cache/bit-xor-minilm-pretrained.zarr", layers=[6])  # doctest: +SKIP
    >>> results[0].metrics["test_accuracy"]                                        # doctest: +SKIP
    """
    _check_readout(readout)
    if stream not in (True, False, "auto"):
        raise ReservoirError(f"expected stream to be true, false or 'auto', found {stream!r}")
    seed, device = check_seed(seed), str(resolve_device(device))
    with opened(store) as st:
        if not st.complete:
            raise ReservoirError(f"{st.path}: expected a complete store, found an unfinished extraction (rerun it)")
        if "train" not in st.splits or "test" not in st.splits:
            raise ReservoirError(f"{st.path}: expected train and test splits, found {st.splits}")
        wanted = _wanted_layers(st, layers)
        folder = None if results_dir is None else Path(results_dir) / Path(st.path).name.split(".")[0]
        if folder is not None:  # refused now, not after the fits
            writable_folder(folder)
        if on_result is not None:
            on_result(None)
        streamed = stream is True or (stream == "auto" and layer_bytes(st, "train") > STREAM_AUTO_BYTES)
        source = os.fspath(store) if isinstance(store, (str, os.PathLike)) else str(st.path)
        results = []
        for k in wanted:
            result = _fit_layer(st, source, k, readout, seed, device, final_norm, streamed)
            if folder is not None:
                result.write(folder / f"{readout}-layer{k}.json")
            results.append(result)
            if on_result is not None:
                on_result(result)
        return results


def _fit_layer(store: FeatureStore, source: str, k: int, readout: str, seed: int, device: str, final_norm: bool,
               streamed: bool) -> FitResult:
    """One readout on layer ``k`` of the store (``source`` names it), alpha chosen on its ``val`` split if any."""
    has_val = "val" in store.splits
    est = _make_readout(readout, seed, device)
    metrics, timings = (_fit_streamed if streamed else _fit_in_memory)(est, store, k, final_norm, has_val)
    return FitResult(
        kind="fit-linear",
        config={"store": source, "layer": k, "readout": readout, "seed": seed, "final_norm": final_norm,
                "alphas": sorted(est.val_scores_), "validation": "store val split" if has_val else "carved from train",
                "stream": streamed},
        store=store.fingerprint(),
        metrics={
            "train_accuracy": metrics["train_accuracy"],
            "val_accuracy": max(est.val_scores_.values()) if est.val_scores_ else float("nan"),
            "test_accuracy": metrics["test_accuracy"],
            "alpha": est.alpha_,
            "val_scores": {str(a): s for a, s in est.val_scores_.items()},
            "n_train": metrics["n_train"],
            "n_test": metrics["n_test"],
            "chance": metrics["chance"],
        },
        timings=timings,
    )


def _fit_in_memory(est, store, k, final_norm, has_val):
    """Fit ``est`` on layer ``k`` loaded whole; ``(metrics, timings)`` over the train and test splits."""
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
    """As :func:`_fit_in_memory`, from store chunks (``fit_chunks``), scoring chunk by chunk."""
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


def fit_raw(task: str | TaskData, task_params: dict[str, Any] | None = None, readout: str = "logistic", *,
            seed: int = 0, device: str = "cpu") -> FitResult:
    """The no-backbone baseline: the same readout on a continuous task's flattened raw inputs.

    Lu et al. quote 92% for a linear classifier on raw MNIST; Fashion-MNIST's
    published raw-pixel logistic baseline is about 84%. The logistic readout
    penalizes the weights of standardized pixels (the textbook baseline).

    Parameters
    ----------
    task : str or TaskData
        A registered task name (built with ``task_params`` through the task
        cache) or a task object already built.
    task_params : dict, optional
        Parameters of a named task; not allowed with a task object.
    readout : {"logistic", "ridge"}
    seed : int
        Seed of the carved validation split (when the task has no ``val``).
    device : str
        Torch device of the logistic fit.

    Writes nothing: the caller owning an output writes the result there.

    Examples
    --------
    >>> fit_raw("digits").metrics["test_accuracy"]  # doctest: +SKIP
    """
    from reservoir.tasks import load_task

    _check_readout(readout)
    seed, device = check_seed(seed), str(resolve_device(device))
    if isinstance(task, str):
        data = load_task(task, task_params)
    elif task_params:
        raise ReservoirError(f"task_params apply to a task name; found a task object {task.name!r} and "
                             f"task_params {task_params!r} (build the task with them instead)")
    else:
        data = task
    if data.kind != "continuous" or data.n_out_tokens != 1:
        raise ReservoirError(f"a raw-input baseline needs a continuous task with one output token; found "
                             f"{data.name!r} ({data.kind}, {data.n_out_tokens} output tokens)")
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
    return FitResult(
        kind="fit-raw",
        config={"task": task if isinstance(task, str) else data.name, "task_params": data.params, "readout": readout,
                "seed": seed},
        task={"name": data.name, "fingerprint": data.fingerprint},
        metrics={"train_accuracy": est.score(X, tr.labels), "test_accuracy": est.score(Xt, te.labels),
                 "alpha": est.alpha_, "n_features": int(X.shape[1]), "n_train": len(X), "n_test": len(Xt)},
        timings={"fit_s": t_fit},
    )
