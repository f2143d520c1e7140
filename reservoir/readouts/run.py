"""Readouts as experiments: :func:`fit_linear` (a readout per stored layer) and :class:`FitResult`, which it and
:func:`~reservoir.readouts.raw.fit_raw` (raw inputs) return.

Both write nothing unless asked:
:func:`fit_linear` writes one JSON per layer into a ``results_dir`` it is
given (the ``reservoir fit-linear`` command passes ``results/fit-linear``);
whoever owns another output (``reservoir fit-raw --out``, a recipe's run
folder) writes the result there with :meth:`FitResult.write`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import check_local, missing_folders, removed_if_failed, within, writable_folder
from reservoir.readouts.features import layer_bytes, opened
from reservoir.readouts.intervals import encode_rows
from reservoir.readouts.naming import result_stem, results_folder, same_store, store_location
from reservoir.readouts.stats import MIN_CARVE_ROWS
from reservoir.results import Result
from reservoir.runtime import check_seed, resolve_device
from reservoir.settings import describe_difference, first_difference
from reservoir.store import FeatureStore
from reservoir.store.feature_store import KEY_FIELDS
from reservoir.store.lock import run_folder_lock
from reservoir.store.remote import StoreURL

log = logging.getLogger("reservoir")

READOUTS = options.READOUTS
KINDS = ("fit-linear", "fit-raw")
#: ``stream="auto"`` streams a layer whose train features exceed this many bytes as float32.
STREAM_AUTO_BYTES = 2 * 1024**3


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
        ``train_accuracy``, ``val_accuracy`` and ``val_interval`` (the
        chosen strength's; ``None`` without validation rows),
        ``test_accuracy`` (full test split; each bit counts once) and
        ``test_interval`` (its 95% interval over the test rows, ``[low,
        high]``), ``alpha``, ``n_train``, ``n_test`` (rows the readout saw: a
        bit-memory store row's output tokens count one each); fit-linear adds
        ``val_scores``, ``chance`` (majority-class test accuracy) and, with
        ``train_sizes``, ``learning_curve`` (a list of ``{n_train,
        test_accuracy, test_interval, alpha, fit_s}``, ``n_train`` in store
        rows; a subset of one class fits nothing and predicts that class:
        ``alpha`` ``None`` and ``one_class`` the class); fit-raw adds
        ``n_features``.
    timings : dict
        Seconds: ``fit_s``, and fit-linear's ``load_s`` (its share of the
        store read).
    rows : dict or None
        ``{"test": ...}``: which test rows were right
        (:func:`~reservoir.readouts.intervals.encode_rows`), what a paired
        comparison of two results on the same rows needs.

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
    rows: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ReservoirError(f"expected a FitResult of kind {' or '.join(map(repr, KINDS))}, found kind "
                                 f"{self.kind!r}")


def _check_classes(store: FeatureStore) -> None:
    """Refuse (one line) a train split of one class (a readout learns nothing; a fit would report 100%), and say
    (a warning) when test labels hold classes the train split lacks: no readout predicts them, and they count as
    errors."""
    from reservoir.tasks.arrays import train_classes

    train = train_classes(store.labels("train"), str(store.path))
    for split in store.splits:
        if split != "train":
            unseen = np.setdiff1d(np.unique(np.asarray(store.labels(split))), train)
            if len(unseen):
                shown = ", ".join(str(int(c)) for c in unseen[:10]) + (", ..." if len(unseen) > 10 else "")
                log.warning("%s: split %r holds class(es) %s that the train split lacks: no readout predicts "
                            "them, and they count as errors", store.path, split, shown)


def check_readout(readout: str) -> None:
    """Refuse a readout name other than those of :data:`READOUTS` (one line)."""
    if readout not in READOUTS:
        raise ReservoirError(f"unknown readout {readout!r}; expected one of: {', '.join(READOUTS)}")


def wanted_layers(store: FeatureStore, layers: str | int | list[int]) -> list[int]:
    """The asked layers (``"all"``, one layer, or a list of them), each checked to be in the store before anything
    is fitted; a layer named twice is refused (one line), not fitted twice or dropped without a word."""
    expected = "expected layers 'all', a layer or a list of layers"
    if isinstance(layers, str):
        if layers != "all":
            raise ReservoirError(f"{expected}; found {options.shown(layers)}")
        return list(store.layers)
    given: Any = layers  # an integer, or a list, a tuple, a numpy array, a range of them
    if options.is_int(given):
        wanted = [int(given)]
    else:
        try:
            wanted = list(given)
        except TypeError:
            raise ReservoirError(f"{expected}; found {options.shown(layers)}") from None
        if not wanted or not all(options.is_int(k) for k in wanted):
            raise ReservoirError(f"{expected}; found {options.shown(layers)}")
        wanted = [int(k) for k in wanted]
    for k in wanted:
        store.layer_index(k)
    twice = options.repeated(wanted)
    if twice is not None:
        raise ReservoirError(f"--layer: expected each layer once; found layer {twice} twice in {wanted}")
    return wanted


def _check_sizes_fit(st: FeatureStore, sizes: list[int | None] | None) -> None:
    """Refuse (one line) learning-curve sizes the store cannot give: more rows than it has, too few to carve a
    validation split from (without a ``val`` split), or its row count beside ``all`` (one size twice)."""
    n = st.n_rows("train")
    largest = max((s for s in sizes or [] if s is not None), default=0)
    if largest > n:
        raise ReservoirError(f"{st.path}: expected train sizes up to the store's {n:,} training rows; found "
                             f"{largest:,}")
    smallest = min((s for s in sizes or [] if s is not None), default=None)
    if smallest is not None and smallest < MIN_CARVE_ROWS and "val" not in st.splits:
        raise ReservoirError(f"{st.path}: expected train sizes of at least {MIN_CARVE_ROWS} rows on a store "
                             "without a val split (the validation rows that choose the L2 strength are carved "
                             f"from the training rows, and fewer than {MIN_CARVE_ROWS} are never carved); found "
                             f"{smallest}")
    if sizes and None in sizes and n in sizes:
        raise ReservoirError(f"{st.path}: expected distinct train sizes; found {n:,} and 'all', which are both the "
                             f"store's {n:,} training rows")


def _fit_result(fit, common: dict[str, Any], has_val: bool, fingerprint: Any) -> FitResult:
    """One layer's fit (:func:`~reservoir.readouts.sweep.sweep`) as its result; ``common`` holds the config
    fields every layer shares."""
    est = fit.estimator
    # what the readout did: without a val split it carves one, or (too few rows) scores no strength at all
    validation = "store val split" if has_val else "carved from train" if est.val_scores_ else \
        f"none (fewer than {MIN_CARVE_ROWS} training rows: the weakest strength is fitted)"
    metrics = dict(fit.metrics)
    if fit.curve:
        metrics["learning_curve"] = fit.curve
    config = {**common, "layer": fit.layer, "alphas": sorted(est.val_scores_), "validation": validation}
    order = ("store", "layer", "readout", "seed", "final_norm", "alphas", "validation", "stream", "train_sizes",
             "pooling")  # as results files have always listed them
    return FitResult(kind="fit-linear", config={k: config[k] for k in order}, store=fingerprint, metrics=metrics,
                     timings=fit.timings, rows={"test": encode_rows(fit.test_correct, fit.heads)})


def _keep(result: FitResult, fit, path: Path, st: FeatureStore, save: bool) -> None:
    """Write ``result`` to ``path``, and its probe beside it when ``save``; without, remove an earlier fit's probe
    there, which would no longer be the one its results file describes."""
    result.write(path)
    if save:
        from reservoir.readouts.probes import save_probe

        save_probe(fit.estimator, path.with_suffix(""), st, fit.layer, result.config["final_norm"], result,
                   result.config["pooling"])
    else:
        for old in (path.with_suffix(".safetensors"), path.with_suffix(".probe.json")):
            old.unlink(missing_ok=True)


def fit_linear(
    store: FeatureStore | StoreURL | str | os.PathLike,
    layers: str | int | list[int] = "all",
    readout: str = "logistic",
    *,
    seed: int = 0,
    device: str = "cpu",
    final_norm: bool = True,
    stream: bool | Literal["auto"] = "auto",
    train_sizes: list[int | None] | None = None,
    pooling: str | None = None,
    results_dir: str | os.PathLike | None = None,
    save: bool = False,
    on_result: Callable[[FitResult | None], None] | None = None,
) -> list[FitResult]:
    """Fit a linear readout on each asked layer of a store; one :class:`FitResult` per layer.

    The layers are read from the store together, each chunk once, and each
    is fitted over its whole L2 path (:mod:`reservoir.readouts.sweep`). The
    L2 strength is chosen on the store's ``val`` split when it has one, else
    on a tenth of train carved off, seeded by ``seed`` (see ``stream``).
    Accuracy is on the full test split (each bit counts once for bit tasks),
    with a 95% interval over the test rows (:mod:`reservoir.readouts.intervals`);
    each result keeps which test rows were right (``rows``), so two results on
    the same rows can be compared with a paired interval.

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
        Seed of the carved validation split, the path's subsample and the
        learning curve's subsets.
    device : str
        Torch device of the logistic fit (``cpu``, ``cuda``, ``cuda:N``, ``auto``).
    final_norm : bool
        Read each layer through the backbone's final norm (a depth-K readout).
    stream : bool or "auto"
        ``True`` fits each layer from :func:`iter_layer` chunks (about 64 MB
        each) with ``fit_chunks`` and scores chunk by chunk, so no split is
        ever held whole; ``"auto"`` (the default) streams when a layer's train
        features exceed :data:`STREAM_AUTO_BYTES` (2 GiB) as float32. A ridge
        fit carves its validation rows by a hash of the row index either way
        (:func:`~reservoir.readouts.stats.holdout_mask`); a logistic fit in
        memory carves by a seeded permutation
        (:func:`~reservoir.readouts.stats.carve_rows`), and streamed by the
        hash, so its carved split (and the result) differs slightly between
        the two; ``timings.load_s`` is then the time spent reading chunks over
        all passes, inside and outside ``fit_s``.
    train_sizes : list of int or None, optional
        A learning curve: the readout is also fitted on the first ``s`` rows
        of one seeded permutation of the training rows for each ``s`` (nested
        subsets; ``None`` means every row), each scored on the full test
        split, in ``metrics["learning_curve"]``. Not with ``stream``.
    pooling : str, optional
        Which of the store's poolings to read (``last``, ``first``,
        ``mean``; ``extract --pooling``); default the store's first.
    results_dir : path, optional
        When given, each result is also written to
        ``results_dir/<store name>/<stem>-layer<K>.json``, the stem
        :func:`result_stem` (``logistic``, ``logistic-mean``,
        ``logistic-nonorm``, ...; the folder is proved writable before any
        fit). Nothing is written without it.
    save : bool
        Also keep each fitted readout as a probe beside its results file
        (``<stem>-layer<K>.safetensors`` and ``.probe.json``;
        :mod:`reservoir.readouts.probes`). Needs ``results_dir``.
    on_result : callable, optional
        Called with ``None`` once every layer has been checked (and
        ``results_dir`` proved writable), then with each result as soon as it
        is ready (the CLI prints a table row).

    A bad ``readout``, ``stream``, ``device``, ``seed`` or ``train_sizes`` is
    refused before the store is opened.

    Examples
    --------
    >>> results = fit_linear("cache/bit-xor-minilm-pretrained.zarr", layers=[6])  # doctest: +SKIP
    >>> results[0].metrics["test_accuracy"], results[0].metrics["test_interval"]  # doctest: +SKIP
    """
    from reservoir.readouts.sweep import sweep

    check_readout(readout)
    if stream not in (True, False, "auto"):
        raise ReservoirError(f"expected stream to be true, false or 'auto', found {stream!r}")
    sizes = _check_sizes(train_sizes)
    if sizes and stream is True:
        raise ReservoirError("expected --train-sizes without --stream on (a learning curve refits in memory); "
                             "found both")
    if save and results_dir is None:
        raise ReservoirError("expected a results_dir to save the probes beside their results; found none")
    if results_dir is not None:
        check_local(results_dir, "a results folder")
    seed, device = check_seed(seed), str(resolve_device(device))
    with opened(store) as st, contextlib.ExitStack() as held:
        if not st.complete:
            raise ReservoirError(f"{st.path}: expected a complete store, found an unfinished extraction (rerun it)")
        if "train" not in st.splits or "test" not in st.splits:
            raise ReservoirError(f"{st.path}: expected train and test splits, found {st.splits}")
        wanted = wanted_layers(st, layers)
        pooled = st.pooling(pooling)  # refused now if the store lacks it
        _check_classes(st)
        _check_sizes_fit(st, sizes)
        source = store_location(os.fspath(store) if isinstance(store, (str, os.PathLike)) else str(st.path))
        stem = result_stem(readout, pooled, final_norm)
        folder = None if results_dir is None else results_folder(results_dir, st.path)
        lock = None
        if folder is not None:  # refused now, not after the fits
            if not isinstance(st.path, StoreURL) and within(folder, st.path):
                raise ReservoirError(f"{results_dir}: expected a results folder outside the input {st.path}; found "
                                     "one inside it")
            held.enter_context(removed_if_failed(missing_folders(folder)))  # a failed fit leaves no empty folder
            writable_folder(folder)
            lock = held.enter_context(run_folder_lock(folder))  # one writer: each results file beside its own probe
            _check_owner(folder, stem, source, st.fingerprint())
        if on_result is not None:
            on_result(None)
        streamed = stream is True or (stream == "auto" and layer_bytes(st, "train") > STREAM_AUTO_BYTES)
        if streamed and sizes:
            raise ReservoirError(f"{st.path}: a layer's train features exceed {STREAM_AUTO_BYTES / 1024**3:.0f} GiB, "
                                 "so they are streamed; a learning curve (--train-sizes) needs them in memory")
        common = {"store": source, "readout": readout, "seed": seed, "final_norm": final_norm, "stream": streamed,
                  "train_sizes": None if not sizes else ["all" if s is None else s for s in sizes],
                  "pooling": pooled}
        results = []
        for fit in sweep(st, wanted, readout, seed=seed, device=device, final_norm=final_norm, streamed=streamed,
                         train_sizes=sizes, pooling=pooled):
            result = _fit_result(fit, common, "val" in st.splits, st.fingerprint())
            if folder is not None:
                if lock is not None:
                    lock.check()  # the folder's lock file still this fit's: no second fit writes beside it
                _keep(result, fit, folder / f"{stem}-layer{fit.layer}.json", st, save)
            results.append(result)
            if on_result is not None:
                on_result(result)
        return results


def _check_owner(folder: Path, stem: str, source: str, fingerprint: dict[str, Any]) -> None:
    """Refuse, before any fit, a folder whose results of this readout came from another store (two stores of one
    name in different folders), or from another extraction at this store's path (its settings or data other than
    this store's: a store deleted and extracted again): writing beside them would mix two extractions' results, and
    writing over them would replace them without a word. A store of the same settings and data extracted again, or
    with other layers or poolings stored beside, gives the same features: its results stay."""
    for old in sorted(folder.glob(f"{stem}-layer*.json")):
        try:
            result = FitResult.read(old)
        except ReservoirError:
            continue  # unreadable: replaced like any damaged result
        other = result.config.get("store")
        if isinstance(other, str) and not same_store(other, source):
            raise ReservoirError(f"{folder}: expected results of {source} or none; found {old.name} from {other} "
                                 "(another store of the same name); pass another results folder or remove them")
        diff = _extraction_difference(result.store, fingerprint)
        if diff is not None:
            raise ReservoirError(f"{folder}: expected results of this extraction of {source} or none; found "
                                 f"{old.name} from another extraction at that path ({describe_difference(diff)}); "
                                 "pass another results folder or remove them")


def _extraction_difference(old: Any, new: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first setting (dotted) whose value differs between two stores' fingerprints, leaving out what does not
    change a stored layer's features (which layers, up to which depth, and poolings were stored beside it, when, by
    which version); ``None`` for a result that recorded no fingerprint."""
    if not isinstance(old, dict) or not old:
        return None

    def features(fp: dict[str, Any]) -> dict[str, Any]:
        kept = {k: fp.get(k) for k in KEY_FIELDS if k != "layers"}
        for key, beside in (("pooling", "kinds"), ("backbone", "depth")):  # depth: the top layer stored
            part = kept.get(key)
            if isinstance(part, dict):
                kept[key] = {k: v for k, v in part.items() if k != beside}
        return kept

    return first_difference(features(old), features(new))


def _check_sizes(sizes) -> list[int | None] | None:
    """``train_sizes`` checked: positive integers or ``None`` (every row), no repeats."""
    if sizes is None:
        return None
    if isinstance(sizes, (str, bytes, int, np.integer)) or not hasattr(sizes, "__iter__"):
        raise ReservoirError(f"expected train_sizes as a list of integers >= 2 or 'all' (e.g. [100, 'all']); "
                             f"found {sizes!r}")
    out: list[int | None] = []
    for s in sizes:
        if s is None or s == "all":
            out.append(None)
        elif isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 2:
            out.append(int(s))
        else:
            raise ReservoirError(f"expected train_sizes of integers >= 2 or 'all'; found {s!r}")
    if not out or len(set(out)) != len(out):
        raise ReservoirError(f"expected a non-empty list of distinct train sizes; found {list(sizes)!r}")
    return out
