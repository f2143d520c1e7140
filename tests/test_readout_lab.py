"""The readout lab: the batched L2 path, intervals, learning curves, probes kept and applied."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.readouts import LogisticReadout, RidgeReadout, fit_linear, load_layer
from reservoir.readouts.intervals import accuracy_interval, decode_rows, encode_rows, paired_difference, wilson
from reservoir.readouts.lbfgs import lbfgs
from reservoir.readouts.multinomial import Multinomial
from reservoir.readouts.stats import Moments


def _problem(seed=0, n=600, d=10, classes=4, heads=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32) * np.logspace(-1, 1, d).astype(np.float32) + 3
    W = rng.normal(size=(d, heads * classes))
    Y = (X @ W + 2 * rng.normal(size=(n, heads * classes))).reshape(n, heads, classes).argmax(-1)  # (n, H)
    m = Moments()
    m.update(X)
    lam, V = np.linalg.eigh(m.scatter() / m.n)
    P = torch.as_tensor(V / np.sqrt(lam), dtype=torch.float32)
    Xc = torch.as_tensor(X - m.mean.astype(np.float32))
    return Xc, torch.as_tensor(Y), P, classes, heads


@pytest.mark.parametrize("heads", [1, 3])
def test_batched_path_equals_each_strength_alone(heads):
    """All strengths in one batched L-BFGS give each strength's own minimum (same probabilities, same objective)."""
    Xc, Y, P, C, H = _problem(heads=heads)
    alphas = [1.0, 1e-1, 1e-2, 1e-3]

    def problem(strengths):
        return Multinomial(lambda: ((Xc, Y),), len(Xc), P, H, C, torch.tensor(strengths))

    batched = problem(alphas)
    together = lbfgs(batched, torch.zeros(len(alphas), batched.size), ftol=0, gtol=1e-5, max_iter=2000).theta
    for i, a in enumerate(alphas):
        alone = problem([a])
        theta = lbfgs(alone, torch.zeros(1, alone.size), ftol=0, gtol=1e-5, max_iter=2000).theta
        # the same fitted model: class probabilities on every row within 5e-4. Not the coefficients: the intercept
        # of a class the rows almost never take (e^-12) is flat in the objective, and a float32 line search stops
        # where the objective no longer changes in its last digits, anywhere along such directions
        probs = [torch.softmax(alone.logits_t(Xc, t[None]), dim=2) for t in (together[i], theta[0])]
        np.testing.assert_allclose(probs[0].numpy(), probs[1].numpy(), atol=5e-4)
        f_together, _ = alone(together[i:i + 1], torch.zeros(1, dtype=torch.long))
        f_alone, _ = alone(theta, torch.zeros(1, dtype=torch.long))
        assert abs(float(f_together - f_alone)) < 1e-6 * max(1.0, abs(float(f_alone)))


def test_batched_path_matches_sklearn_on_whitened_features():
    """An independent solver: scikit-learn's multinomial LogisticRegression with C = 1 / (alpha n) on Xc P."""
    from sklearn.linear_model import LogisticRegression

    Xc, Y, P, C, H = _problem(seed=2)
    assert len(np.unique(Y)) == C  # every class present, as scikit-learn's model has only the classes it sees
    alphas = [1e-1, 1e-3]
    prob = Multinomial(lambda: ((Xc, Y),), len(Xc), P, H, C, torch.tensor(alphas))
    theta = lbfgs(prob, torch.zeros(2, prob.size), ftol=0, gtol=1e-5, max_iter=3000).theta
    Z = (Xc @ P).numpy().astype(np.float64)
    for i, a in enumerate(alphas):
        sk = LogisticRegression(C=1 / (a * len(Z)), tol=1e-10, max_iter=10_000).fit(Z, Y[:, 0].numpy())
        V, b = prob.unpack(theta[i: i + 1])
        ours = Z @ V[0].numpy() + b[0].numpy()
        ref = sk.decision_function(Z)
        # multinomial logits are defined up to a shift per row: compare centred logits
        ref = ref - ref.mean(1, keepdims=True)
        np.testing.assert_allclose(ours - ours.mean(1, keepdims=True), ref, atol=2e-3 * np.abs(ref).max())


def test_readout_subsampled_path_then_refit_on_all_rows():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 8)).astype(np.float32)
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.5 * rng.normal(size=3000) > 0).astype(int)
    est = LogisticReadout(path_rows=500).fit(X, y)
    assert est.path_rows_ == 500 and len(est.val_scores_) == 8
    full = LogisticReadout(path_rows=None).fit(X, y)
    assert full.path_rows_ == 2700
    assert abs(est.score(X, y) - full.score(X, y)) < 0.01
    assert est.val_correct_.shape == (300,) and est.val_correct_.sum() / 300 == est.val_scores_[est.alpha_]


def test_ridge_float32_statistics_of_float16_features_match_float64():
    rng = np.random.default_rng(6)
    Z = rng.normal(size=(3000, 12))
    X = (Z @ rng.normal(size=(12, 40)) * np.logspace(-1, 1, 40) + 5).astype(np.float16).astype(np.float32)
    y = (Z[:, 0] + 0.5 * Z[:, 1] + 0.5 * rng.normal(size=3000) > 0).astype(int) + (Z[:, 2] > 1)
    exact = RidgeReadout().fit(X, y)
    fast = RidgeReadout(precision=float(np.finfo(np.float16).eps)).fit(X, y)  # float32 products, as for a store
    assert fast.alpha_ == pytest.approx(exact.alpha_, rel=1e-4)
    assert list(fast.val_scores_.values()) == pytest.approx(list(exact.val_scores_.values()), abs=1e-3)
    assert (fast.predict(X) == exact.predict(X)).mean() > 0.999
    np.testing.assert_allclose(fast.coef_, exact.coef_, rtol=1e-3, atol=1e-4 * np.abs(exact.coef_).max())


# -- intervals --------------------------------------------------------------------------
def test_wilson_interval_covers_about_95_percent():
    """200 seeded simulated readouts of 1,000 test rows at a true accuracy of 80%: ~95% of intervals hold it."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(200):
        correct = rng.random(1000) < 0.8
        lo, hi = accuracy_interval(correct.astype(int))
        hits += lo <= 0.8 <= hi
    assert 180 <= hits <= 199  # 95% of 200 is 190; the binomial spread of the count is about 3


def test_multi_head_interval_covers_about_95_percent():
    """Rows of 5 heads whose hits are correlated within a row (an easy or a hard row): the interval counts the
    rows' effective number of trials, and ~95% of 200 intervals hold the true accuracy."""
    rng = np.random.default_rng(1)
    p_row = np.array([0.95, 0.4])  # easy and hard rows, 70% of rows easy: true accuracy 0.785
    truth = 0.7 * 0.95 + 0.3 * 0.4
    hits = 0
    for _ in range(200):
        easy = rng.random(800) < 0.7
        correct = rng.binomial(5, np.where(easy, p_row[0], p_row[1]))
        lo, hi = accuracy_interval(correct, heads=5)
        hits += lo <= truth <= hi
    assert 178 <= hits <= 199


def _near_perfect_rows(rng, n: int = 2000, heads: int = 5, p_fail: float = 0.002) -> np.ndarray:
    """Per-row counts of correct heads: a row fails with ``p_fail``, and then gets 1 to ``heads`` heads wrong
    (each wrong with 1/2, at least one)."""
    correct = np.full(n, heads)
    for i in np.flatnonzero(rng.random(n) < p_fail):
        wrong = 0
        while wrong == 0:
            wrong = rng.binomial(heads, 0.5)
        correct[i] -= wrong
    return correct


def test_multi_head_interval_holds_its_coverage_near_100_percent():
    """Near 100% a few failing rows hold all the spread. Of these 500 readouts of 2,000 rows of 5 heads (true
    accuracy 99.90%), a percentile bootstrap over rows held the truth in 461 (89-90% in larger simulations);
    the effective-trials Wilson interval holds it in about 95%."""
    rng = np.random.default_rng(3)
    wrong_if_failed = np.sum([w * 0.5**5 * math.comb(5, w) for w in range(1, 6)]) / (1 - 0.5**5)  # E[wrong | >= 1]
    truth = 1 - 0.002 * wrong_if_failed / 5
    hits = sum(lo <= truth <= hi for lo, hi in
               (accuracy_interval(_near_perfect_rows(rng), heads=5) for _ in range(500)))
    assert hits >= 470, hits  # 94%


def test_intervals_are_honest_at_the_edges():
    lo, hi = accuracy_interval(np.r_[np.full(100, 3), np.zeros(20)], 5)
    assert 0 < lo < 0.5 < hi < 1  # the accuracy 300/600 inside its interval
    lo, hi = wilson(500, 500)
    assert hi == 1.0 and 0.99 < lo < 1.0  # never the point [1, 1] a bootstrap would give
    assert accuracy_interval(np.full(500, 5), heads=5) == (lo, hi)  # every row fully right: rows as trials
    # exactly 1 (0) at 100% (0%), never the point estimate outside its interval (1 - 1e-16 came out for 30% of n)
    assert all(wilson(n, n)[1] == 1.0 and wilson(0, n)[0] == 0.0 for n in range(1, 3000))
    d = paired_difference(np.ones(400), np.r_[np.ones(380), np.zeros(20)])
    assert d.diff == pytest.approx(0.05) and d.excludes_zero and d.low > 0
    same = paired_difference(np.r_[np.ones(200), np.zeros(200)], np.r_[np.zeros(200), np.ones(200)])
    assert same.diff == 0 and not same.excludes_zero and not same.resolved
    # every row alike, half its heads right: the interval of 50% over 5 rows (it was computed at 2 of 5 rows)
    assert accuracy_interval(np.ones(5), heads=2) == pytest.approx((0.1704, 0.8296), abs=1e-4)


def test_a_paired_difference_is_resolved_only_when_an_exact_test_agrees():
    """The bootstrap's interval of a few rows that differ all one way is a point away from zero ([+1, +1] for one
    row): a difference is resolved only when the exact sign test (McNemar's) also rejects no difference."""
    from scipy.stats import binomtest

    one = paired_difference(np.ones(1), np.zeros(1))
    assert (one.low, one.high) == (1.0, 1.0) and one.excludes_zero and one.p_value == 1.0 and not one.resolved
    a, b = np.r_[np.ones(4), np.zeros(996)], np.zeros(1000)  # 4 rows only a gets right, none the other way
    four = paired_difference(a, b)
    assert four.excludes_zero and four.p_value == pytest.approx(binomtest(4, 4).pvalue) == 0.125
    assert not four.resolved
    rng = np.random.default_rng(0)
    a, b = (rng.random(1000) < 0.62).astype(float), (rng.random(1000) < 0.55).astype(float)
    d = paired_difference(a, b)
    pos, neg = int(((a - b) > 0).sum()), int(((a - b) < 0).sum())
    assert d.p_value == pytest.approx(binomtest(pos, pos + neg).pvalue)  # McNemar's exact test
    assert d.resolved == (d.excludes_zero and d.p_value < 0.05)
    heads = paired_difference(np.r_[np.full(30, 3), np.full(970, 2)], np.full(1000, 2), heads=3)
    assert heads.p_value == pytest.approx(binomtest(30, 30).pvalue) and heads.resolved  # rows that differ, any heads


def test_rows_record_round_trip_and_refusals():
    correct = np.array([0, 3, 5, 1])
    got, heads = decode_rows(encode_rows(correct, 5))
    assert heads == 5 and np.array_equal(got, correct)
    big, _ = decode_rows(json.loads(json.dumps(encode_rows(np.array([1000, 7]), 1000))))
    assert big.tolist() == [1000, 7]
    bad = encode_rows(correct, 5) | {"rows": 9}
    with pytest.raises(ReservoirError, match="expected 9 per-row counts"):
        decode_rows(bad)
    with pytest.raises(ReservoirError, match="malformed"):
        decode_rows({"heads": 1, "rows": 1, "dtype": "uint8", "correct": "%%%"})


# -- probes -------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LogisticReadout, RidgeReadout])
@pytest.mark.parametrize("multi", [False, True])
def test_probe_save_load_round_trip(tmp_path, cls, multi):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    y = np.stack([(X[:, i] > 0).astype(int) + (X[:, i] > 1) for i in range(3)], 1) if multi else (X[:, 0] > 0) * 2
    est = cls().fit(X, y)
    path = est.save(tmp_path / "probe", note="a test")
    assert path.name == "probe.probe.json" and (tmp_path / "probe.safetensors").is_file()
    back = cls.load(tmp_path / "probe")
    assert np.array_equal(back.predict(X), est.predict(X)) and back.alpha_ == est.alpha_
    np.testing.assert_array_equal(back.coef_, est.coef_)
    np.testing.assert_array_equal(back.intercept_, est.intercept_)
    assert json.loads(path.read_text())["note"] == "a test"
    other = RidgeReadout if cls is LogisticReadout else LogisticReadout
    with pytest.raises(ReservoirError, match=f"expected a saved {other.__name__}"):
        other.load(tmp_path / "probe")
    blob = bytearray((tmp_path / "probe.safetensors").read_bytes())
    blob[-1] ^= 1
    (tmp_path / "probe.safetensors").write_bytes(bytes(blob))
    with pytest.raises(ReservoirError, match="do not match the sha256"):
        cls.load(tmp_path / "probe")


def test_a_probe_on_features_far_from_zero_reloads_to_the_same_scores(tmp_path):
    """Raw hidden states (no final norm) have means in the thousands, and a ridge intercept on them is as large:
    the probe keeps the fitted float64, so its reload scores every row exactly as the fitted readout did."""
    rng = np.random.default_rng(5)
    X = (rng.normal(size=(20_000, 8)) + 20_000).astype(np.float32)
    y = (X[:, 0] - 20_000 + 0.3 * rng.normal(size=20_000) > 0).astype(int)
    for cls in (RidgeReadout, LogisticReadout):
        est = cls(alphas=[1e-3]).fit(X, y)
        back = cls.load(est.save(tmp_path / cls.__name__))
        scores = "decision_function" if cls is RidgeReadout else "predict_proba"
        np.testing.assert_array_equal(getattr(back, scores)(X), getattr(est, scores)(X))


def test_a_readout_of_text_labels_is_refused_when_saved(tmp_path):
    X = np.random.default_rng(6).normal(size=(60, 4)).astype(np.float32)
    est = LogisticReadout(alphas=[1.0]).fit(X, np.array(["a", "b", "c"] * 20))
    with pytest.raises(ReservoirError, match="expected a readout fitted on integer class labels to save; found <U1 "
                                             "classes such as \\['a', 'b', 'c'\\]"):
        est.save(tmp_path / "probe")
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    from reservoir.extract import ExtractConfig, run as run_extract

    root = tmp_path_factory.mktemp("lab")

    def make(name, **kw):
        params = {"n_train": 600, "n_test": 200, **kw.pop("task_params", {})}
        return run_extract(ExtractConfig(task="bit-xor", layers=2, out=str(root / name), task_params=params,
                                         **{"backbone": "tiny-gpt2", **kw}), progress=False)

    return {"a": make("a.zarr"), "b": make("b.zarr", task_params={"seed": 7}),
            "bert": make("bert.zarr", backbone="tiny-bert"), "root": root}


def test_fit_linear_results_carry_intervals_rows_and_curves(stores, tmp_path):
    results = fit_linear(stores["a"], train_sizes=[50, 200, None], results_dir=tmp_path, save=True)
    for r in results:
        m = r.metrics
        assert m["test_interval"][0] <= m["test_accuracy"] <= m["test_interval"][1]
        assert m["val_interval"][0] <= m["val_accuracy"] <= m["val_interval"][1]
        correct, heads = decode_rows(r.rows["test"])
        assert heads == 5 and len(correct) == 200  # bit XOR: 5 bits per row, each row counted once
        assert correct.sum() / (200 * 5) == pytest.approx(m["test_accuracy"])
        curve = m["learning_curve"]
        assert [p["n_train"] for p in curve] == [50, 200, 600]
        assert curve[-1]["test_accuracy"] == pytest.approx(m["test_accuracy"])  # 'all' is the fit itself
        assert (tmp_path / "a" / f"logistic-layer{r.config['layer']}.safetensors").is_file()
    saved = json.loads((tmp_path / "a" / "logistic-layer2.json").read_text())
    assert saved["rows"]["test"]["heads"] == 5 and saved["metrics"]["test_interval"] == results[2].metrics[
        "test_interval"]


def test_results_of_raw_features_sit_beside_those_of_normed_ones(stores, tmp_path):
    """--no-final-norm is another readout of the same layer: its results and probe never replace the normed ones."""
    normed = fit_linear(stores["a"], layers=[1], results_dir=tmp_path, save=True)[0]
    raw = fit_linear(stores["a"], layers=[1], results_dir=tmp_path, save=True, final_norm=False)[0]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "logistic-layer1.json", "logistic-layer1.probe.json", "logistic-layer1.safetensors",
        "logistic-nonorm-layer1.json", "logistic-nonorm-layer1.probe.json", "logistic-nonorm-layer1.safetensors"]
    res = CliRunner().invoke(main, ["fit-linear", str(stores["a"]), "--layer", "1", "--no-final-norm", "--save",
                                    "--train-sizes", "100,all", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert f"probes: {tmp_path / 'a'}/logistic-nonorm-layer<K>.safetensors" in res.output
    assert (tmp_path / "a" / "logistic-nonorm-learning-curve.png").is_file()
    assert not (tmp_path / "a" / "logistic-learning-curve.png").exists()
    for name, result, norm in (("logistic-layer1", normed, True), ("logistic-nonorm-layer1", raw, False)):
        saved = json.loads((tmp_path / "a" / f"{name}.json").read_text())
        assert saved["config"]["final_norm"] is norm  # (the CLI's run of raw features refitted the same)
        assert saved["metrics"]["test_accuracy"] == result.metrics["test_accuracy"]
        assert json.loads((tmp_path / "a" / f"{name}.probe.json").read_text())["final_norm"] is norm


def test_a_results_folder_has_one_writer_and_lies_outside_the_store(stores, tmp_path):
    """Two fit-linear runs into one folder would leave one's results beside the other's probes: the second is
    refused naming the first; and results are never written inside the store they read."""
    import os

    from reservoir.store.lock import StoreLock

    with StoreLock(tmp_path / "a"):  # another fit-linear writing this store's results folder
        with pytest.raises(ReservoirError, match=f"{tmp_path / 'a'} is being written by pid {os.getpid()}"):
            fit_linear(stores["a"], layers=[1], results_dir=tmp_path, save=True)
    assert not list((tmp_path / "a").glob("*.json"))
    with pytest.raises(ReservoirError, match="expected a results folder outside the input .*a.zarr; found one "
                                             "inside it"):
        fit_linear(stores["a"], layers=[1], results_dir=stores["a"])
    assert not (Path(stores["a"]) / "a").exists()  # nothing was written into the store
    assert fit_linear(stores["a"], layers=[1], results_dir=tmp_path)[0].config["layer"] == 1  # free again


def test_read_layers_reads_each_chunk_once_and_equals_load_layer(stores, monkeypatch):
    from reservoir.readouts.features import read_layers
    from reservoir.store import FeatureStore

    with FeatureStore.open(stores["a"]) as st:
        calls = []
        real = st.read_chunks
        monkeypatch.setattr(st, "read_chunks", lambda *a: calls.append(a) or real(*a))
        X, y = read_layers(st, "train", [0, 2])
        feature_reads = [c for c in calls if c[1] == "features"]
        assert sum(c1 - c0 for _, _, c0, c1 in feature_reads) == len(st.done("train"))  # every chunk, once
        for i, k in enumerate([0, 2]):
            Xk, yk = load_layer(st, "train", k)
            np.testing.assert_array_equal(X[i], Xk)
            np.testing.assert_array_equal(y, yk)


def test_probe_predicts_another_store_and_refuses_another_backbone(stores, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["fit-linear", str(stores["a"]), "--layer", "2", "--save", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    fitted = json.loads((tmp_path / "a" / "logistic-layer2.json").read_text())["metrics"]
    probe = tmp_path / "a" / "logistic-layer2"
    same = runner.invoke(main, ["predict", str(probe), str(stores["a"]), "--split", "test"])
    assert same.exit_code == 0, same.output
    assert f"accuracy {fitted['test_accuracy']:.2%}" in same.output  # the fit's own test accuracy, reproduced
    other = runner.invoke(main, ["predict", str(probe) + ".probe.json", str(stores["b"]),
                                 "--out", str(tmp_path / "b.npz")])
    assert other.exit_code == 0, other.output
    with np.load(tmp_path / "b.npz") as z:
        assert z["test_predictions"].shape == (200, 5) and z["train_predictions"].shape == (600, 5)
    refused = runner.invoke(main, ["predict", str(probe), str(stores["bert"]), "--out", str(tmp_path / "c.npz")])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [
        f"Error: {stores['bert']}: expected a store of the probe's backbone ({probe}.probe.json); found backbone.id "
        "= 'tiny-bert', the probe's is 'tiny-gpt2'"]
    assert not (tmp_path / "c.npz").exists()
    # two stores of one name (a.zarr, and an a.h5 elsewhere): the default file of one is not replaced by the other's
    import shutil

    (tmp_path / "elsewhere").mkdir()
    twin = tmp_path / "elsewhere" / stores["a"].name
    shutil.copytree(stores["a"], twin)
    default = tmp_path / "a" / f"logistic-layer2-{stores['a'].name.removesuffix('.zarr')}.predictions.npz"
    with np.load(default) as z:
        assert str(z["store"]) == str(stores["a"])
        before = z["test_predictions"].copy()
    clash = runner.invoke(main, ["predict", str(probe), str(twin), "--split", "test"])
    assert clash.exit_code == 2 and "(another store of the same name); pass --out" in clash.output
    with np.load(default) as z:
        assert np.array_equal(z["test_predictions"], before)
    assert runner.invoke(main, ["predict", str(probe), str(stores["a"]), "--split", "test"]).exit_code == 0


def test_a_probe_json_edited_after_saving_is_refused_and_an_older_probe_still_loads(stores, tmp_path):
    """The weights' sha256 in the JSON covers the weights file, whose header keeps the fields saying how the weights
    apply: a JSON whose layer was edited would apply layer 2's weights to layer 1's features without a word."""
    import hashlib

    from safetensors.numpy import load as st_load, save as st_save

    runner = CliRunner()
    res = runner.invoke(main, ["fit-linear", str(stores["a"]), "--layer", "2", "--save", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    info, weights = tmp_path / "a" / "logistic-layer2.probe.json", tmp_path / "a" / "logistic-layer2.safetensors"
    meta = json.loads(info.read_text())
    for key, value in (("layer", 1), ("pooling", "first"), ("final_norm", False)):
        info.write_text(json.dumps({**meta, key: value}))
        refused = runner.invoke(main, ["predict", str(info), str(stores["a"]), "--out", str(tmp_path / "p.npz")])
        assert refused.exit_code == 2 and not (tmp_path / "p.npz").exists()
        assert refused.output.strip().splitlines() == [
            f"Error: {info}: expected {key} = {meta[key]!r}, as the probe's weights were saved with; found {value!r} "
            "(the JSON was changed after it was saved); save the probe again"]
    # a probe saved before the header kept its fields: the weights alone, the JSON's sha256 of them
    blob = st_save(st_load(weights.read_bytes()))
    weights.write_bytes(blob)
    info.write_text(json.dumps({**meta, "weights_sha256": hashlib.sha256(blob).hexdigest()}))
    taken = runner.invoke(main, ["predict", str(info), str(stores["a"]), "--split", "test", "--out",
                                 str(tmp_path / "p.npz")])
    assert taken.exit_code == 0, taken.output
    assert f"accuracy {meta['fit']['test_accuracy']:.2%}" in taken.output


def test_a_probe_gives_no_accuracy_on_labels_it_was_never_fitted_on(tmp_path):
    """A probe of classes {0, 7} on a store labelled {0, 1}: it cannot be right on class 1, so the accuracy it would
    print (22%) says nothing; the predictions are still written."""
    from reservoir import TaskData
    from reservoir.extract import ExtractConfig, run as run_extract

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3, 4)).astype(np.float32)
    sign = (x[:, -1, 0] > 0).astype(np.int64)
    paths = {}
    for name, labels in (("seven", sign * 7), ("one", sign)):
        task = TaskData.from_arrays(name, train=(x[:200], labels[:200]), test=(x[200:], labels[200:]))
        paths[name] = run_extract(ExtractConfig(task=name, backbone="tiny-gpt2", layers=1,
                                                out=str(tmp_path / f"{name}.zarr")), progress=False, task=task)
    runner = CliRunner()
    fit = runner.invoke(main, ["fit-linear", str(paths["seven"]), "--layer", "1", "--save", "--results",
                               str(tmp_path / "r")])
    assert fit.exit_code == 0, fit.output
    res = runner.invoke(main, ["predict", str(tmp_path / "r" / "seven" / "logistic-layer1"), str(paths["one"]),
                               "--out", str(tmp_path / "p.npz")])
    assert res.exit_code == 0, res.output
    assert "test: 100 rows, no accuracy: its labels include classes the probe was not fitted on (1)" in res.output
    assert "accuracy 2" not in res.output and "accuracy 1" not in res.output
    with np.load(tmp_path / "p.npz") as z:
        assert set(np.unique(z["test_predictions"])) <= {0, 7}


def test_fit_linear_refuses_one_train_class_warns_of_unseen_test_classes_and_keeps_no_stale_probe(tmp_path, caplog):
    from reservoir import TaskData
    from reservoir.extract import ExtractConfig, run as run_extract
    from reservoir.readouts import fit_linear

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3, 4)).astype(np.float32)
    sign = (x[:, -1, 0] > 0).astype(np.int64)

    def store(name, train_labels, test_labels):
        task = TaskData.from_arrays(name, train=(x[:200], train_labels), test=(x[200:], test_labels))
        return run_extract(ExtractConfig(task=name, backbone="tiny-gpt2", layers=1, out=str(tmp_path / f"{name}.zarr")),
                           progress=False, task=task)

    one = store("one", np.zeros(200, np.int64), sign[200:])
    with pytest.raises(ReservoirError, match="expected at least two classes in the train split; found only class 0"):
        fit_linear(one, layers=[1], results_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    unseen = store("unseen", sign[:200], sign[200:] + 2 * (np.arange(100) < 25))  # 25 test rows of class 2 or 3
    with caplog.at_level("WARNING", logger="reservoir"):
        (fitted,) = fit_linear(unseen, layers=[1], results_dir=tmp_path / "u", save=True)
    assert "split 'test' holds class(es) 2, 3 that the train split lacks: no readout predicts them" in caplog.text
    taken = CliRunner().invoke(main, ["predict", str(tmp_path / "u" / "unseen" / "logistic-layer1"), str(unseen),
                                      "--split", "test"])  # the probe on its own store: fit-linear's accuracy
    assert taken.exit_code == 0, taken.output
    assert (f"test: 100 rows, accuracy {fitted.metrics['test_accuracy']:.2%}" in taken.output and
            "rows of class(es) 2, 3, which the train split lacks, count as wrong" in taken.output)
    from reservoir.readouts.probes import predict_store

    (split,) = predict_store(tmp_path / "u" / "unseen" / "logistic-layer1", unseen, "test")  # a name, not letters
    assert split == "test"

    fine = store("fine", sign[:200], sign[200:])
    fit_linear(fine, layers=[1], results_dir=tmp_path / "r", save=True)
    folder = tmp_path / "r" / "fine"
    assert {p.name for p in folder.iterdir()} >= {"logistic-layer1.safetensors", "logistic-layer1.probe.json"}
    fit_linear(fine, layers=[1], results_dir=tmp_path / "r", seed=5)  # refitted, not saved: the old probe goes
    assert sorted(p.name for p in folder.iterdir()) == ["logistic-layer1.json"]


def test_table_columns_stay_in_line_when_an_interval_reaches_100():
    from reservoir.cli.readouts import _cell

    cells = [_cell(0.5, (0.4, 0.6)), _cell(1.0, (0.974, 1.0)), _cell(None, None)]
    assert [len(c) for c in cells] == [24, 24, 24] and all(c.endswith(" ") for c in cells)
    assert cells[0] == " 50.00% [40.00, 60.00]  " and cells[1] == "100.00% [97.40, 100.00] "


def test_cli_prints_intervals_timing_and_learning_curve(stores, tmp_path):
    res = CliRunner().invoke(main, ["fit-linear", str(stores["a"]), "--train-sizes", "100,all",
                                    "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:4] == ["layer", "train", "val", "[95%"]
    assert "fits: " in res.output and "for 3 layer(s), 8 L2 strength(s) each; store read" in res.output
    assert "learning curve: test accuracy [95% CI] by training rows" in res.output
    assert not [line for line in lines if line != line.rstrip()]  # no trailing blanks (the curve's header had)
    assert (tmp_path / "a" / "logistic-learning-curve.png").stat().st_size > 1000
    bad = CliRunner().invoke(main, ["fit-linear", str(stores["a"]), "--train-sizes", "100,ten"])
    assert bad.exit_code == 2 and "expected row counts like 100,1000,all; found 'ten'" in bad.output


def test_standardized_penalty_matches_sklearn_on_badly_conditioned_features():
    """The standardized penalty, fitted in a rotated whitened basis with a per-strength preconditioner, is
    scikit-learn's L2 logistic regression on standardized features (an independent solver), and converges in
    few iterations where feature scales span four orders of magnitude."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from reservoir.readouts import LogisticReadout

    rng = np.random.default_rng(0)
    n, d, C = 3000, 60, 4
    A = rng.normal(size=(d, d)) * np.logspace(0, -4, d)[None, :]
    X = (rng.normal(size=(n, d)) @ A.T).astype(np.float32)
    y = (X @ rng.normal(size=(d, C)) * 3 + rng.normal(size=(n, C))).argmax(1)
    Z = StandardScaler().fit_transform(X.astype(np.float64))
    for alpha in (1e-1, 1e-3):
        ours = LogisticReadout(alphas=[alpha], penalty="standardized", tol=1e-10, max_iter=2000).fit(X, y)
        sk = LogisticRegression(C=1 / (alpha * n), tol=1e-10, max_iter=20_000).fit(Z, y)
        assert ours.n_iter_ < 200
        np.testing.assert_allclose(ours.predict_proba(X), sk.predict_proba(Z), atol=1e-2)


def test_a_learning_curve_below_the_carve_is_refused_without_a_val_split(tmp_path):
    """Fewer than 10 training rows are never split for validation: a curve's point there would fit the weakest
    strength, unlike every other point. Without a val split such a size is refused; a store that small says so."""
    from reservoir import TaskData, extract, load_backbone

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 8, (40, 6)), np.arange(40) % 2

    def store(name, n_train, **val):
        task = TaskData.from_arrays(name, train=(x[:n_train], y[:n_train]), test=(x[30:], y[30:]), **val)
        return extract(task, load_backbone("tiny-gpt2", d_in=task.d_in), tmp_path / f"{name}.zarr", layers=1,
                       device="cpu", progress=False)

    with store("plain", 30) as st:
        with pytest.raises(ReservoirError, match=r"expected train sizes of at least 10 rows on a store without a val "
                                                 r"split .* found 6"):
            fit_linear(st, [1], train_sizes=[6, None])
        assert fit_linear(st, [1])[0].config["validation"] == "carved from train"
    with store("with-val", 30, val=(x[20:30], y[20:30])) as st:
        curve = fit_linear(st, [1], train_sizes=[6, None])[0].metrics["learning_curve"]
        assert [p["n_train"] for p in curve] == [6, 30]
    with store("tiny", 8) as st:
        assert fit_linear(st, [1])[0].config["validation"] == ("none (fewer than 10 training rows: the weakest "
                                                               "strength is fitted)")


def test_a_learning_curve_subset_of_one_class_predicts_that_class(tmp_path):
    """The readouts refuse one class (as scikit-learn does); a curve's small subset can hold one, and the curve then
    died with that refusal. Such a point is the constant predictor of that class."""
    from reservoir import TaskData, extract, load_backbone

    rng = np.random.default_rng(0)
    y = np.zeros(200, np.int64)
    y[:1] = 1  # 1 of 200 rows of class 1: a subset of 10 rows is almost surely all 0
    yt = (rng.random(50) < 0.3).astype(np.int64)
    task = TaskData.from_arrays("imbalanced", train=(rng.integers(0, 8, (200, 6)), y),
                                test=(rng.integers(0, 8, (50, 6)), yt))
    store = extract(task, load_backbone("tiny-gpt2", d_in=task.d_in), tmp_path / "s.zarr", layers=1, device="cpu",
                    progress=False)
    with store:
        for readout in ("logistic", "ridge"):
            curve = fit_linear(store, [1], readout, train_sizes=[10, None])[0].metrics["learning_curve"]
            point = curve[0]
            assert point["n_train"] == 10 and point["alpha"] is None and point["one_class"] == 0
            assert point["test_accuracy"] == pytest.approx((yt == 0).mean())
            lo, hi = point["test_interval"]
            assert lo <= point["test_accuracy"] <= hi
            assert curve[1]["alpha"] is not None and "one_class" not in curve[1]
