"""Readouts: the scikit-learn contract, separable data, multi-head labels, fit-linear from a store."""

import json

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from reservoir.readouts import LogisticReadout, load_layer
from reservoir.readouts.features import layer_norm


@parametrize_with_checks([LogisticReadout(max_iter=100)])
def test_sklearn_contract(estimator, check):
    check(estimator)


def test_separable_reaches_100_percent():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 20)) * 5
    y = rng.integers(0, 4, 600)
    X = centers[y] + rng.normal(size=(600, 20))
    est = LogisticReadout().fit(X[:400], y[:400])
    assert est.score(X[400:], y[400:]) == 1.0
    assert est.coef_.shape == (1, 4, 20)
    assert set(est.val_scores_) <= {10.0, 1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6}
    assert est.alpha_ in est.val_scores_


def test_multi_head_labels_and_badly_conditioned_features():
    """Per-bit heads on features whose scales span 1e-1..1e3 (as hidden states do)."""
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(1000, 12))
    y = np.stack([(Z[:, i] > 0).astype(int) for i in range(3)], axis=1)  # (n, 3) bits
    X = Z @ np.diag(np.logspace(-1, 3, 12)) @ rng.normal(size=(12, 12))
    est = LogisticReadout().fit(X[:800], y[:800])
    assert est.predict(X[800:]).shape == (200, 3)
    assert len(est.predict_proba(X[800:])) == 3
    assert est.score(X[800:], y[800:]) > 0.97


def test_validation_data_replaces_carved_split():
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(200, 5)), rng.integers(0, 2, 200)
    est = LogisticReadout(alphas=[1.0, 1e-3]).fit(X, y, validation_data=(X[:50], y[:50]))
    assert set(est.val_scores_) == {1.0, 1e-3}
    with pytest.raises(ValueError, match="among the training classes"):
        LogisticReadout(alphas=[1.0, 1e-3]).fit(X, y, validation_data=(X[:5], np.full(5, 7)))


def test_layer_norm_matches_torch():
    import torch

    x = np.random.default_rng(3).normal(size=(4, 2, 16)).astype(np.float32)
    w, b = np.linspace(0.5, 2, 16, dtype=np.float32), np.linspace(-1, 1, 16, dtype=np.float32)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (16,), torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    np.testing.assert_allclose(layer_norm(x, w, b, 1e-5), ref.numpy(), atol=1e-5)


def test_fit_linear_from_store_applies_final_norm(tmp_path):
    from reservoir.extract import ExtractConfig, extract
    from reservoir.readouts.run import fit_linear
    from reservoir.store import FeatureStore

    out = extract(ExtractConfig(task="bit-memory", backbone="tiny-gpt2", layers=2, out=str(tmp_path / "m.zarr"),
                                task_params={"n_bits": 100, "bits_per_token": 10, "n_train": 40, "n_test": 20}),
                  progress=False)
    with FeatureStore.open(out) as store:
        X, y = load_layer(store, "train", 2)
        assert X.shape == (40 * 10, 32) and y.shape == (40 * 10, 10)  # output tokens become rows
        raw, _ = load_layer(store, "train", 2, final_norm=False)
        np.testing.assert_allclose(X.mean(1), store.final_norm()["bias"].mean(), atol=1e-3)  # LN output mean = mean(b) when w=1
        assert not np.allclose(X, raw)
    rows = fit_linear(out, layers=[1, 2], results_dir=tmp_path / "res")
    assert [r["config"]["layer"] for r in rows] == [1, 2]
    saved = json.loads((tmp_path / "res" / "m" / "logistic-layer2.json").read_text())
    assert saved["store"]["task"]["name"] == "bit-memory"
    assert 0.0 <= saved["metrics"]["test_accuracy"] <= 1.0
    assert saved["metrics"]["n_test"] == 20 * 10
