"""Readouts: the scikit-learn contract, separable data, multi-head labels, streaming, fit-linear from a store."""

import itertools
import json
import re

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from reservoir.readouts import LogisticReadout, load_layer
from reservoir.readouts.features import iter_layer, layer_norm
from reservoir.readouts.ridge import RidgeReadout
from reservoir.readouts.stats import Moments, carve_rows, holdout_mask


@parametrize_with_checks([LogisticReadout(max_iter=100)])
def test_sklearn_contract(estimator, check):
    check(estimator)


@pytest.mark.parametrize("cls", [LogisticReadout, RidgeReadout])
def test_separable_reaches_100_percent(cls):
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 20)) * 5
    y = rng.integers(0, 4, 600)
    X = centers[y] + rng.normal(size=(600, 20))
    est = cls().fit(X[:400], y[:400])
    assert est.score(X[400:], y[400:]) == 1.0
    assert est.coef_.shape == (1, 4, 20)
    assert len(est.val_scores_) > 1 and est.val_scores_[est.alpha_] == max(est.val_scores_.values())
    if cls is LogisticReadout:
        assert set(est.val_scores_) <= {10.0, 1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6}
    else:
        assert np.array_equal(est.predict(X[400:]), est.classes_[est.decision_function(X[400:]).argmax(1)])


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


@pytest.mark.parametrize("how", ["arrays", "chunks", "ridge"])
def test_validation_rows_of_a_class_train_lacks_count_as_wrong(how):
    """A validation split can hold a class the training rows lack (many classes, few rows): its rows are
    scored wrong, as on the test split, not refused."""
    from reservoir.readouts.ridge import RidgeReadout

    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(200, 5)), (rng.normal(size=200) > 0).astype(int)
    X[:, 0] += 3 * y
    yv = y[:50].copy()
    yv[:10] = 7  # a class no training row has
    est = RidgeReadout(alphas=[1.0, 1e-3]) if how == "ridge" else LogisticReadout(alphas=[1.0, 1e-3])
    if how == "arrays":
        est.fit(X, y, validation_data=(X[:50], yv))
    else:
        est.fit_chunks([(X, y)], [(X[:50], yv)])
    assert est.val_correct_.shape == (50,) and not est.val_correct_[:10].any()
    best = est.val_scores_[est.alpha_]
    assert best == pytest.approx(est.val_correct_.sum() / 50) and 0 < best <= 40 / 50
    assert np.array_equal(est.val_correct_[10:], est.predict(X[10:50]) == yv[10:])


def test_layer_norm_matches_torch():
    import torch

    x = np.random.default_rng(3).normal(size=(4, 2, 16)).astype(np.float32)
    w, b = np.linspace(0.5, 2, 16, dtype=np.float32), np.linspace(-1, 1, 16, dtype=np.float32)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (16,), torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    np.testing.assert_allclose(layer_norm(x, w, b, 1e-5), ref.numpy(), atol=1e-5)


def test_fit_linear_from_store_applies_final_norm(tmp_path):
    from reservoir.extract import ExtractConfig, run as run_extract
    from reservoir.readouts.run import fit_linear
    from reservoir.store import FeatureStore

    out = run_extract(ExtractConfig(task="bit-memory", backbone="tiny-gpt2", layers=2, out=str(tmp_path / "m.zarr"),
                                task_params={"n_bits": 100, "bits_per_token": 10, "n_train": 40, "n_test": 20}),
                  progress=False)
    with FeatureStore.open(out) as store:
        X, y = load_layer(store, "train", 2)
        assert X.shape == (40 * 10, 32) and y.shape == (40 * 10, 10)  # output tokens become rows
        raw, _ = load_layer(store, "train", 2, final_norm=False)
        np.testing.assert_allclose(X.mean(1), store.final_norm()["bias"].mean(), atol=1e-3)  # LN output mean = mean(b) when w=1
        assert not np.allclose(X, raw)
        Xt, yt = load_layer(store, "test", 2)
        refit = LogisticReadout(group_rows=10).fit(X, y)  # an example's 10 output tokens held out together
    results = fit_linear(out, layers=[1, 2], results_dir=tmp_path / "res", save=True)
    assert [r.config["layer"] for r in results] == [1, 2]
    from reservoir.readouts.probes import predict_store

    again = predict_store(tmp_path / "res" / "m" / "logistic-layer2", out, ["test"])["test"]  # 10 bits per token
    assert again["accuracy"] == results[1].metrics["test_accuracy"] and again["predictions"].shape == (20 * 10, 10)
    saved = json.loads((tmp_path / "res" / "m" / "logistic-layer2.json").read_text())
    assert saved["store"]["task"]["name"] == "bit-memory"
    # the readout fitted on the final-norm features, scored per bit on the full test split
    assert saved["metrics"]["test_accuracy"] == refit.score(Xt, yt) == results[1].metrics["test_accuracy"]
    assert saved["metrics"]["alpha"] == refit.alpha_
    assert saved["metrics"]["n_test"] == 20 * 10


# -- ridge, streaming -----------------------------------------------------------


@parametrize_with_checks([RidgeReadout()])
def test_ridge_sklearn_contract(estimator, check):
    check(estimator)


def _chunks(X, y, cuts):
    return [(X[lo:hi], y[lo:hi]) for lo, hi in itertools.pairwise(cuts)]


def _noisy(seed, n=700, multi=False):
    """Badly scaled features with a large offset; labels (n,) in 3 classes or (n, 3) bits."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 12))
    X = (Z @ np.diag(np.logspace(-1, 2, 12)) @ rng.normal(size=(12, 12)) + 300).astype(np.float32)
    if multi:
        return X, np.stack([(Z[:, i] + 0.5 * rng.normal(size=n) > 0).astype(int) for i in range(3)], 1)
    return X, (Z[:, 0] + 0.5 * Z[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(int) + (Z[:, 2] > 1)


@pytest.mark.parametrize("multi", [False, True])
def test_ridge_streamed_equals_whole(multi):
    X, y = _noisy(4, multi=multi)
    val = (X[600:], y[600:])
    whole = RidgeReadout().fit(X[:600], y[:600], validation_data=val)
    cuts = [0, 1, 37, 250, 251, 600]  # uneven, one single row
    streamed = RidgeReadout().fit_chunks(lambda: iter(_chunks(X, y, cuts)), val_chunks=[val])
    assert streamed.alpha_ == pytest.approx(whole.alpha_, rel=1e-9)
    assert list(streamed.val_scores_.values()) == list(whole.val_scores_.values())
    np.testing.assert_allclose(streamed.coef_, whole.coef_, rtol=1e-6, atol=1e-8 * np.abs(whole.coef_).max())
    np.testing.assert_allclose(streamed.intercept_, whole.intercept_, rtol=1e-6, atol=1e-8)
    assert whole.coef_.shape == ((3, 2, 12) if multi else (1, 3, 12))
    assert whole.decision_function(X).shape == (700, 3)  # 3 binary heads, or 3 classes
    assert len(whole.val_scores_) == 13 and whole.val_scores_[whole.alpha_] == max(whole.val_scores_.values())
    # a carved split is by row index, so it is the same however the rows are chunked
    carved, carved_chunks = RidgeReadout().fit(X, y), RidgeReadout().fit_chunks(_chunks(X, y, [0, 300, 301, 700]))
    assert carved.alpha_ == pytest.approx(carved_chunks.alpha_, rel=1e-9)
    np.testing.assert_allclose(carved_chunks.coef_, carved.coef_, rtol=1e-6, atol=1e-8 * np.abs(carved.coef_).max())
    with pytest.raises(TypeError, match="one-shot"):
        RidgeReadout().fit_chunks(iter(_chunks(X, y, cuts)))


def test_holdout_mask_is_seeded_and_chunk_independent():
    whole = holdout_mask(0, 10_000, 0.1, seed=3)
    assert np.array_equal(np.concatenate([holdout_mask(0, 4321, 0.1, 3), holdout_mask(4321, 5679, 0.1, 3)]), whole)
    assert 0.08 < whole.mean() < 0.12 and not np.array_equal(holdout_mask(0, 10_000, 0.1, seed=4), whole)


@pytest.mark.parametrize("multi", [False, True])
def test_logistic_fit_chunks_equals_fit(multi):
    X, y = _noisy(6, multi=multi)
    val, alphas = (X[600:], y[600:]), (1.0, 1e-2, 1e-4)
    ref = LogisticReadout(alphas=alphas).fit(X[:600], y[:600], validation_data=val)
    est = LogisticReadout(alphas=alphas).fit_chunks(lambda: iter(_chunks(X, y, [0, 37, 250, 251, 600])), [val])
    assert est.alpha_ == ref.alpha_
    np.testing.assert_allclose(est._class_scores(X), ref._class_scores(X), atol=2e-3)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=2e-3 * np.abs(ref.coef_).max())
    assert (est.predict(X) == ref.predict(X)).mean() > 0.99
    carved = LogisticReadout(alphas=alphas).fit_chunks(_chunks(X, y, [0, 350, 700]))  # validation by row hash
    assert carved.score(*val) > 0.7 and carved.alpha_ in carved.val_scores_


@pytest.fixture(scope="module")
def xor_store(tmp_path_factory):
    from reservoir.extract import ExtractConfig, run as run_extract

    out = tmp_path_factory.mktemp("xor") / "s.zarr"
    return run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=2, out=str(out),
                                 task_params={"n_train": 200, "n_test": 50}), progress=False)


def test_iter_layer_concatenates_to_load_layer(xor_store):
    from reservoir.store import FeatureStore

    with FeatureStore.open(xor_store) as store:
        for split, final_norm, rows in [("train", True, None), ("train", False, 7), ("test", True, 1000)]:
            X, y = load_layer(store, split, 2, final_norm)
            parts = list(iter_layer(store, split, 2, final_norm, rows))
            assert len(parts) == -(-len(X) // (rows or store.chunk_rows(split)))
            np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), X)
            np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)


def test_fit_linear_ridge_streamed_and_in_memory(xor_store, tmp_path, monkeypatch):
    from reservoir.readouts import run
    from reservoir.readouts.run import fit_linear

    mem = fit_linear(xor_store, layers=[2], readout="ridge", results_dir=tmp_path / "mem")[0]
    streamed = fit_linear(xor_store, layers=[2], readout="ridge", results_dir=tmp_path / "st", stream=True)[0]
    saved = json.loads((tmp_path / "st" / "s" / "ridge-layer2.json").read_text())
    assert saved["config"]["readout"] == "ridge" and saved["config"]["stream"] is True
    assert mem.config["stream"] is False and set(saved["metrics"]) == set(mem.metrics)
    assert saved["metrics"]["n_train"] == 200 and saved["metrics"]["n_test"] == 50
    for key in ("train_accuracy", "test_accuracy", "alpha", "chance"):  # the ridge carve is by row index
        assert streamed.metrics[key] == pytest.approx(mem.metrics[key], rel=1e-6)
    assert fit_linear(xor_store, layers=[2], readout="ridge", stream="auto")[0].config["stream"] is False
    monkeypatch.setattr(run, "STREAM_AUTO_BYTES", 200 * 32 * 4 - 1)  # this store's train layer is just above
    auto = fit_linear(xor_store, layers=[2], readout="ridge", stream="auto")[0]
    assert auto.config["stream"] is True and auto.metrics == streamed.metrics
    with pytest.raises(ValueError, match="expected stream"):
        fit_linear(xor_store, readout="ridge", stream="sometimes")


def test_fit_raw_digits_and_standardized_penalty():
    from reservoir.errors import ReservoirError
    from reservoir.readouts.raw import fit_raw

    r = fit_raw("digits")
    assert r.kind == "fit-raw" and r.metrics["n_features"] == 64 and r.metrics["n_test"] == 360
    assert r.metrics["test_accuracy"] > 0.94  # a linear model on 8x8 digits
    with pytest.raises(ReservoirError, match="continuous task"):
        fit_raw("listops", {"n_train": 20, "n_test": 10, "max_length": 30})
    with pytest.raises(ValueError, match="penalty must be"):
        LogisticReadout(penalty="l1").fit(np.eye(12), np.arange(12) % 2)


# -- the same models as scikit-learn's, parameters checked at fit --------------------


def _three_classes(seed=7, n=300, d=6):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d))
    z = Z[:, 0] + 0.5 * Z[:, 1] + 0.5 * rng.normal(size=n)
    y = np.digitize(z, np.quantile(z, [1 / 3, 2 / 3]))  # 3 classes, not separable
    return Z * np.logspace(-1, 1, d) + 5, y


@pytest.mark.parametrize("whiten", [True, False])
def test_logistic_standardized_penalty_equals_sklearn(whiten):
    """One alpha, L2 on standardized weights: sklearn's multinomial LogisticRegression with C = 1 / (alpha * n)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _three_classes()
    alpha = 1e-2
    ours = LogisticReadout(alphas=[alpha], penalty="standardized", whiten=whiten, max_iter=2000, tol=1e-10).fit(X, y)
    sk = make_pipeline(StandardScaler(), LogisticRegression(C=1 / (alpha * len(X)), tol=1e-10, max_iter=5000))
    sk.fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), sk.predict_proba(X), atol=2e-4)
    assert np.array_equal(ours.predict(X), sk.predict(X))


@pytest.mark.parametrize("cls", [RidgeReadout, LogisticReadout])
def test_a_few_rows_always_leave_rows_to_validate_on(cls):
    """The row hash holds out about a tenth: on 20 rows, none for about one seed in eight, where the weakest strength
    was taken without a word. Then the rows whose hashes are smallest are held out (2 of 20, the same by chunks)."""
    from reservoir.readouts.stats import holdout_mask, split_seed

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 5)), (rng.normal(size=(20, 5))[:, 0] > 0).astype(int)
    y[:2] = [0, 1]
    seeds = range(60)
    plain = [int(holdout_mask(0, 20, 0.1, split_seed(s)).sum()) for s in seeds]
    assert 0 in plain  # the case this test is about occurs among these seeds
    for s in seeds:
        est = cls(random_state=s, alphas=[1e-2, 1e-1, 1.0]).fit_chunks([(X[:7], y[:7]), (X[7:], y[7:])])
        assert len(est.val_scores_) == 3, s  # every strength scored on held-out rows
        assert len(est.val_correct_) == (plain[s] if 0 < plain[s] < 20 else 2), s  # else the 2 of smallest hash


def test_ridge_equals_sklearn_ridge_classifier():
    from sklearn.linear_model import RidgeClassifier

    X, y = _three_classes()
    for alpha, labels in ((1e-3, y), (10.0, y), (1.0, np.minimum(y, 1))):  # and two classes: one score per row
        ours, sk = RidgeReadout(alphas=[alpha]).fit(X, labels), RidgeClassifier(alpha=alpha).fit(X, labels)
        np.testing.assert_allclose(ours.decision_function(X), sk.decision_function(X), rtol=1e-8, atol=1e-8)
        coef = ours.coef_[0, 1] if len(ours.classes_) == 2 else ours.coef_[0]  # two classes: classes_[1]'s row
        np.testing.assert_allclose(coef, sk.coef_, rtol=1e-8, atol=1e-10)
        assert ours.score(X, labels) == sk.score(X, labels)


@pytest.mark.parametrize("make", [lambda a: LogisticReadout(alphas=[a]), lambda a: RidgeReadout(alphas=[a])])
def test_stronger_penalty_gives_smaller_weights(make):
    X, y = _three_classes()
    norms = [np.linalg.norm(make(a).fit(X, y).coef_) for a in (1e3, 1.0, 1e-3)]
    assert norms[0] < norms[1] < norms[2]


BAD_PARAMS = [
    *((LogisticReadout, "val_fraction", v) for v in (2.0, -0.5, 0, 1.0, "0.1", float("nan"))),
    *((LogisticReadout, "alphas", v) for v in ([], [1.0, -1.0], 1.0)),
    (LogisticReadout, "max_iter", 0), (LogisticReadout, "max_iter", 2.5), (LogisticReadout, "tol", -1e-3),
    (LogisticReadout, "path_rows", 1), (LogisticReadout, "penalty", "l1"), (LogisticReadout, "whiten", "yes"),
    (LogisticReadout, "random_state", -1),
    (RidgeReadout, "alphas", [0.0]), (RidgeReadout, "alphas", [float("inf")]), (RidgeReadout, "val_fraction", 1.5),
    (RidgeReadout, "val_fraction", -0.5), (RidgeReadout, "random_state", 1.5),
]


@pytest.mark.parametrize(("cls", "name", "value"), BAD_PARAMS)
def test_parameters_are_checked_at_fit(cls, name, value):
    X, y = _three_classes(n=40)
    est = cls(**{name: value})  # __init__ only stores
    assert est.get_params()[name] is value
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: {name} must be .*, found {re.escape(repr(value))}$"):
        est.fit(X, y)
    with pytest.raises(ValueError, match=f"{name} must be"):
        est.fit_chunks([(X, y)])
    assert not hasattr(est, "classes_")


def test_val_fraction_near_one_still_leaves_rows_to_fit():
    fit_rows, val_rows = carve_rows(10, 0.99, 0)
    assert len(fit_rows) == 1 and len(val_rows) == 9
    X, y = _three_classes(n=10)
    est = LogisticReadout(val_fraction=0.99, alphas=[1.0, 1e-2]).fit(X, y)
    assert set(est.val_scores_) == {1.0, 1e-2}


def test_moments_of_different_shifts_do_not_subtract():
    a, b = Moments(np.zeros(2)), Moments(np.ones(2))
    a.update(np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [4.0, 4.0]]))
    b.update(np.full((1, 2), 4.0))
    with pytest.raises(ValueError, match="same shift"):
        a - b
    c = Moments(a.shift)
    c.update(np.full((1, 2), 4.0))
    assert (a - c).n == 3 and np.allclose((a - c).mean, [1.0, 1.0])


@pytest.mark.parametrize("how", ["logistic", "logistic-chunks", "ridge"])
def test_an_examples_output_tokens_are_held_out_together(how):
    """With ``group_rows`` (a bit-memory store's output tokens per example), the validation split takes whole
    examples, and ``val_correct_`` counts the correct heads of each."""
    from reservoir.readouts.ridge import RidgeReadout

    fit_rows, val_rows = carve_rows(60, 0.2, 0, group=3)
    assert len(val_rows) == 12 and sorted([*fit_rows, *val_rows]) == list(range(60))
    assert all(set(val_rows[i: i + 3]) == {val_rows[i] // 3 * 3 + j for j in range(3)} for i in range(0, 12, 3))
    mask = holdout_mask(0, 3000, 0.1, 7, group=5).reshape(600, 5)
    assert (mask.all(1) | ~mask.any(1)).all() and 30 < mask[:, 0].sum() < 90
    assert np.array_equal(np.concatenate([holdout_mask(s, 250, 0.1, 7, group=5) for s in range(0, 3000, 250)]),
                          mask.ravel())  # the same however the rows are chunked
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(1200, 6)), rng.integers(0, 2, size=(1200, 2))  # 300 examples x 4 tokens, 2 heads
    X[:, :2] += 2 * y
    if how == "ridge":
        est = RidgeReadout(alphas=[1.0, 10.0], group_rows=4).fit(X, y)
    elif how == "logistic":
        est = LogisticReadout(alphas=[1.0, 1e-3], group_rows=4).fit(X, y)
    else:
        est = LogisticReadout(alphas=[1.0, 1e-3], group_rows=4).fit_chunks([(X[:500], y[:500]), (X[500:], y[500:])])
    n_val = len(est.val_correct_)
    assert 10 <= n_val <= 60 and est.val_correct_.max() <= 8  # examples of 4 tokens x 2 heads
    assert est.val_scores_[est.alpha_] == pytest.approx(est.val_correct_.sum() / (8 * n_val))
    with pytest.raises(ValueError, match="whole groups of group_rows=4"):
        LogisticReadout(alphas=[1.0, 1e-3], group_rows=4).fit(X[:1001], y[:1001])
