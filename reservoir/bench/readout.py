"""``reservoir bench readout``: the logistic readout vs scikit-learn on the same stored features."""

from __future__ import annotations

import time
from typing import Any

import torch

from reservoir.errors import ReservoirError
from reservoir.runtime import check_seed


def readout_vs_sklearn(store_path: str, layer: int, seed: int = 0, max_iter: int = 1000) -> dict[str, Any]:
    """``fit-linear``'s logistic readout vs scikit-learn's ``LogisticRegression`` on the same stored features.

    Both see the same final-norm-applied layer. scikit-learn gets standardized
    features and, like the readout, its ``C`` chosen on the same validation
    rows (``C = 1 / (alpha * n)`` over the readout's alpha grid, the same
    objective); both are then refitted on all train rows. Wall times include
    the selection.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from reservoir.readouts.features import load_layer
    from reservoir.readouts.logistic import DEFAULT_ALPHAS, LogisticReadout
    from reservoir.store import FeatureStore
    from reservoir.train import carve_val

    seed = check_seed(seed)
    with FeatureStore.open(store_path) as st:
        X, y = load_layer(st, "train", layer)
        Xt, yt = load_layer(st, "test", layer)
    if y.ndim != 1:
        raise ReservoirError(f"{store_path}: the scikit-learn comparison needs one label per row, found label shape "
                             f"{y.shape[1:]}")
    t_rows, v_rows = carve_val(len(X), 0.1, seed)
    t0 = time.perf_counter()
    ours = LogisticReadout(random_state=seed).fit(X, y)
    t_ours = time.perf_counter() - t0
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
    return {"store": str(store_path), "layer": layer, "n_train": len(X), "n_features": X.shape[1],
            "reservoir": {"fit_s": t_ours, "test_accuracy": ours.score(Xt, yt), "alpha": ours.alpha_},
            "sklearn": {"fit_s": t_sk, "test_accuracy": float(sk.score(Xt, yt)), "C": best[1]},
            "time_ratio": t_sk / t_ours, "torch_threads": torch.get_num_threads()}
