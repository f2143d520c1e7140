"""``reservoir bench readout``: the logistic readout vs scikit-learn on the same stored features."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

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
    layer, n_train, n_features : int
        The layer fitted, its train rows and features.
    reservoir : dict
        The readout's ``fit_s``, ``test_accuracy`` and chosen ``alpha``.
    sklearn : dict
        scikit-learn's ``fit_s``, ``test_accuracy`` and chosen ``C``.
    time_ratio : float
        scikit-learn's wall time over the readout's.
    torch_threads : int
    """

    kind: str = "bench-readout"
    store: str
    layer: int
    n_train: int
    n_features: int
    reservoir: dict[str, Any]
    sklearn: dict[str, Any]
    time_ratio: float
    torch_threads: int

    def __post_init__(self) -> None:
        if self.kind != "bench-readout":
            raise ReservoirError(f"expected a ReadoutBenchResult of kind 'bench-readout', found kind {self.kind!r}")


def readout_vs_sklearn(store: FeatureStore | str | os.PathLike, layer: int, *, seed: int = 0,
                       max_iter: int = 1000) -> ReadoutBenchResult:
    """``fit-linear``'s logistic readout vs scikit-learn's ``LogisticRegression`` on the same stored features.

    Both see the same final-norm-applied layer. scikit-learn gets standardized
    features and, like the readout, its ``C`` chosen on the same validation
    rows (the readout's carve, :func:`~reservoir.readouts.stats.carve_rows`;
    ``C = 1 / (alpha * n)`` over the readout's alpha grid, the same
    objective); both are then refitted on all train rows. Wall times include
    the selection. ``store`` is a store object (left open) or a path.

    Examples
    --------
    >>> r = readout_vs_sklearn("cache/xor.zarr", 2)                  # doctest: +SKIP
    >>> r.reservoir["test_accuracy"], r.sklearn["test_accuracy"], r.time_ratio  # doctest: +SKIP
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from reservoir.readouts.features import load_layer, opened
    from reservoir.readouts.logistic import DEFAULT_ALPHAS, LogisticReadout
    from reservoir.readouts.stats import carve_rows

    seed = check_seed(seed)
    with opened(store) as st:
        X, y = load_layer(st, "train", layer)
        Xt, yt = load_layer(st, "test", layer)
        source = os.fspath(store) if isinstance(store, (str, os.PathLike)) else str(st.path)
    if y.ndim != 1:
        raise ReservoirError(f"{source}: the scikit-learn comparison needs one label per row, found label shape "
                             f"{y.shape[1:]}")
    ours = LogisticReadout(random_state=seed)
    t0 = time.perf_counter()
    ours.fit(X, y)
    t_ours = time.perf_counter() - t0
    t_rows, v_rows = carve_rows(len(X), ours.val_fraction, seed)
    t0 = time.perf_counter()
    best = (-1.0, None)
    for alpha in DEFAULT_ALPHAS:
        C = 1.0 / (alpha * len(t_rows))
        sk = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
        acc = sk.fit(X[t_rows], y[t_rows]).score(X[v_rows], y[v_rows])
        if acc > best[0]:
            best = (acc, C)
    sk = make_pipeline(StandardScaler(), LogisticRegression(C=best[1], max_iter=max_iter)).fit(X, y)
    t_sk = time.perf_counter() - t0
    return ReadoutBenchResult(
        store=source, layer=layer, n_train=len(X), n_features=X.shape[1],
        reservoir={"fit_s": t_ours, "test_accuracy": ours.score(Xt, yt), "alpha": ours.alpha_},
        sklearn={"fit_s": t_sk, "test_accuracy": float(sk.score(Xt, yt)), "C": best[1]},
        time_ratio=t_sk / t_ours, torch_threads=torch.get_num_threads())
