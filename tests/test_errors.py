"""Bad input anywhere gives one line and exit status 2 (README "Errors"), case by case.

Devices, unwritable results folders, malformed IDX files, JSON that Python
cannot parse (deep nesting, bad bytes) in task parameters and every file the
package reads, malformed results files, out-of-range seeds, hub ids that are
neither built in, a folder, cached nor reachable, broken model folders, a
split list given as one name, non-stores, and non-finite features.
"""

from __future__ import annotations

import http.server
import json
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from reservoir.cli import main
from reservoir.errors import ReservoirError

TINY = ["--backbone", "tiny-gpt2", "--quiet"]
XOR = ["--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32"]
HUGE_SEED = str(2**70)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, *fragments) -> str:
    """Exit status 2, exactly one ``Error:`` line on stderr holding every fragment, no traceback."""
    assert result.exit_code == 2, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


def raises_one_line(fn, *fragments, kind=ReservoirError) -> str:
    with pytest.raises(kind) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A complete tiny bit-XOR store (layers 0..2)."""
    path = tmp_path_factory.mktemp("store") / "xor.zarr"
    r = invoke("extract", *XOR, *TINY, "--layers", "2", "--out", path)
    assert r.exit_code == 0, r.output
    return path


# ------------------------------------------------------------------ 1. devices


@pytest.mark.parametrize("device", ["foo", "mps", "cuda:x", "cuda"])
def test_fit_linear_refuses_bad_device_before_reading_the_store(tmp_path, device):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = invoke("fit-linear", tmp_path / "no-such.zarr", "--device", device, "--results", tmp_path / "res")
    one_line_error(r, repr(device))
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("command", [["train", *XOR, "--steps", "1"], ["bench", "extract", *XOR],
                                     ["bench", "speedup", *XOR]])  # fmt: skip
def test_other_commands_refuse_an_unknown_device(command):
    one_line_error(invoke(*command, "--backbone", "tiny-gpt2", "--device", "foo"), "unknown device 'foo'",
                   "cpu, cuda, cuda:N or auto")


def test_one_device_validator_for_the_python_api():
    import torch

    from reservoir.readouts import LogisticReadout
    from reservoir.runtime import resolve_device

    assert resolve_device("cpu") == torch.device("cpu") == resolve_device(torch.device("cpu"))
    raises_one_line(lambda: resolve_device("foo"), "unknown device 'foo'")
    raises_one_line(lambda: resolve_device(f"cuda:{torch.cuda.device_count()}"), "CUDA device")
    X, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    raises_one_line(lambda: LogisticReadout(device="foo").fit(X, y), "unknown device 'foo'")


def test_flags_take_numpy_bools_and_keep_them_as_python_bools():
    from reservoir.extract import ExtractConfig
    from reservoir.readouts import LogisticReadout
    from reservoir.training import TrainConfig

    extract = ExtractConfig(task="bit-xor", backbone="tiny-gpt2", truncate=np.True_)
    train = TrainConfig(task="bit-xor", backbone="tiny-gpt2", compile=np.False_)
    assert type(extract.truncate) is bool and extract.truncate
    assert type(train.compile) is bool and not train.compile
    json.dumps([extract.truncate, train.compile])  # what settings and provenance write
    raises_one_line(lambda: ExtractConfig(task="bit-xor", backbone="tiny-gpt2", truncate=1), "True or False")
    X, y = np.random.default_rng(0).normal(size=(40, 3)), np.arange(40) % 2
    assert LogisticReadout(whiten=np.False_, alphas=[1.0]).fit(X, y).score(X, y) > 0.3
    raises_one_line(lambda: LogisticReadout(whiten="no", alphas=[1.0]).fit(X, y), "True or False")


# ---------------------------------------------------- 2. unwritable results folder


def test_results_folder_under_a_file_is_refused_before_fitting(store, tmp_path, monkeypatch):
    import reservoir.readouts.sweep as sweep

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before the results folder was checked")

    monkeypatch.setattr(sweep, "sweep", no_fit)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    one_line_error(invoke("fit-linear", store, "--results", blocker / "sub"), str(blocker), "is a file",
                   "expected a folder")


def test_out_file_under_a_file_is_refused_before_the_work(tmp_path, monkeypatch):
    import reservoir.readouts.raw as raw

    monkeypatch.setattr(raw, "fit_raw", lambda *a, **k: pytest.fail("ran before --out was checked"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    one_line_error(invoke("fit-raw", "--task", "digits", "--out", blocker / "r.json"), str(blocker), "is a file")
    one_line_error(invoke("fit-raw", "--task", "digits", "--out", tmp_path), "--out", "folder")


def test_write_result_refuses_in_one_line_and_leaves_no_temporary(tmp_path):
    from reservoir.results import write_result

    (tmp_path / "taken").mkdir()
    raises_one_line(lambda: write_result(tmp_path / "taken", {"metrics": {}}), str(tmp_path / "taken"))
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


# ------------------------------------------------------------------ 3. IDX files


def _write_mnist(folder: Path, n: int, magic: int = 0x803, cut: int = 0) -> Path:
    folder.mkdir()
    for images, labels in (("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                           ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")):  # fmt: skip
        raw = struct.pack(">IIII", magic, n, 28, 28) + bytes(n * 28 * 28)
        (folder / images).write_bytes(raw[: len(raw) - cut])
        (folder / labels).write_bytes(struct.pack(">II", 0x801, n) + bytes(n))
    return folder / "train-images-idx3-ubyte"


@pytest.mark.parametrize("case, fragments", [
    ("empty", ["expected at least one image", "0 images of 28x28"]),
    ("truncated", ["truncated"]),
    ("magic", ["magic number 0x00000803", "0x00001234"]),
])  # fmt: skip
def test_malformed_idx_files_are_one_line_naming_the_file(tmp_path, case, fragments):
    n, magic, cut = {"empty": (0, 0x803, 0), "truncated": (3, 0x803, 100), "magic": (3, 0x1234, 0)}[case]
    path = _write_mnist(tmp_path / "mnist", n, magic, cut)
    one_line_error(invoke("fit-raw", "--task", "mnist", "-p", f"data_dir={path.parent}"), str(path), *fragments)


def test_idx_headers_are_checked_before_the_data_is_read(tmp_path, monkeypatch):
    """The data are read only as far as the header says, after its size is checked against memory: a small .gz that
    inflates to a gigabyte is not inflated, dims whose product overflows 64 bits are one line, and so are trailing
    bytes."""
    import gzip

    import reservoir.io.system as rio
    from reservoir.tasks.images.idx import read_idx

    folder = tmp_path / "idx"
    folder.mkdir()
    bomb = folder / "bomb.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 1000, 1000, 1000))  # 1 GB of zeros, a 1 MB file
        for _ in range(1000):
            f.write(bytes(10**6))
    monkeypatch.setattr(rio, "available_memory", lambda: 64 * 2**20)
    with pytest.raises(ReservoirError, match="expected arrays that fit in the 64.0 MiB of memory available; found "
                                             "953.7 MiB"):
        read_idx(str(bomb), 0x803)
    huge = folder / "huge.gz"
    with gzip.open(huge, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 2**31, 2**31, 4))
    with pytest.raises(ReservoirError, match="memory available"):  # 2^64 bytes, not a product wrapped to 0
        read_idx(str(huge), 0x803)
    (folder / "huge").write_bytes(struct.pack(">IIII", 0x803, 2**31, 2**31, 4))  # plain: its size says truncated
    with pytest.raises(ReservoirError, match="expected 18446744073709551632 bytes for dims 2147483648x2147483648x4; "
                                             "found 16 \\(truncated\\)"):
        read_idx(str(folder / "huge"), 0x803)
    monkeypatch.undo()
    trailing = folder / "trailing"
    trailing.write_bytes(struct.pack(">II", 0x801, 3) + bytes(4))
    with pytest.raises(ReservoirError, match="expected 11 bytes for dims 3; found trailing bytes"):
        read_idx(str(trailing), 0x801)


# ------------------------------------------------------------------ 4. JSON


def test_deeply_nested_task_parameter_is_one_line():
    one_line_error(invoke("fit-raw", "--task", "digits", "-p", "x=" + "[" * 100_000), "--param", "'x'",
                   "nested too deeply")
    one_line_error(invoke("fit-raw", "--task", "digits", "-p", "x=" + "1" * 5000), "--param", "'x'")


def test_storage_options_without_a_store_url_are_refused_not_ignored(tmp_path):
    extract = ("extract", "--task", "bit-xor", "-p", "n_train=50", "--backbone", "tiny-gpt2")
    for args, found in [
        ((*extract, "--out", tmp_path / "x.zarr"), f"found --out {tmp_path}/x.zarr, a local path"),
        (extract, "found no --out"),
        (("train", "--task", "bit-xor", "--backbone", "tiny-gpt2"), "found no --from-store"),
        (("info", tmp_path / "x.zarr"), f"found STORE {tmp_path}/x.zarr, a local path"),
        (("fit-linear", tmp_path / "x.zarr"), f"found STORE {tmp_path}/x.zarr, a local path"),
        (("train", "--from-store", tmp_path / "x.zarr"), f"found --from-store {tmp_path}/x.zarr, a local path"),
    ]:
        one_line_error(invoke(*args, "--storage-option", "region=eu-west-1"),
                       "expected a store URL (s3://, gs://, az://) for --storage-option to apply to", found)
    assert list(tmp_path.iterdir()) == []


def test_a_task_parameter_given_twice_is_refused_not_overwritten(tmp_path):
    for cmd in (("extract", "--backbone", "tiny-gpt2", "--out", tmp_path / "x.zarr"), ("fit-raw",)):
        one_line_error(invoke(*cmd, "--task", "bit-xor", "-p", "n_train=100", "-p", "n_bits=3", "-p", " n_train=200"),
                       "--param",
                       "expected each parameter once, found n_train twice ('n_train=100' and ' n_train=200')")
    one_line_error(invoke("extract", "--task", "mnist", "--download", "-p", "download=false", "--out",
                          tmp_path / "m.zarr"),
                   "expected --download or -p download=..., not both; found --download and -p download=false")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, found", [
    (b"[" * 100_000, "nested too deeply"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"{'a': 1}", "invalid JSON"),
    (b"1" * 5000, "unreadable JSON"),
])  # fmt: skip
def test_read_json_names_the_file_and_what_was_expected(tmp_path, content, found):
    from reservoir.io import read_json

    path = tmp_path / "f.json"
    path.write_bytes(content)
    raises_one_line(lambda: read_json(path, "a thing"), str(path), "expected a thing", found)
    raises_one_line(lambda: read_json(tmp_path / "none.json", "a thing"), "none.json", "No such file")


def test_tape_json_nested_too_deeply_is_one_line(tmp_path):
    from reservoir.tasks.homology import read_json_records

    path = tmp_path / "remote_homology_train.json"
    path.write_text("[" * 100_000)
    raises_one_line(lambda: read_json_records(str(path)), str(path), "nested too deeply")


def test_unreadable_task_cache_entry_is_rebuilt(tmp_path, caplog):
    from reservoir.tasks import load_task
    from reservoir.tasks.base import resolve_params
    from reservoir.tasks.cache import cache_key

    params = {"n_train": 16, "n_test": 8}
    entry = tmp_path / f"bit-xor-{cache_key('bit-xor', resolve_params('bit-xor', params))}"
    first = load_task("bit-xor", params, cache_dir=tmp_path)
    for garbage in (b"[" * 100_000, b"\xff\xfe", b'["not", "a", "dict"]', b'{"splits": []}'):
        (entry / "task.json").write_bytes(garbage)
        again = load_task("bit-xor", params, cache_dir=tmp_path)
        assert again.fingerprint == first.fingerprint
        assert json.loads((entry / "task.json").read_text())["fingerprint"] == first.fingerprint
    assert "refused and rebuilt" in caplog.text


# ------------------------------------------------------------------ 5. report


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[Path, Path]:
    """A finished one-run recipe folder and its results file."""
    from reservoir.recipes import Recipe, run_recipe

    out = tmp_path_factory.mktemp("recipe") / "r"
    recipe = Recipe.from_dict({"name": "raw", "cells": [{"kind": "fit-raw", "task": "digits"}]}, "raw.yaml")
    run_recipe(recipe, out=out, progress=False)
    (path,) = out.glob("*/logistic.json")
    return out, path


@pytest.mark.parametrize("case, fragments", [
    ("no-metrics", ["expected a results JSON with metrics.test_accuracy", "no 'metrics'"]),
    ("no-accuracy", ["no 'test_accuracy' in metrics"]),
    ("string-accuracy", ["expected metrics.test_accuracy to be int or float", "str"]),
    ("list", ["expected a results JSON object", "a JSON list"]),
    ("deep", ["nested too deeply"]),
    ("invalid", ["invalid JSON"]),
])  # fmt: skip
def test_report_refuses_malformed_results_naming_the_file(results, case, fragments):
    out, path = results
    good = path.read_text()
    res = json.loads(good)
    try:
        if case == "no-metrics":
            del res["metrics"]
        elif case == "no-accuracy":
            del res["metrics"]["test_accuracy"]
        elif case == "string-accuracy":
            res["metrics"]["test_accuracy"] = "high"
        elif case == "list":
            res = [res]
        path.write_text("[" * 100_000 if case == "deep" else "{oops" if case == "invalid" else json.dumps(res))
        one_line_error(invoke("report", out, "--no-plots"), str(path), *fragments)
    finally:
        path.write_text(good)
    assert invoke("report", out, "--no-plots").exit_code == 0


# ------------------------------------------------------------------ 6. seeds


@pytest.mark.parametrize("command", [
    ["extract", *XOR, *TINY, "--out", "{tmp}/s.zarr"],
    ["train", *XOR, "--backbone", "tiny-gpt2", "--out", "{tmp}/run"],
    ["fit-linear", "{store}", "--results", "{tmp}/res"],
    ["fit-raw", "--task", "digits"],
    ["bench", "extract", *XOR, "--backbone", "tiny-gpt2"],
    ["bench", "speedup", *XOR, "--backbone", "tiny-gpt2"],
    ["bench", "readout", "{store}", "--layer", "1"],
    ["plot", "attention", *XOR, "--backbone", "tiny-gpt2", "--out", "{tmp}/a.png"],
])  # fmt: skip
@pytest.mark.parametrize("seed", [HUGE_SEED, str(2**32), "-1"])
def test_every_seed_option_takes_0_to_2_32_minus_1(command, seed, store, tmp_path):
    args = [a.format(tmp=tmp_path, store=store) for a in command]
    one_line_error(invoke(*args, "--seed", seed), "--seed", "4294967295")
    assert list(tmp_path.iterdir()) == []


def test_python_api_refuses_out_of_range_seeds(store):
    from reservoir.backbones import load_backbone
    from reservoir.bench import readout_vs_sklearn
    from reservoir.readouts.run import fit_linear
    from reservoir.tasks import get_task

    raises_one_line(lambda: load_backbone("tiny-gpt2", d_in=1, seed=2**70), "seed", str(2**70))
    raises_one_line(lambda: load_backbone("tiny-gpt2", d_in=1, projection_seed=-1), "projection_seed")
    raises_one_line(lambda: fit_linear(store, [1], seed=-1, results_dir=None), "seed", "-1")
    raises_one_line(lambda: get_task("digits", seed=2**32), "task 'digits': seed", str(2**32))
    raises_one_line(lambda: readout_vs_sklearn(str(store), 1, seed=2**70), "seed", str(2**70))


# ------------------------------------------------------------------ 7. hub ids


def test_unknown_hub_id_offline_is_one_line_at_once(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    r = invoke("extract", *XOR, "--backbone", "no-such-org/no-such-model", "--quiet", "--out", tmp_path / "s.zarr")
    one_line_error(r, "'no-such-org/no-such-model'", "not a built-in name", "not a folder",
                   "not in the Hugging Face cache", "HF_HUB_OFFLINE")
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("name", ["no such", "org/", "a..b"])
def test_name_that_is_no_hub_id_is_one_line(tmp_path, name):
    r = invoke("extract", *XOR, "--backbone", name, "--quiet", "--out", tmp_path / "s.zarr")
    one_line_error(r, repr(name), "not a folder", "not a valid hub id")


def test_unreachable_hub_is_one_line_within_seconds(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    t0 = time.perf_counter()
    r = invoke("extract", *XOR, "--backbone", "no-such-org/no-such-model", "--quiet", "--out", tmp_path / "s.zarr")
    one_line_error(r, "'no-such-org/no-such-model'", "http://127.0.0.1:9 is unreachable")
    assert time.perf_counter() - t0 < 10


def test_reachable_hub_without_the_model_is_one_line(tmp_path, monkeypatch):
    from huggingface_hub import constants

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        r = invoke("extract", *XOR, "--backbone", "no-such-org/no-such-model", "--quiet", "--out", tmp_path / "s")
        one_line_error(r, "could not load backbone 'no-such-org/no-such-model' as a hub id")
    finally:
        server.shutdown()


def test_hub_id_in_the_local_cache_loads_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from reservoir.backbones import load_backbone

    snapshot = tmp_path / "hub" / "models--some-org--tiny" / "snapshots" / "abc123"
    _tiny_folder(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    bb = load_backbone("some-org/tiny", d_in=1)
    assert bb.info.id == "some-org/tiny" and bb.info.n_layer == 2


# ------------------------------------------------------------- 8. model folders


def _tiny_folder(path: Path) -> Path:
    from reservoir.backbones.load import _load_hf

    model, _, _ = _load_hf("tiny-gpt2", "pretrained", 0, None, "sdpa")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("case, fragments", [
    ("garbage-weights", ["unreadable weights model.safetensors"]),
    ("truncated-weights", ["unreadable weights model.safetensors"]),
    ("garbage-config", ["config.json"]),
    ("bad-config-field", ["n_layer"]),
    ("wrong-shapes", ["expected weights of the shapes its config.json gives", "where the config gives"]),
])  # fmt: skip
def test_broken_model_folder_is_one_line_naming_it(tmp_path, case, fragments):
    folder = _tiny_folder(tmp_path / "model")
    weights, config = folder / "model.safetensors", folder / "config.json"
    if case == "garbage-weights":
        weights.write_bytes(np.random.default_rng(0).bytes(5000))
    elif case == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[:3000])
    elif case == "garbage-config":
        config.write_bytes(np.random.default_rng(0).bytes(500))
    elif case == "bad-config-field":
        config.write_text(json.dumps({**json.loads(config.read_text()), "n_layer": "two"}))
    else:
        config.write_text(json.dumps({**json.loads(config.read_text()), "n_embd": 64}))
    r = invoke("extract", *XOR, "--backbone", folder, "--quiet", "--out", tmp_path / "s.zarr")
    one_line_error(r, str(folder), *fragments)
    assert not (tmp_path / "s.zarr").exists()


# ------------------------------------------------------------------ 9. split lists


def test_one_split_name_is_a_one_element_list():
    from reservoir.tasks import get_task

    r = invoke("fit-raw", "--task", "remote-homology", "-p", "splits=valid")
    one_line_error(r, "splits must be a list including 'train'", "found ['valid']")
    raises_one_line(lambda: get_task("remote-homology", splits="valid"), "found ['valid']")
    raises_one_line(lambda: get_task("remote-homology", splits=5), "split names among train, valid", "found 5")
    raises_one_line(lambda: get_task("remote-homology", splits="train,vali"), "found 'vali'")


# ------------------------------------------------------------------ 10. non-stores


def test_hdf5_file_that_is_not_a_store_is_one_line(tmp_path):
    import h5py

    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.attrs["foo"] = 1
        f["x"] = [1, 2]
    one_line_error(invoke("fit-linear", path, "--results", tmp_path / "res"), str(path))
    one_line_error(invoke("bench", "readout", path, "--layer", "1"), str(path))
    assert not (tmp_path / "res").exists()


# ---------------------------------------------------------- 11. non-finite features


@pytest.fixture
def overflowing_final_norm(monkeypatch):
    """Make the store's final norm overflow (an inf gain): what float32 features of ~1e38 do to a LayerNorm."""
    from reservoir.store import FeatureStore

    real = FeatureStore.final_norm

    def final_norm(self):
        norm = real(self)
        return {"weight": np.full_like(norm["weight"], np.inf), "bias": norm["bias"]}

    monkeypatch.setattr(FeatureStore, "final_norm", final_norm)


@pytest.mark.parametrize("args", [["--stream", "off"], ["--stream", "on"], ["--readout", "ridge", "--stream", "on"]])
def test_fit_linear_refuses_non_finite_features(store, tmp_path, overflowing_final_norm, args):
    r = invoke("fit-linear", store, "--layer", "2", "--results", tmp_path / "res", *args)
    one_line_error(r, str(store), "NaN or inf", "split 'train', layer 2", "--dtype float32", "--gain")


def test_feature_loader_and_bench_readout_refuse_non_finite_features(store, overflowing_final_norm):
    from reservoir.readouts import load_layer
    from reservoir.store import FeatureStore

    with FeatureStore.open(store) as st:
        raises_one_line(lambda: load_layer(st, "test", 1), "split 'test', layer 1 after the final norm")
        X, _ = load_layer(st, "test", 1, final_norm=False)
        assert np.isfinite(X).all()
    # bench readout checks the label shape before it reads (this bit-XOR store has 5 labels a row), then reads
    # through read_layers, whose non-finite check fit-linear's tests cover
    one_line_error(invoke("bench", "readout", store, "--layer", "0"), "needs one label per row")


def test_empty_layer_item_and_empty_out_are_refused(tmp_path):
    from click.testing import CliRunner

    from reservoir.cli import main

    base = ["extract", "--task", "bit-xor", "-p", "n_train=8", "-p", "n_test=4", "--backbone", "tiny-gpt2"]
    r = CliRunner().invoke(main, [*base, "--layers", "0,,1", "--out", str(tmp_path / "s.zarr")])
    assert r.exit_code == 2 and "expected a depth K, a list like 0,3,6 or 'all', found '0,,1'" in r.stderr
    r = CliRunner().invoke(main, [*base, "--layers", "1", "--out", ""])
    assert r.exit_code == 2 and "found an empty path" in r.stderr
    assert not (tmp_path / "s.zarr").exists() and not list(tmp_path.iterdir())


# ------------------------------------------------------------------ the Python API: wrong kinds of argument
@pytest.fixture(scope="module")
def xor_store(tmp_path_factory):
    from reservoir import extract, get_task, load_backbone

    task = get_task("bit-xor", n_train=64, n_test=32)
    path = tmp_path_factory.mktemp("api") / "x.zarr"
    extract(task, load_backbone("tiny-gpt2", d_in=task.d_in), path, layers=2, device="cpu", progress=False).close()
    return task, path


@pytest.mark.parametrize("d_in,found", [(0, "found 0"), (-1, "found -1"), (3.5, "found 3.5"), ("3", "found '3'"),
                                        (True, "found True")])
def test_load_backbone_checks_d_in(d_in, found):
    """-1 was torch's "negative dimension", 3.5 and "3" a TypeError from nn.Linear, 0 accepted."""
    from reservoir import load_backbone

    with pytest.raises(ReservoirError, match=rf"expected d_in an integer >= 1 \(the task's input dim, task.d_in\); "
                                             rf"{found}"):
        load_backbone("tiny-gpt2", d_in=d_in)
    with pytest.raises(ReservoirError, match="expected depth an integer >= 0"):
        load_backbone("tiny-gpt2", d_in=3, depth=1.5)
    assert load_backbone("tiny-gpt2", d_in=np.int64(3), depth=np.int64(1)).depth == 1  # numpy integers are integers


def test_extract_names_the_kind_of_argument_it_expected(tmp_path, xor_store):
    from reservoir import extract, load_backbone

    task, _ = xor_store
    bb = load_backbone("tiny-gpt2", d_in=task.d_in)
    for args, words in ((("bit-xor", bb, tmp_path / "a.zarr"), "expected task a TaskData"),
                        ((task, "tiny-gpt2", tmp_path / "b.zarr"), "expected backbone a ReservoirBackbone"),
                        ((task, bb, None), "expected out a store path")):
        with pytest.raises(ReservoirError, match=words):
            extract(*args, progress=False)
    assert not list(tmp_path.iterdir())


def test_load_layer_and_fit_linear_take_paths_and_layer_lists_alike(xor_store):
    """load_layer took only an open store (AttributeError on a path); fit_linear took no numpy integer and
    fitted nothing for an empty list."""
    from reservoir import fit_linear, load_layer
    from reservoir.store import FeatureStore

    _, path = xor_store
    X, y = load_layer(path, "train", 1)
    with FeatureStore.open(path) as st:
        X2, y2 = load_layer(st, "train", 1)
        assert not st.closed  # a store passed in stays open
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    assert [r.config["layer"] for r in fit_linear(path, np.int64(1))] == [1]
    assert [r.config["layer"] for r in fit_linear(path, np.array([0, 2]))] == [0, 2]
    for bad in ([], "0,1", [1.5], None):
        with pytest.raises(ReservoirError, match="expected layers 'all', a layer or a list of layers"):
            fit_linear(path, bad)


def test_train_refuses_settings_that_describe_other_data_or_objects(tmp_path):
    """train(model, data, settings) trained bit XOR and recorded listops: the result names the settings."""
    from reservoir.training import TrainConfig, build, train

    config = TrainConfig(task="bit-xor", backbone="tiny-gpt2", task_params={"n_train": 64, "n_test": 32}, steps=2,
                         device="cpu")
    _, model, data = build(config)
    for other, words in ((TrainConfig(task="listops", steps=2), "settings.task is 'listops', but the data trained "
                                                                "has 'bit-xor'"),
                         (TrainConfig(task="bit-xor", init="random", steps=2), "settings.init is 'random'"),
                         (TrainConfig(task="bit-xor", layers=1, steps=2), "settings.layers is 1")):
        with pytest.raises(ReservoirError, match=words):
            train(model, data, other, progress=False)
    with pytest.raises(ReservoirError, match="expected model a ReservoirClassifier"):
        train("model", data, config, progress=False)
    with pytest.raises(ReservoirError, match="expected settings a TrainConfig"):
        train(model, data, {"task": "bit-xor"}, progress=False)
    assert train(model, data, config, progress=False).metrics["steps"] == 2


def test_sweep_refuses_no_learning_rates(tmp_path):
    from reservoir.training import TrainConfig, sweep

    config = TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=2, out=str(tmp_path / "s"))
    for lrs in ([], [1e-3, 1e-3], "fast"):
        with pytest.raises(ReservoirError, match="expected lrs"):
            sweep(config, lrs, seeds=1, progress=False)
    assert not (tmp_path / "s").exists()


def test_readouts_refuse_one_class_and_a_probe_folder(tmp_path):
    """LogisticReadout and RidgeReadout fitted one class and scored 1.0 (fit_linear refused it; the estimators did
    not); loading the probe '.' read '..probe.json'."""
    from reservoir import LogisticReadout, RidgeReadout

    X = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    for est in (LogisticReadout(), RidgeReadout()):
        with pytest.raises(ValueError, match=r"expected training labels of at least 2 classes; found one class, \[0\]"):
            est.fit(X, np.zeros(50, int))
    for base in (".", tmp_path):
        with pytest.raises(ReservoirError, match="expected a probe's base name"):
            LogisticReadout.load(base)
