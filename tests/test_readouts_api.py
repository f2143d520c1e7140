"""The readouts' Python API: typed results out, store and task objects in, files written only when asked."""

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from reservoir.bench.readout import ReadoutBenchResult, readout_vs_sklearn
from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.readouts import FitResult, fit_linear, fit_raw
from reservoir.store import FeatureStore

FIT_LINEAR_KEYS = ["kind", "config", "store", "metrics", "timings", "rows", "environment", "written"]
CONFIG_KEYS = ["store", "layer", "readout", "seed", "final_norm", "alphas", "validation", "stream", "train_sizes",
               "pooling"]
METRIC_KEYS = ["train_accuracy", "val_accuracy", "val_interval", "test_accuracy", "test_interval", "alpha",
               "val_scores", "n_train", "n_test", "chance", "interval"]

# A fit-linear result as a recipe run wrote it before FitResult existed (store fingerprint shortened).
OLD_FIT_LINEAR = {
    "kind": "fit-linear",
    "config": {"store": "cache/recipes/e281996271ae.zarr", "layer": 1, "readout": "logistic", "seed": 0,
               "final_norm": True, "alphas": [0.01, 0.1, 1.0, 10.0], "validation": "carved from train",
               "stream": False},
    "store": {"schema": "reservoir.features/1", "backbone": {"id": "sentence-transformers/all-MiniLM-L6-v2"},
              "layers": [0, 1, 2, 3, 4, 5, 6], "reservoir_version": "0.1.0.dev0",
              "created": "2026-11-26T05:12:56+00:00"},
    "metrics": {"train_accuracy": 0.255, "val_accuracy": 0.2175, "test_accuracy": 0.221, "alpha": 1.0,
                "val_scores": {"10.0": 0.19, "1.0": 0.2175, "0.1": 0.1825, "0.01": 0.17}, "n_train": 4000,
                "n_test": 1000, "chance": 0.16},
    "timings": {"load_s": 0.06034713400003966, "fit_s": 0.7053555390000383},
    "recipe": {"name": "cpu-listops-depth", "run": "fit-linear__listops__minilm__random__d6__seed0", "cell": "cells[0]",
               "seed": 0},
    "environment": {"reservoir_version": "0.1.0.dev0", "python": "3.11.7", "torch": "2.13.0+cpu"},
    "written": "2026-11-26T05:14:41+00:00",
}


def _json(obj):
    """``obj`` as it comes back from a JSON file."""
    return json.loads(json.dumps(obj, default=float))


@pytest.fixture(scope="module")
def xor_store(tmp_path_factory):
    """Three-bit XOR through tiny GPT-2 in an HDF5 store (the other backend than test_readouts' Zarr)."""
    from reservoir.extract import ExtractConfig, run as run_extract

    config = ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=2, task_params={"n_bits": 3, "n_train": 120,
                           "n_test": 50}, out=str(tmp_path_factory.mktemp("api") / "s.h5"))
    return run_extract(config, progress=False)


def test_fit_linear_writes_nothing_without_results_dir(xor_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the old default wrote results/fit-linear here
    seen = []
    results = fit_linear(xor_store, layers=[1, 2], on_result=seen.append)
    assert list(tmp_path.iterdir()) == []
    assert [type(r) for r in results] == [FitResult, FitResult] and seen == [None, *results]
    assert [r.config["layer"] for r in results] == [1, 2] and results[0].kind == "fit-linear"
    assert list(results[0].to_dict()) == FIT_LINEAR_KEYS[:6]
    assert list(results[0].config) == CONFIG_KEYS and list(results[0].metrics) == METRIC_KEYS


def test_a_fit_whose_folder_lock_file_is_removed_stops_before_its_next_write(xor_store, tmp_path):
    from reservoir.readouts.naming import results_folder
    from reservoir.store.lock import lock_path

    folder = results_folder(tmp_path, xor_store)

    def removed_after_the_first(result):  # the lock file removed by hand while layer 2 is fitted
        if result is not None and result.config["layer"] == 1:
            lock_path(folder).unlink()

    with pytest.raises(ReservoirError, match=r"expected this writer's lock file .*\.lock in place; found it removed"):
        fit_linear(xor_store, layers=[1, 2], results_dir=tmp_path, on_result=removed_after_the_first)
    assert sorted(p.name for p in folder.iterdir()) == ["logistic-layer1.json"]  # layer 2 never written


def test_fit_linear_takes_a_store_object_and_leaves_it_open(xor_store):
    by_path = fit_linear(xor_store, layers=[2], readout="ridge")[0]
    with FeatureStore.open(xor_store) as st:
        by_object = fit_linear(st, layers=[2], readout="ridge")[0]
        assert st.features("test").shape[0] == 50  # still readable: the caller's store stays open
    assert by_object.metrics == by_path.metrics and by_object.store == by_path.store
    assert by_object.config == by_path.config and by_object.config["store"] == str(xor_store)


def test_fit_result_file_round_trip(xor_store, tmp_path):
    (result,) = fit_linear(xor_store, layers=[2], results_dir=tmp_path)
    path = tmp_path / "s" / "logistic-layer2.json"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [path.name]
    raw = json.loads(path.read_text())
    assert list(raw) == FIT_LINEAR_KEYS and list(raw["config"]) == CONFIG_KEYS and list(raw["metrics"]) == METRIC_KEYS
    back = FitResult.read(path)
    assert back.to_dict() == raw  # every key, in the file's order
    assert {k: v for k, v in raw.items() if k not in ("environment", "written")} == _json(result.to_dict())
    assert set(back.extra) == {"environment", "written"}
    assert FitResult.from_dict(result.to_dict()) == result


def test_results_written_before_fit_result_load(tmp_path):
    path = tmp_path / "logistic-layer1.json"
    path.write_text(json.dumps(OLD_FIT_LINEAR, indent=2))
    r = FitResult.read(path)
    assert r.kind == "fit-linear" and r.config["layer"] == 1 and r.metrics["test_accuracy"] == 0.221
    assert r.task is None and set(r.extra) == {"recipe", "environment", "written"}
    assert r.to_dict() == OLD_FIT_LINEAR and list(r.to_dict()) == list(OLD_FIT_LINEAR)


@pytest.mark.parametrize(("change", "message"), [({"kind": "train"}, "kind 'train'"),
                                                 ({"metrics": None}, "without metrics")])
def test_fit_result_refuses_other_files(tmp_path, change, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({k: v for k, v in {**OLD_FIT_LINEAR, **change}.items() if v is not None}))
    with pytest.raises(ReservoirError, match=message) as err:
        FitResult.read(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_fit_raw_takes_a_task_object_and_the_cli_writes_its_result(tmp_path):
    from reservoir.tasks import get_task

    out = tmp_path / "digits.json"
    r = CliRunner().invoke(main, ["fit-raw", "--task", "digits", "--out", str(out)])
    assert r.exit_code == 0, r.output
    raw = json.loads(out.read_text())
    assert list(raw) == ["kind", "config", "task", "metrics", "timings", "rows", "environment", "written"]
    by_name = FitResult.read(out)
    assert f"test {by_name.metrics['test_accuracy']:.2%}" in r.output
    task = get_task("digits")
    by_object = fit_raw(task)  # the same arrays as the name builds: the same fit
    got = {k: v for k, v in _json(by_object.to_dict()).items() if k != "timings"}
    assert got == {k: v for k, v in raw.items() if k not in ("timings", "environment", "written")}
    with pytest.raises(ReservoirError, match="task_params apply to a task name"):
        fit_raw(task, {"seed": 1})
    with pytest.raises(ReservoirError, match="unknown readout 'lasso'"):
        fit_raw(task, readout="lasso")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_bench_readout_result(tmp_path, monkeypatch):
    import reservoir.bench
    from reservoir.extract import ExtractConfig, run as run_extract
    from reservoir.readouts.logistic import DEFAULT_ALPHAS

    store = run_extract(ExtractConfig(task="digits", backbone="tiny-gpt2", layers=1, out=str(tmp_path / "d.zarr"),
                                  task_params={"patch": 4}), progress=False)
    with FeatureStore.open(store) as st:
        r = readout_vs_sklearn(st, max_iter=100)  # every layer: 0 and 1
        (cut,) = readout_vs_sklearn(st, 1, max_iter=1).per_layer  # every scikit-learn fit stops at max_iter
    assert cut["sklearn"]["unconverged"] == len(DEFAULT_ALPHAS) + 1
    assert isinstance(r, ReadoutBenchResult) and (r.n_train, r.n_features, r.layers) == (1437, 32, [0, 1])
    assert (r.penalty, r.path_rows) == ("standardized", "all")  # scikit-learn's model, on scikit-learn's rows
    for p in r.per_layer:
        assert p["reservoir"]["alpha"] in DEFAULT_ALPHAS
        # C = 1 / (alpha * n) over the readout's grid, selected on the readout's 1437 - 144 rows, and the chosen
        # alpha's C refitted on all 1437 (as the readout's final fit)
        assert p["sklearn"]["alpha"] in DEFAULT_ALPHAS
        assert p["sklearn"]["C"] == pytest.approx(1 / (p["sklearn"]["alpha"] * 1437))
    for side in (r.per_layer[1]["reservoir"], r.per_layer[1]["sklearn"]):  # ten digit classes: chance is about 0.1
        assert side["test_interval"][0] <= side["test_accuracy"] > 0.5
    assert r.time_ratio == pytest.approx(r.sklearn_s / r.reservoir_s)
    assert r.sklearn_s == pytest.approx(sum(p["sklearn"]["fit_s"] for p in r.per_layer))
    assert r.max_accuracy_gap == pytest.approx(max(abs(p["reservoir"]["test_accuracy"] - p["sklearn"]["test_accuracy"])
                                                   for p in r.per_layer))
    monkeypatch.setattr(reservoir.bench, "readout_vs_sklearn", lambda *args, **kwargs: r)  # the CLI prints and writes
    out = tmp_path / "bench.json"
    cli = CliRunner().invoke(main, ["bench", "readout", str(store), "--out", str(out)])
    assert cli.exit_code == 0, cli.output
    raw = json.loads(out.read_text())
    assert list(raw) == ["kind", "store", "layers", "n_train", "n_features", "per_layer", "reservoir_s", "sklearn_s",
                         "time_ratio", "max_accuracy_gap", "torch_threads", "penalty", "path_rows", "environment",
                         "written"]
    assert raw["kind"] == "bench-readout" and ReadoutBenchResult.read(out).to_dict() == raw
    assert f"scikit-learn / reservoir wall time: {r.time_ratio:.1f}x" in cli.output


def test_bench_readout_gives_two_classes_scikit_learns_c_of_the_same_penalty_and_selects_on_the_stores_val(tmp_path):
    """The readout penalises one weight vector per class; scikit-learn's binary model one vector (the difference):
    the same L2 strength is C = 2 / (alpha n) there. A store's val split is what both sides select on."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from reservoir import TaskData
    from reservoir.extract import ExtractConfig, run as run_extract
    from reservoir.readouts.logistic import LogisticReadout

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    y = (X @ rng.normal(size=6) + 0.8 * rng.normal(size=400) > 0).astype(np.int64)
    alpha = 0.01
    ours = LogisticReadout(alphas=[alpha], penalty="standardized").fit(X, y)
    sk = make_pipeline(StandardScaler(), LogisticRegression(C=2 / (alpha * len(y)), tol=1e-10, max_iter=10_000))
    np.testing.assert_allclose(ours.predict_proba(X), sk.fit(X, y).predict_proba(X), atol=2e-4)

    seqs = rng.normal(size=(360, 3, 4)).astype(np.float32)
    labels = (seqs[:, -1, 0] > 0).astype(np.int64)
    task = TaskData.from_arrays("two", train=(seqs[:200], labels[:200]), val=(seqs[200:280], labels[200:280]),
                                test=(seqs[280:], labels[280:]))
    store = run_extract(ExtractConfig(task="two", backbone="tiny-gpt2", layers=1, out=str(tmp_path / "t.zarr")),
                        progress=False, task=task)
    (layer,) = readout_vs_sklearn(store, 1).per_layer
    assert layer["sklearn"]["C"] == pytest.approx(2 / (layer["sklearn"]["alpha"] * 200))  # every train row: val is
    assert layer["reservoir"]["alpha"] == LogisticReadout(penalty="standardized").fit(  # the store's own
        *_layer(store, "train", 1), validation_data=_layer(store, "val", 1)).alpha_


def _layer(store, split, k):
    from reservoir.readouts.features import read_layers

    with FeatureStore.open(store) as st:
        (X,), y = read_layers(st, split, [k])
    return X, y


def test_fit_raw_and_train_refuse_a_train_split_of_one_class():
    """As fit-linear: a train split of one class has nothing to learn (fit-raw reported 100% train, 38% test)."""
    from reservoir import TaskData
    from reservoir.training import TrainData

    x = np.random.default_rng(0).normal(size=(60, 3, 2)).astype(np.float32)
    task = TaskData.from_arrays("onec", train=(x[:40], np.zeros(40, np.int64)), test=(x[40:], np.arange(20) % 2))
    with pytest.raises(ReservoirError, match="task 'onec': expected at least two classes in the train split; found "
                                             "only class 0"):
        fit_raw(task)
    with pytest.raises(ReservoirError, match="expected at least two classes in the train split"):
        TrainData.from_task(task)


def test_fit_raw_refuses_splits_of_other_lengths_in_one_line(tmp_path):
    """Each split flattened to its own width: a test split of 9 positions against train's 6 was a scikit-learn
    traceback from the fitted readout, from the CLI and a recipe alike."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", train_inputs=rng.normal(size=(40, 6, 2)).astype(np.float32),
             train_labels=rng.integers(0, 3, 40), test_inputs=rng.normal(size=(20, 9, 2)).astype(np.float32),
             test_labels=rng.integers(0, 3, 20))
    r = CliRunner().invoke(main, ["fit-raw", "--data", str(tmp_path / "d.npz"), "--out", str(tmp_path / "f.json")])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert ("a raw-input baseline needs inputs of one shape per row in every split of 'data-d' (positions x "
            "numbers); found train 6 x 2, test 9 x 2") in r.output
    assert not (tmp_path / "f.json").exists()


def test_a_result_without_validation_is_strict_json_and_reads_back(tmp_path):
    """Too few rows to hold out validation: the file says null (strict JSON), and reads, reports and skips."""
    from reservoir.recipes.state import finished

    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(data, train_inputs=rng.normal(size=(8, 4, 3)).astype(np.float32), train_labels=np.arange(8) % 2,
             test_inputs=rng.normal(size=(20, 4, 3)).astype(np.float32), test_labels=np.arange(20) % 2)
    out = tmp_path / "tiny.json"
    r = CliRunner().invoke(main, ["fit-raw", "--data", str(data), "--out", str(out)])
    assert r.exit_code == 0, r.output
    raw = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert raw["metrics"]["val_accuracy"] is None and raw["metrics"]["val_interval"] == [None, None]
    assert FitResult.read(out).metrics["val_accuracy"] is None and finished(out)


def test_stores_of_one_name_do_not_mix_their_results(xor_store, tmp_path):
    """Results go to a folder named after the store (less its format's suffix only); a second store of the same
    name is refused before any fit instead of replacing the first one's results."""
    import shutil
    from pathlib import Path

    from reservoir.readouts.naming import store_stem

    assert [store_stem(p) for p in ("c/xor.zarr", "xor.digits.zarr", "s3://b/k/xor.zarr/", "x.H5", "plain")] == \
        ["xor", "xor.digits", "xor", "x", "plain"]
    results = tmp_path / "r"
    fit_linear(xor_store, layers=[2], results_dir=results)
    fit_linear(str(xor_store), layers=[2], results_dir=results)  # the same store again: replaced
    twin = tmp_path / "elsewhere" / Path(xor_store).name
    twin.parent.mkdir()
    shutil.copy(xor_store, twin)
    with pytest.raises(ReservoirError, match="another store of the same name") as err:
        fit_linear(twin, layers=[2], results_dir=results)
    assert str(twin) in str(err.value) and "\n" not in str(err.value)
    assert FitResult.read(results / "s" / "logistic-layer2.json").config["store"] == str(xor_store)
    fit_linear(twin, layers=[2], results_dir=tmp_path / "r2")  # another folder: fine


def test_the_same_store_is_refitted_from_any_working_folder(xor_store, tmp_path, monkeypatch):
    """A results file recorded the store's path as typed (``s/xor.zarr``): fitted again from inside ``s``, or by its
    absolute path, the same store was refused as another store of the same name. Results record it absolute."""
    import json
    import shutil

    store = tmp_path / "s" / "xor.h5"
    store.parent.mkdir()
    shutil.copy(xor_store, store)
    monkeypatch.chdir(tmp_path)
    fit_linear("s/xor.h5", layers=[2], results_dir="res")
    path = tmp_path / "res" / "xor" / "logistic-layer2.json"
    assert FitResult.read(path).config["store"] == str(store)
    monkeypatch.chdir(tmp_path / "s")
    fit_linear("xor.h5", layers=[2], results_dir="../res")
    fit_linear(str(store), layers=[2], results_dir=tmp_path / "res")
    saved = json.loads(path.read_text())
    saved["config"]["store"] = "s/xor.h5"  # as earlier versions recorded it, relative to a folder unknown now
    path.write_text(json.dumps(saved))
    fit_linear("xor.h5", layers=[2], results_dir="../res")
    other = tmp_path / "other" / "xor.h5"  # another store of the same name is still refused
    other.parent.mkdir()
    shutil.copy(store, other)
    with pytest.raises(ReservoirError, match="another store of the same name"):
        fit_linear(other, layers=[2], results_dir=tmp_path / "res")


def test_results_of_another_extraction_at_the_same_path_are_refused_not_mixed(tmp_path):
    """A store deleted and extracted again from other data (or settings): its results would sit beside the old
    extraction's; refused before any fit. The same data extracted again, or to another depth, keeps them."""
    import shutil

    from reservoir.extract import ExtractConfig, run as run_extract

    store, results = tmp_path / "x.zarr", tmp_path / "r"

    def extract(layers, **params):
        shutil.rmtree(store, ignore_errors=True)
        run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=layers, out=str(store),
                                  task_params={"n_train": 48, "n_test": 24, **params}), progress=False)

    extract(2)
    fit_linear(store, layers="all", results_dir=results)
    extract(1)  # the same data and settings, fewer layers: the same layer 0 and 1 features
    fit_linear(store, layers=[1], results_dir=results)
    extract(2, seed=7)  # other data
    with pytest.raises(ReservoirError, match=r"expected results of this extraction of .*x\.zarr or none; found "
                                             r"logistic-layer0\.json from another extraction at that path "
                                             r"\(task\.(fingerprint|params\.seed)=") as err:
        fit_linear(store, layers=[2], results_dir=results)
    assert "\n" not in str(err.value)
    assert FitResult.read(results / "x" / "logistic-layer2.json").store["task"]["params"].get("seed", 0) != 7


def test_a_learning_curve_with_streaming_names_both_options(xor_store):
    with pytest.raises(ReservoirError, match=r"^expected --train-sizes without --stream on \(a learning curve refits "
                                             r"in memory\); found both$"):
        fit_linear(xor_store, layers=[1], train_sizes=[20, "all"], stream=True)


def test_a_store_whose_name_leaves_no_results_folder_is_refused(xor_store, tmp_path):
    """``...h5`` less its suffix is ``..``: its results went one folder above the results folder given."""
    import shutil

    (tmp_path / "s").mkdir()
    for name, stem in (("...h5", r"\.\."), ("..h5", r"\.")):
        odd = tmp_path / "s" / name
        shutil.copy(xor_store, odd)
        with pytest.raises(ReservoirError, match=r"expected a store whose name \(less its suffix\) names its results "
                                                 f"folder inside .*; found '{stem}' \\(rename the store\\)$"):
            fit_linear(odd, layers=[1], results_dir=tmp_path / "r" / "fit-linear")
    assert not (tmp_path / "r").exists()


def test_entry_points_refuse_what_is_not_a_store_in_one_line(xor_store):
    for call in (lambda: fit_linear(123), lambda: readout_vs_sklearn(["s.h5"])):
        with pytest.raises(ReservoirError, match=r"^expected a store: a path \(.zarr or .h5\), a store URL or a "
                                                 r"FeatureStore; found "):
            call()


def test_one_parser_of_layers_a_layer_named_twice_is_refused(xor_store, tmp_path):
    """fit_linear, the CLI and bench readout read layers alike: a layer named twice is refused (not fitted and
    written twice, nor dropped), and a string other than 'all' is refused by what it is, not as a missing layer."""
    from reservoir.extract import ExtractConfig, run as run_extract

    digits = run_extract(ExtractConfig(task="digits", backbone="tiny-gpt2", layers=1, out=str(tmp_path / "d.zarr")),
                         progress=False)  # one label a row: what the scikit-learn comparison takes
    assert [r.config["layer"] for r in fit_linear(xor_store, layers=[2, 1], readout="ridge")] == [2, 1]
    for call in (lambda: fit_linear(xor_store, layers=[2, 1, 2]), lambda: readout_vs_sklearn(digits, layers=[1, 1])):
        with pytest.raises(ReservoirError, match=r"--layer: expected each layer once; found layer \d twice"):
            call()
    for call in (lambda: fit_linear(xor_store, layers="1"), lambda: readout_vs_sklearn(digits, layers="1")):
        with pytest.raises(ReservoirError, match="expected layers 'all', a layer or a list of layers; found '1'"):
            call()


def test_extract_resumes_through_an_open_hdf5_handle(tmp_path):
    """A store handle given as ``out`` names the store to go on with, HDF5 (which refuses a second open to write
    while it is open to read) as Zarr."""
    from reservoir import extract, get_task, load_backbone

    task = get_task("bit-xor", n_bits=3, n_train=40, n_test=20)
    bb = load_backbone("tiny-gpt2", d_in=task.d_in, depth=1)
    with extract(task, bb, tmp_path / "x.h5", layers=1, progress=False) as first:
        again = extract(task, bb, first, layers=1, progress=False)
    with again:
        assert first.closed and again.complete and again.path == first.path


def test_layers_are_read_in_blocks_of_the_stored_dtypes_bytes(tmp_path, monkeypatch):
    """read_layers reads READ_BYTES at a time whatever the stored dtype: a float32 store in blocks of half the rows
    of a float16 one."""
    import reservoir.readouts.features as features
    import reservoir.store.files
    from reservoir.extract import ExtractConfig, run as run_extract
    from reservoir.store.checks import CheckedArray

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 1)  # 64 rows in chunks of one row

    reads = {}
    real = CheckedArray.__getitem__

    def counting(self, key):
        reads[self.dtype.itemsize] = reads.get(self.dtype.itemsize, 0) + 1
        return real(self, key)

    for dtype in ("float16", "float32"):
        path = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=1, dtype=dtype,
                                         task_params={"n_bits": 3, "n_train": 64, "n_test": 16},
                                         out=str(tmp_path / f"{dtype}.zarr")), progress=False)
        with FeatureStore.open(path) as st:
            row_bytes = int(np.prod(st.features("train").shape[1:])) * np.dtype(dtype).itemsize
            monkeypatch.setattr(features, "READ_BYTES", st.chunk_rows("train") * row_bytes)  # one chunk a read
            monkeypatch.setattr(CheckedArray, "__getitem__", counting)
            features.read_layers(st, "train", [1])
            monkeypatch.setattr(CheckedArray, "__getitem__", real)
            assert st.chunk_rows("train") == 1 and reads[np.dtype(dtype).itemsize] == 64


def test_a_store_opened_to_write_is_refused_before_zarr_empties_it(tmp_path):
    """``FeatureStore.open(path, mode="w")`` went to Zarr, which emptied the store before the schema check."""
    from reservoir.extract import ExtractConfig, run as run_extract

    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=1, out=str(tmp_path / "s.zarr"),
                                      task_params={"n_train": 40, "n_test": 20}), progress=False)
    for mode in ("w", "r+", "a"):
        with pytest.raises(ReservoirError, match=rf"expected mode 'r' .*; found '{re.escape(mode)}'"):
            FeatureStore.open(store, mode=mode)
    with FeatureStore.open(store) as st:  # whole: it reads as before
        assert st.complete and st.verify() == {}
        view = st.features("train")
    with pytest.raises(ReservoirError, match="expected an open store; found it closed") as err:
        view[:5]  # read after close: the plain line, not a damaged store to extract again
    assert "damaged" not in str(err.value)


def test_readouts_score_only_labels_of_their_predictions_shape(tmp_path):
    """Labels ``(N, 1)`` against predictions ``(N,)`` were compared by broadcasting, an ``(N, N)`` table: 0.50
    where the readout scored 0.95; a label column of one label a row is read as the labels."""
    from reservoir import LogisticReadout, RidgeReadout

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 8)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    for cls in (LogisticReadout, RidgeReadout):
        est = cls().fit(X[:300], y[:300])
        right = est.score(X[300:], y[300:])
        assert est.score(X[300:], y[300:, None]) == right
        with pytest.raises(ValueError, match=r"expected labels of shape \(100,\), one per prediction; found \(1,\)"):
            est.score(X[300:], y[300:301])
    est = LogisticReadout().fit(X[:300], y[:300])
    with pytest.raises(ReservoirError, match="found 'alpha', 'readout', which the probe records itself"):
        est.save(tmp_path / "p", readout="RidgeReadout", alpha=123.0)
    assert not (tmp_path / "p.safetensors").exists()
    import torch

    device = LogisticReadout(device=torch.device("cpu")).fit(X[:300], y[:300])  # a torch.device: kept by name
    assert LogisticReadout.load(device.save(tmp_path / "d")).get_params()["device"] == "cpu"


def test_python_calls_with_values_of_the_wrong_kind_are_one_line(xor_store):
    from reservoir.readouts import load_layer
    from reservoir.training import TrainConfig

    with pytest.raises(ReservoirError, match=r"expected train_sizes as a list of integers >= 2 or 'all'"):
        fit_linear(xor_store, [2], train_sizes=100)
    for layer in (True, 2.0, "2"):  # read as layer 1, layer 2, or said as "found 2"
        with pytest.raises(ReservoirError, match=rf"expected a layer among \[0, 1, 2\], found {layer!r}"):
            load_layer(xor_store, "train", layer)
    for rows in (-1, 0, 7.5):
        with pytest.raises(ReservoirError, match=rf"rows read at a time \(chunk_rows\) .*; found {rows!r}"):
            load_layer(xor_store, "train", 2, chunk_rows=rows)
    with pytest.raises(ReservoirError, match="expected steps or epochs, not both; found steps 20 and epochs 3"):
        TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=20, epochs=3.0)
