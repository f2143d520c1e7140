"""``reservoir fit-linear``: a linear readout per stored layer, from the store alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.readouts.features import load_layer
from reservoir.results import write_result
from reservoir.store import FeatureStore

READOUTS = ("logistic",)


def _make_readout(kind: str, seed: int, device: str):
    if kind == "logistic":
        from reservoir.readouts.logistic import LogisticReadout

        return LogisticReadout(random_state=seed, device=device)
    raise ReservoirError(f"unknown readout {kind!r}; expected one of: {', '.join(READOUTS)}")


def fit_linear(
    store_path: str | Path,
    layers: str | int | list[int] = "all",
    readout: str = "logistic",
    seed: int = 0,
    results_dir: str | Path | None = "results/fit-linear",
    device: str = "cpu",
    final_norm: bool = True,
    on_result: Callable[[dict[str, Any] | None], None] | None = None,
) -> list[dict[str, Any]]:
    """Fit a linear readout on each asked layer of a store; return (and write) one result per layer.

    The L2 strength is chosen on the store's ``val`` split when it has one,
    else on a validation split carved from train (``val_fraction`` of it,
    seeded). Accuracy is on the full test split (each bit counts once for bit
    tasks).

    ``on_result`` is called with ``None`` once every layer has been checked,
    then with each result as soon as it is ready (the CLI prints a table row).

    Examples
    --------
    >>> rows = fit_linear("cache/bit-xor-minilm-pretrained.zarr", layers=[6])  # doctest: +SKIP
    >>> rows[0]["metrics"]["test_accuracy"]                                    # doctest: +SKIP
    """
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
        if on_result is not None:
            on_result(None)
        rows = []
        for k in wanted:
            t0 = time.perf_counter()
            X, y = load_layer(store, "train", k, final_norm)
            Xt, yt = load_layer(store, "test", k, final_norm)
            val = load_layer(store, "val", k, final_norm) if "val" in store.splits else None
            t_load = time.perf_counter() - t0
            est = _make_readout(readout, seed, device)
            t0 = time.perf_counter()
            est.fit(X, y, validation_data=val)
            t_fit = time.perf_counter() - t0
            best_val = max(est.val_scores_.values()) if est.val_scores_ else float("nan")
            result = {
                "kind": "fit-linear",
                "config": {"store": str(store_path), "layer": k, "readout": readout, "seed": seed,
                           "final_norm": final_norm, "alphas": sorted(est.val_scores_),
                           "validation": "store val split" if val is not None else "carved from train"},
                "store": store.fingerprint(),
                "metrics": {
                    "train_accuracy": est.score(X, y),
                    "val_accuracy": best_val,
                    "test_accuracy": est.score(Xt, yt),
                    "alpha": est.alpha_,
                    "val_scores": {str(a): s for a, s in est.val_scores_.items()},
                    "n_train": int(len(X)),
                    "n_test": int(len(Xt)),
                    "chance": float(np.mean(yt == np.bincount(y.ravel()).argmax())),
                },
                "timings": {"load_s": t_load, "fit_s": t_fit},
            }
            if results_dir is not None:
                name = Path(store_path).name.split(".")[0]
                result["path"] = str(write_result(Path(results_dir) / name / f"{readout}-layer{k}.json", result))
            rows.append(result)
            if on_result is not None:
                on_result(result)
        return rows
