"""``reservoir bench readout``: the logistic readout's all-layer sweep vs scikit-learn on the same stored features."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from reservoir.errors import ReservoirError
from reservoir.results import Result
from reservoir.runtime import check_seed

if TYPE_CHECKING:
    from reservoir.store import FeatureStore


@dataclasses.dataclass(kw_only=True)
class ReadoutBenchResult(Result):
    """What :func:`readout_vs_sklearn` measured; the fields are its results file's top-level keys.

    Attributes
    ----------
    kind : str
        ``"bench-readout"``.
    store : str
        The store's path.
    layers : list of int
        The layers fitted (an all-layer sweep by default).
    n_train, n_features : int
        Train rows and features of each layer.
    penalty : str
        Where the readout measured its L2 penalty (``"standardized"``: the model scikit-learn fits).
    path_rows : int or "all"
        Rows the readout fitted its L2 path on (``"all"``: every row the validation carve leaves, as
        scikit-learn; a number: the rows fitted, at most those asked for, as ``fit-linear``'s 16384). Files
        written before these two fields existed read as ``"whitened"`` and ``16384``.
    per_layer : list of dict
        For each layer: ``layer``, ``reservoir`` (``fit_s``, ``test_accuracy``, ``test_interval``,
        ``alpha``) and ``sklearn`` (``fit_s``, ``test_accuracy``, ``test_interval``, ``alpha`` chosen,
        ``C`` of the final fit on all rows, ``unconverged``: how many of its fits stopped at ``max_iter``;
        files written before the last two existed lack them).
    reservoir_s, sklearn_s : float
        Wall time of all the layers' fits, each side (the features read once, outside both).
    time_ratio : float
        ``sklearn_s / reservoir_s``.
    max_accuracy_gap : float
        The largest ``|reservoir - sklearn|`` test accuracy over the layers.
    torch_threads : int
    """

    kind: str = "bench-readout"
    store: str
    layers: list[int]
    n_train: int
    n_features: int
    per_layer: list[dict[str, Any]]
    reservoir_s: float
    sklearn_s: float
    time_ratio: float
    max_accuracy_gap: float
    torch_threads: int
    penalty: str = "whitened"
    path_rows: int | str = 16384

    def __post_init__(self) -> None:
        if self.kind != "bench-readout":
            raise ReservoirError(f"expected a ReadoutBenchResult of kind 'bench-readout', found kind {self.kind!r}")


def readout_vs_sklearn(store: FeatureStore | str | os.PathLike, layers: str | int | list[int] = "all", *,
                       seed: int = 0, max_iter: int = 1000, penalty: str = "standardized",
                       path_rows: int | None = None) -> ReadoutBenchResult:
    """The logistic readout vs scikit-learn's ``LogisticRegression`` over the same layers.

    Every layer is read from the store once (outside both timings). For each,
    the readout fits its whole L2 path (batched) and the chosen strength on all
    rows. By default it fits scikit-learn's model on scikit-learn's rows: the
    penalty on the weights of standardized features, the path on every row the
    validation carve leaves (``penalty="whitened", path_rows=16384`` is
    ``fit-linear``'s default readout instead). scikit-learn gets standardized features and,
    like the readout, its ``C`` chosen on the same validation rows (the
    store's ``val`` split when it has one, as ``fit-linear``; else the
    readout's carve, :func:`~reservoir.readouts.stats.carve_rows`; ``C = 1 /
    (alpha * n)`` over the readout's alpha grid, ``n`` the rows fitted, twice
    that for two classes, where scikit-learn fits one weight vector and the
    readout one per class), fitted once per ``C`` on the remaining rows, then
    refitted with the chosen alpha on all train rows. Wall times include the selection; fits that stop at
    ``max_iter`` are counted, not shown as warnings. ``store`` is a store object (left open) or a
    path; ``layers`` is ``"all"``, a layer or a list.

    Examples
    --------
    >>> r = readout_vs_sklearn("cache/xor.zarr")                               # doctest: +SKIP
    >>> r.time_ratio, r.max_accuracy_gap                                       # doctest: +SKIP
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from reservoir.readouts.features import opened, read_layers
    from reservoir.readouts.intervals import accuracy_interval
    from reservoir.readouts.logistic import DEFAULT_ALPHAS, LogisticReadout
    from reservoir.readouts.run import wanted_layers
    from reservoir.readouts.stats import carve_rows

    seed = check_seed(seed)
    with opened(store) as st:
        wanted = wanted_layers(st, layers)
        source = os.fspath(store) if isinstance(store, (str, os.PathLike)) else str(st.path)
        if st.attrs["task"]["label_shape"] or st.n_out_tokens != 1:
            raise ReservoirError(f"{source}: the scikit-learn comparison needs one label per row, found label shape "
                                 f"{tuple(st.attrs['task']['label_shape'])} and {st.n_out_tokens} output token(s)")
        X_all, y = read_layers(st, "train", wanted)
        Xt_all, yt = read_layers(st, "test", wanted)
        # the store's own validation split when it has one (as fit-linear selects on it), else carved from train
        Xv_all, yv = read_layers(st, "val", wanted) if "val" in st.splits else (None, None)
    if len(np.unique(y)) < 2:
        raise ReservoirError(f"{source}: the comparison needs at least two classes in the train split, found only "
                             f"class {int(y[0]) if len(y) else 'none'}")

    def side(fit_s, est, X, extra):
        correct = (np.asarray(est.predict(X)) == yt).astype(np.int64)
        return {"fit_s": fit_s, "test_accuracy": float(correct.mean()),
                "test_interval": list(accuracy_interval(correct)), **extra}

    def c_of(alpha: float, labels: np.ndarray) -> float:
        """scikit-learn's C for the readout's L2 strength on these rows: the readout penalises one weight vector
        per class, scikit-learn's binary model one vector in all (whose logit is their difference), so two
        classes take twice the C of ``1 / (alpha n)``."""
        return (2.0 if len(np.unique(labels)) == 2 else 1.0) / (alpha * len(labels))

    per_layer = []
    if yv is None:
        t_rows, v_rows = carve_rows(len(y), 0.1, seed)  # the readout's own carve (val_fraction 0.1)
    else:
        t_rows, v_rows = np.arange(len(y)), None
    if len(np.unique(y[t_rows])) < 2:
        raise ReservoirError(f"{source}: the comparison needs at least two classes in the train rows left after "
                             f"holding out validation rows; found one class in {len(t_rows)} row(s) of {len(y)}")
    for i, k in enumerate(wanted):
        X, Xt = X_all[i], Xt_all[i]
        X_val, y_val = (X[v_rows], y[v_rows]) if Xv_all is None else (Xv_all[i], yv)
        ours = LogisticReadout(random_state=seed, penalty=penalty, path_rows=path_rows)
        t0 = time.perf_counter()
        ours.fit(X, y, validation_data=None if Xv_all is None else (X_val, y_val))
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            best = (-1.0, DEFAULT_ALPHAS[0])
            for alpha in DEFAULT_ALPHAS:
                sk = make_pipeline(StandardScaler(), LogisticRegression(C=c_of(alpha, y[t_rows]), max_iter=max_iter))
                acc = sk.fit(X[t_rows], y[t_rows]).score(X_val, y_val)
                if acc > best[0]:
                    best = (acc, alpha)
            C = c_of(best[1], y)  # the chosen strength on every row, as the readout's final fit
            sk = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter)).fit(X, y)
        t_sk = time.perf_counter() - t0
        unconverged = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
        per_layer.append({"layer": k, "reservoir": side(t_ours, ours, Xt, {"alpha": ours.alpha_}),
                          "sklearn": side(t_sk, sk, Xt, {"C": C, "alpha": best[1], "unconverged": unconverged})})
    ours_s = sum(p["reservoir"]["fit_s"] for p in per_layer)
    sk_s = sum(p["sklearn"]["fit_s"] for p in per_layer)
    gap = max(abs(p["reservoir"]["test_accuracy"] - p["sklearn"]["test_accuracy"]) for p in per_layer)
    return ReadoutBenchResult(
        store=source, layers=wanted, n_train=len(y), n_features=int(X_all.shape[-1]), per_layer=per_layer,
        reservoir_s=ours_s, sklearn_s=sk_s, time_ratio=sk_s / ours_s, max_accuracy_gap=gap,
        torch_threads=torch.get_num_threads(), penalty=penalty,
        path_rows="all" if path_rows is None else min(path_rows, len(t_rows)))  # as fit-linear: at most that many
