"""The ``reservoir`` command line, end to end on the tiny offline backbones.

Happy path (extract -> info -> fit-linear, Zarr and HDF5), the bad-input
contract of DESIGN.md "Errors" (exit status 2, one ``Error:`` line, no
traceback, nothing left behind that claims to be complete), refusal of a rerun
with other settings, and resume after an interrupted extraction.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import reservoir.extract.plan

from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.store import SCHEMA, FeatureStore, WritableStore
from reservoir.tasks import get_task

TINY = ["--backbone", "tiny-gpt2", "--quiet"]
XOR = ["--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32"]
LISTOPS = ["--task", "listops", "-p", "n_train=40", "-p", "n_test=20", "-p", "max_length=60"]


# --------------------------------------------------------------------- helpers


def invoke(*args):
    """Run the CLI in-process; ``result.stdout`` / ``result.stderr`` are kept apart (click >= 8.2)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def stderr_of(result) -> str:
    try:
        return result.stderr
    except ValueError:  # click < 8.2 with mixed streams
        return result.output


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert "Traceback" not in result.output


def assert_bad_input(result):
    """DESIGN.md Errors: exit 2, exactly one non-empty ``Error:`` line, no traceback."""
    assert result.exit_code == 2, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    err_lines = [ln for ln in stderr_of(result).splitlines() if ln.strip()]
    assert len(err_lines) == 1, err_lines
    assert err_lines[0].startswith("Error: ") and len(err_lines[0]) > len("Error: ")
    assert [ln for ln in result.output.splitlines() if ln.startswith("Error:")] == err_lines
    return err_lines[0]


def assert_no_complete_store(path: Path):
    """Nothing at ``path`` claims to be a complete store."""
    if not path.exists():
        return
    try:
        store = FeatureStore.open(path)
    except ReservoirError:
        return  # not a store at all
    with store:
        assert not store.complete, f"{path} claims to be complete"


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under a store (folder or single file)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    with FeatureStore.open(path) as st:
        out = {}
        for split in st.splits:
            out[f"{split}/features"] = np.asarray(st.features(split)[...])
            out[f"{split}/labels"] = st.labels(split)
            out[f"{split}/done"] = st.done(split)
        out["projection"] = st.projection_weight()
        return out


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matrices gain nothing from threads, and OpenMP spinning on a busy 2-core box costs 10x."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def offline(monkeypatch):
    """Hub lookups fail fast: env for fresh imports, constant for an already imported huggingface_hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def xor_store(tmp_path_factory) -> Path:
    """bit-xor through tiny-gpt2 (pretrained), all layers, float16, Zarr; shared read-only."""
    path = tmp_path_factory.mktemp("cli") / "xor.zarr"
    result = invoke("extract", *XOR, *TINY, "--out", path)
    assert_ok(result)
    assert f"wrote {path} (zarr)" in result.stdout
    assert "train (64, 3, 1, 32), test (32, 3, 1, 32); layers [0, 1, 2]" in result.stdout
    return path


# ------------------------------------------------------------------ happy path


def test_help_version_and_tasks():
    result = invoke("--help")
    assert_ok(result)
    for command in ("extract", "info", "fit-linear", "tasks"):
        assert command in result.stdout
    result = invoke("extract", "--help")
    assert_ok(result)
    assert "--layers" in result.stdout and "--out" in result.stdout
    result = invoke("--version")
    assert_ok(result)
    assert "reservoir" in result.stdout
    result = invoke("tasks")
    assert_ok(result)
    names = [ln.split()[0] for ln in result.stdout.splitlines() if ln and not ln[0].isspace()]
    from reservoir.tasks import TASKS

    assert names == sorted(TASKS)
    assert {"bit-memory", "bit-xor", "listops"} <= set(names)
    assert '"n_train": 4000' in result.stdout


def test_extract_writes_complete_store(xor_store):
    with FeatureStore.open(xor_store) as st:
        assert st.complete and st.format == "zarr"
        assert st.attrs["schema"] == SCHEMA
        assert st.splits == ["train", "test"] and st.layers == [0, 1, 2]
        assert st.attrs["backbone"]["id"] == "tiny-gpt2" and st.attrs["backbone"]["init"] == "pretrained"
        assert st.attrs["dtype"] == "float16"
        task = get_task("bit-xor", n_train=64, n_test=32)
        assert st.attrs["task"]["fingerprint"] == task.fingerprint
        for split in ("train", "test"):
            feats = np.asarray(st.features(split)[...])
            assert feats.shape == (len(task.splits[split]), 3, 1, 32) and feats.dtype == np.float16
            assert np.isfinite(feats).all() and np.abs(feats).sum() > 0
            np.testing.assert_array_equal(st.labels(split), task.splits[split].labels)
            assert st.done(split).all()


def test_info_prints_provenance_and_every_split(xor_store):
    result = invoke("info", xor_store)
    assert_ok(result)
    out = result.stdout
    assert re.search(r"^complete   True\b", out, re.M), out
    assert f"schema {SCHEMA}" in out
    assert re.search(r"^backbone   tiny-gpt2 \(gpt2, 2 layers, 32 dim\) init=pretrained seed=0", out, re.M), out
    assert re.search(r"^layers     \[0, 1, 2\]", out, re.M), out
    assert "final norm stored" in out
    assert re.search(r"^  train +features \(64, 3, 1, 32\)  labels \(64, 5\)  chunks 1/1 done", out, re.M), out
    assert re.search(r"^  test +features \(32, 3, 1, 32\)  labels \(32, 5\)  chunks 1/1 done", out, re.M), out

    result = invoke("info", xor_store, "--json")
    assert_ok(result)
    attrs = json.loads(result.stdout)
    assert attrs["schema"] == SCHEMA and attrs["complete"] is True and attrs["layers"] == [0, 1, 2]


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_info_on_a_store_with_only_the_attributes_create_needs(tmp_path, suffix):
    """A store made through the Python API need not record the backbone's init, weights or the task's params: info
    says they are unrecorded."""
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float16", "pooling": {"kinds": ["last"], "n_out_tokens": 1}, "full_seq_layer": None}
    path = tmp_path / f"min{suffix}"
    with WritableStore.create(path, attrs, {"train": (4, ()), "test": (2, ())}, (2, 1, 3),
                              np.eye(2, 3, dtype=np.float32)) as st:
        st.write_chunk("train", 0, np.ones((4, 2, 1, 3)), np.zeros(4), np.ones(4))
    result = invoke("info", path)
    assert_ok(result)
    out = result.stdout
    assert re.search(r"^backbone   unrecorded \(unrecorded, unrecorded layers, 3 dim\) init=unrecorded "
                     r"seed=unrecorded revision=None$", out, re.M), out
    assert re.search(r"^weights    sha256 unrecorded$", out, re.M), out
    assert re.search(r"^task       t params unrecorded$", out, re.M), out
    assert re.search(r"^           fingerprint unrecorded  classes unrecorded  label shape \[\]$", out, re.M), out
    assert re.search(r"^projection unrecorded d_in=unrecorded .*\(unrecorded inputs\)$", out, re.M), out
    assert "dtype float16 (computed in an unrecorded dtype)" in out
    assert re.search(r"^  train +features \(4, 2, 1, 3\)  labels \(4,\)  chunks 1/1 done", out, re.M), out
    assert re.search(r"^status     interrupted; rerun the extract command to finish it$", out, re.M), out


def test_fit_linear_all_layers_writes_one_result_per_layer(xor_store, tmp_path):
    results = tmp_path / "results"
    result = invoke("fit-linear", xor_store, "--layer", "all", "--results", results)
    assert_ok(result)
    rows = {}
    for line in result.stdout.splitlines():
        m = re.match(r"^\s*(\d+)\s+([\d.]+)%\s+([\d.]+)% \[[\d., ]+\]\s+([\d.]+)% \[[\d., ]+\]", line)
        if m:
            rows[int(m.group(1))] = [float(m.group(i)) / 100 for i in (2, 3, 4)]  # train, val, test
    assert sorted(rows) == [0, 1, 2], result.stdout
    assert f"results in {results / Path(xor_store).name.removesuffix('.zarr')}/" in result.stdout  # its folder

    files = sorted(results.rglob("*.json"))
    assert [f.name for f in files] == [f"logistic-layer{k}.json" for k in (0, 1, 2)]
    with FeatureStore.open(xor_store) as st:
        fingerprint = json.loads(json.dumps(st.fingerprint()))
    for k, f in enumerate(files):
        res = json.loads(f.read_text())
        assert {"config", "store", "metrics", "timings"} <= set(res)
        assert res["config"]["layer"] == k and res["config"]["readout"] == "logistic"
        assert res["store"] == fingerprint
        m = res["metrics"]
        for key, printed in zip(("train_accuracy", "val_accuracy", "test_accuracy"), rows[k]):
            assert abs(m[key] - printed) < 0.0001, (key, m[key], printed)  # printed with two decimals of a percent
        assert m["n_test"] == 32
        assert res["timings"]["fit_s"] >= 0


def test_hdf5_store_matches_zarr_and_info_reads_it(xor_store, tmp_path):
    path = tmp_path / "xor.h5"
    result = invoke("extract", *XOR, *TINY, "--format", "hdf5", "--out", path)
    assert_ok(result)
    assert f"wrote {path} (hdf5)" in result.stdout
    assert path.is_file() and path.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"
    result = invoke("info", path)
    assert_ok(result)
    assert "(hdf5, schema" in result.stdout
    assert re.search(r"^complete   True\b", result.stdout, re.M)
    h5, zr = read_arrays(path), read_arrays(xor_store)
    assert h5.keys() == zr.keys()
    for key in h5:
        assert np.array_equal(h5[key], zr[key]), key


def test_tiny_bert_listops_into_h5_by_suffix(tmp_path):
    path = tmp_path / "listops.h5"
    result = invoke("extract", *LISTOPS, "--backbone", "tiny-bert", "--quiet", "--layers", "1", "--out", path)
    assert_ok(result)
    result = invoke("info", path)
    assert_ok(result)
    out = result.stdout
    assert "(hdf5, schema" in out and re.search(r"^complete   True\b", out, re.M)
    assert "tiny-bert (bert, 2 layers, 32 dim)" in out
    assert re.search(r"^layers     \[0, 1\]", out, re.M) and "(tokens inputs)" in out
    assert re.search(r"^  train +features \(40, 2, 1, 32\)  labels \(40,\)", out, re.M), out
    assert re.search(r"^  test +features \(20, 2, 1, 32\)  labels \(20,\)", out, re.M), out


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "extra, expect",
    [
        pytest.param(["--task", "nope", *TINY], "unknown task 'nope'", id="unknown-task"),
        pytest.param([*XOR, "-p", "nope=1", *TINY], "'nope'", id="unknown-task-param"),
        pytest.param(["--task", "bit-xor", "-p", "n_train=0", *TINY], "n_train", id="bad-task-param-value"),
        pytest.param([*XOR, *TINY, "--layers", "3"], "3", id="depth-3-of-2"),
        pytest.param([*XOR, *TINY, "--layers", "0,5"], "5", id="layers-0,5-of-2"),
        pytest.param([*XOR, "--backbone", "{tmp}/no-such-model", "--quiet"], "no-such-model",
                     id="missing-local-folder"),
        pytest.param([*XOR, "--backbone", "no-such-org-xyz/no-such-model-xyz", "--quiet"],
                     "no-such-org-xyz/no-such-model-xyz", id="nonsense-hub-id"),
    ],
)
def test_extract_bad_input(extra, expect, tmp_path, offline):
    out = tmp_path / "out.zarr"
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    t0 = time.perf_counter()
    result = invoke("extract", *args, "--out", out)
    elapsed = time.perf_counter() - t0
    line = assert_bad_input(result)
    assert expect in line, line
    # extract() validates task, backbone and depth before it writes anything
    assert not out.exists()
    assert elapsed < 20, f"bad input took {elapsed:.1f} s (hub retries?)"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is there")
def test_extract_on_a_missing_cuda_device_is_refused_before_the_task_loads(tmp_path, monkeypatch):
    import reservoir.tasks

    monkeypatch.setattr(reservoir.tasks, "load_task", lambda *a, **k: pytest.fail("the task was loaded"))
    result = invoke("extract", *XOR, *TINY, "--device", "cuda", "--out", tmp_path / "out.zarr")
    assert assert_bad_input(result) == "Error: device 'cuda' asked for, found no CUDA device (use --device cpu)"
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("where", ["under /proc", "under a regular file"])
def test_extract_unwritable_out(where, tmp_path):
    if where == "under /proc":
        out = Path("/proc/nope/x.zarr")
    else:
        (tmp_path / "file.txt").write_text("not a folder\n")
        out = tmp_path / "file.txt" / "x.zarr"
    result = invoke("extract", *XOR, *TINY, "--out", out)
    line = assert_bad_input(result)
    assert str(out) in line and "writable" in line
    assert not out.exists()
    if where != "under /proc":
        assert (tmp_path / "file.txt").read_text() == "not a folder\n"


@pytest.mark.parametrize("extra", [["--init", "bogus"], ["-p", "n_train"]], ids=["init", "param-without-equals"])
def test_extract_click_usage_errors_exit_2(extra, tmp_path):
    """Click's own parameter errors: exit 2, an Error line naming the option, no store."""
    out = tmp_path / "out.zarr"
    result = invoke("extract", *XOR, *TINY, *extra, "--out", out)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert any(ln.startswith("Error:") for ln in stderr_of(result).splitlines())
    assert not out.exists()


@pytest.mark.parametrize("extra", [["--init", "bogus"], ["-p", "n_train"]], ids=["init", "param-without-equals"])
def test_extract_click_usage_errors_one_line(extra, tmp_path):
    line = assert_bad_input(invoke("extract", *XOR, *TINY, *extra, "--out", tmp_path / "out.zarr"))
    assert "--init" in line or "--param" in line


def _make_non_store(kind: str, tmp_path: Path) -> Path:
    if kind == "empty folder":
        (tmp_path / "plain").mkdir()
        (tmp_path / "plain" / "notes.txt").write_text("hello\n")
        return tmp_path / "plain"
    if kind == "random file":
        p = tmp_path / "random.bin"
        p.write_bytes(np.random.default_rng(0).bytes(256))
        return p
    if kind == "missing path":
        return tmp_path / "missing.zarr"
    if kind == "zarr of another schema":
        import zarr

        p = tmp_path / "other.zarr"
        zarr.open_group(str(p), mode="w").attrs["schema"] = "other/9"
        return p
    if kind == "hdf5 without schema":
        import h5py

        p = tmp_path / "plain.h5"
        with h5py.File(p, "w") as f:
            f.create_dataset("a", data=np.arange(3))
        return p
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["empty folder", "random file", "missing path", "zarr of another schema", "hdf5 without schema"]
)
def test_info_on_non_store(kind, tmp_path):
    path = _make_non_store(kind, tmp_path)
    before = tree_digest(path) if path.exists() else None
    line = assert_bad_input(invoke("info", path))
    assert path.name in line and "expected" in line
    if kind == "zarr of another schema":
        assert "other/9" in line and SCHEMA in line
    assert_no_complete_store(path)
    assert (tree_digest(path) if path.exists() else None) == before


def test_fit_linear_on_non_store(tmp_path):
    path = _make_non_store("zarr of another schema", tmp_path)
    line = assert_bad_input(invoke("fit-linear", path, "--results", tmp_path / "res"))
    assert "other/9" in line
    assert not (tmp_path / "res").exists()


def test_fit_linear_missing_layer(xor_store, tmp_path):
    results = tmp_path / "res"
    line = assert_bad_input(invoke("fit-linear", xor_store, "--layer", "7", "--results", results))
    assert "7" in line and "[0, 1, 2]" in line
    assert not results.exists() or not list(results.rglob("*.json"))


def test_fit_linear_layer_list_validated_before_any_fit(xor_store, tmp_path):
    results = tmp_path / "res"
    line = assert_bad_input(invoke("fit-linear", xor_store, "--layer", "0,7", "--results", results))
    assert "7" in line
    assert not results.exists() or not list(results.rglob("*.json"))


@pytest.fixture
def store_copy(xor_store, tmp_path) -> Path:
    path = tmp_path / "copy.zarr"
    shutil.copytree(xor_store, path)
    return path


@pytest.mark.parametrize(
    "extra, field",
    [
        ([*XOR, *TINY, "--init", "random"], "backbone.init"),
        ([*XOR, "-p", "seed=1", *TINY], "task."),
        ([*XOR, *TINY, "--seed", "3"], "backbone.seed"),
        ([*XOR, *TINY, "--dtype", "float32"], "dtype"),
        ([*XOR, *TINY, "--layers", "1"], ("backbone.depth", "layers")),
        ([*XOR, "--backbone", "tiny-bert", "--quiet"], "backbone."),
    ],
    ids=["init", "task-seed", "seed", "dtype", "layers", "backbone"],
)
def test_rerun_with_other_settings_is_refused(extra, field, store_copy):
    before = tree_digest(store_copy)
    line = assert_bad_input(invoke("extract", *extra, "--out", store_copy))
    fields = field if isinstance(field, tuple) else (field,)
    assert any(f in line for f in fields), line
    assert str(store_copy) in line
    assert tree_digest(store_copy) == before
    with FeatureStore.open(store_copy) as st:
        assert st.complete


def test_rerun_with_same_settings_is_a_no_op(store_copy):
    before = tree_digest(store_copy)
    result = invoke("extract", *XOR, *TINY, "--out", store_copy)
    assert_ok(result)
    assert f"already complete with these settings, nothing written: {store_copy} (zarr)" in result.stdout
    assert "wrote" not in result.stdout
    assert tree_digest(store_copy) == before


# ---------------------------------------------------------------------- resume


def test_interrupted_extract_resumes_to_identical_features(tmp_path, monkeypatch):
    # float32, 3 layers x 32 dim -> 384 bytes a row -> 2731 rows a chunk: train has 3 chunks, test 1
    args = ["extract", "--task", "bit-xor", "-p", "n_train=6000", "-p", "n_test=32", *TINY,
            "--dtype", "float32", "--batch-size", "512"]  # fmt: skip
    out, ref = tmp_path / "resumed.zarr", tmp_path / "reference.zarr"
    original = WritableStore.write_chunks
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 1)  # a window (and a write) per chunk

    def interrupted(self, split, chunks, features, labels, **kw):
        calls.extend((split, c) for c in chunks)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, split, chunks, features, labels, **kw)

    monkeypatch.setattr(WritableStore, "write_chunks", interrupted)
    result = invoke(*args, "--out", out)
    assert result.exit_code == 130, (result.output, result.exception)
    assert "Traceback" not in result.output
    assert "rerun the same command to resume" in stderr_of(result)
    assert calls == [("train", 0), ("train", 1)]
    with FeatureStore.open(out, allow_incomplete=True) as st:
        assert not st.complete
        assert st.chunk_rows("train") == 2731
        assert st.done("train").tolist() == [True, False, False]
        assert st.done("test").tolist() == [False]

    info = invoke("info", out)
    assert_ok(info)
    assert re.search(r"^complete   False\b", info.stdout, re.M)
    assert re.search(r"^  train +features \(6000, 3, 1, 32\).*chunks 1/3 done", info.stdout, re.M), info.stdout
    line = assert_bad_input(invoke("fit-linear", out, "--results", tmp_path / "res"))
    assert "complete" in line

    calls.clear()

    def recording(self, split, chunks, features, labels, **kw):
        calls.extend((split, c) for c in chunks)
        return original(self, split, chunks, features, labels, **kw)

    monkeypatch.setattr(WritableStore, "write_chunks", recording)
    result = invoke(*args, "--out", out)
    assert_ok(result)
    assert calls == [("train", 1), ("train", 2), ("test", 0)]  # the done chunk is skipped
    monkeypatch.setattr(WritableStore, "write_chunks", original)

    assert_ok(invoke(*args, "--out", ref))
    with FeatureStore.open(out) as st:
        assert st.complete
    resumed, reference = read_arrays(out), read_arrays(ref)
    assert resumed.keys() == reference.keys()
    for key in resumed:
        assert np.array_equal(resumed[key], reference[key]), key
    assert resumed["train/features"].dtype == np.float32


def test_truncated_data_file_is_one_line_exit_2(tmp_path):
    """A real-format file cut short: exit 2, one line naming the file, no store."""
    import gzip
    import struct

    images = struct.pack(">IIII", 0x00000803, 10, 28, 28) + bytes(28 * 28 * 10)
    labels = struct.pack(">II", 0x00000801, 10) + bytes(10)
    for prefix in ("train", "t10k"):
        (tmp_path / f"{prefix}-labels-idx1-ubyte").write_bytes(labels)
        (tmp_path / f"{prefix}-images-idx3-ubyte").write_bytes(images)
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as f:  # the plain file wins; cut it short
        f.write(images)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(images[: len(images) // 2])
    out = tmp_path / "m.zarr"
    line = assert_bad_input(invoke("extract", "--task", "mnist", "-p", f"data_dir={tmp_path}", *TINY, "--out", out))
    assert "t10k-images-idx3-ubyte" in line
    assert not out.exists()


def test_text_parameters_stay_text_and_paths_the_system_refuses_are_one_line(tmp_path):
    """``-p data_dir=2024`` names the folder "2024" (not the number); a non-text path from the Python API, a path too
    long for the system and a layer like ``1_0`` are one line each."""
    from reservoir.cli.common import _parse_params
    from reservoir.tasks import get_task

    assert _parse_params(("data_dir=2024", "n_train=5", "source=lra")) == {"data_dir": "2024", "n_train": 5,
                                                                          "source": "lra"}
    r = invoke("fit-raw", "--task", "mnist", "-p", "data_dir=123", "--out", tmp_path / "x.json")
    assert_bad_input(r)
    assert "found no folder 123;" in r.output and not (tmp_path / "x.json").exists()
    with pytest.raises(ReservoirError, match=r"task 'mnist': expected data_dir as non-empty text, found 123 \(int\)"):
        get_task("mnist", data_dir=123)
    r = invoke("fit-raw", "--task", "digits", "--out", tmp_path / ("a" * 300) / "y.json")
    assert_bad_input(r)
    assert "expected a path this system can use" in r.output
    r = invoke("fit-linear", tmp_path / "s.zarr", "--layer", "1_0")
    assert_bad_input(r)
    assert "Invalid value for --layer: expected a depth K" in r.output
    r = invoke("fit-linear", tmp_path / "s.zarr", "--layer", "9" * 5000)
    assert_bad_input(r)
    assert "Invalid value for --layer: expected depths below 1,000,000" in r.output
    assert _parse_params(("data_dir=null",)) == {"data_dir": None}  # JSON's null: the default folder


def test_a_group_named_alone_shows_its_help():
    """`reservoir bench` (plot, recipe) with no subcommand was a traceback ('NoneType' object has no attribute
    'color'): it shows the group's help and exits 2, as `reservoir` alone does."""
    for group in ("bench", "plot", "recipe"):
        result = invoke(group)
        assert result.exit_code == 2 and (result.exception is None or isinstance(result.exception, SystemExit))
        assert "Traceback" not in result.output and f"Usage: main {group} [OPTIONS] COMMAND" in result.output


def test_empty_paths_and_other_files_as_outputs_are_refused(xor_store, tmp_path, monkeypatch):
    """An empty --out or --results was the working folder, or silently the default; `predict --out` took any
    file (a results JSON was replaced by an archive)."""
    monkeypatch.chdir(tmp_path)
    small = ["--task", "bit-xor", "-p", "n_train=20", "-p", "n_test=10", *TINY]
    for args, why in ((["train", *small, "--steps", 2, "--out", ""], "--out must be a path (not empty), found ''"),
                      (["fit-raw", "--task", "bit-xor", "--out", ""], "expected a file path; found an empty one"),
                      (["fit-linear", xor_store, "--results", ""], "expected a folder for the results; found an "
                                                                     "empty path"),
                      (["plot", "attention", "--run", "x", "--out", " "], "expected a figure file path; found an "
                                                                          "empty one")):
        assert why in assert_bad_input(invoke(*args))
    assert list(tmp_path.iterdir()) == []
    assert_ok(invoke("fit-linear", xor_store, "--layer", 1, "--save", "--results", "r"))
    probe, result = tmp_path / "r" / "xor" / "logistic-layer1", tmp_path / "r" / "xor" / "logistic-layer1.json"
    before = result.read_bytes()
    for out in ("", str(result)):
        line = assert_bad_input(invoke("predict", probe, xor_store, "--out", out))
        assert "expected a file path; found an empty one" in line or "expected a .npz file for the predictions" in line
    assert result.read_bytes() == before
    assert_ok(invoke("predict", probe, xor_store, "--out", tmp_path / "p.npz"))


def test_one_depth_options_take_all_and_full_seq_layer_says_its_range(tmp_path):
    """`train --layers all` was refused ('all' is not a valid integer) while its help said 'default all'; a negative
    --full-seq-layer was 'must be below the depth 2, found -1'."""
    small = ["--task", "bit-xor", "-p", "n_train=20", "-p", "n_test=10", *TINY]
    assert_ok(invoke("train", *small, "--layers", "all", "--steps", 2, "--eval-every", 1, "--out", tmp_path / "t"))
    assert json.loads((tmp_path / "t" / "results.json").read_text())["config"]["layers"] is None
    assert "expected a depth K (an integer) or 'all'; found 'soon'" in assert_bad_input(
        invoke("train", *small, "--layers", "soon", "--steps", 2))
    line = assert_bad_input(invoke("extract", *small, "--full-seq-layer", -1, "--out", tmp_path / "s.zarr"))
    assert "--full-seq-layer must be an integer >= 0, found -1" in line
    assert not (tmp_path / "s.zarr").exists()


def test_options_a_command_would_ignore_are_refused(tmp_path):
    """`train --lr` beside `--lr-sweep`, and `plot attention --run` beside the options of a run to train, were
    silently ignored."""
    small = ["--task", "bit-xor", "-p", "n_train=20", "-p", "n_test=10", *TINY]
    line = assert_bad_input(invoke("train", *small, "--lr-sweep", "1e-3:1e-2:2", "--lr", 0.5, "--steps", 2))
    assert "expected --lr or --lr-sweep, not both (the sweep chooses the rate); found --lr 0.5 and --lr-sweep" in line
    line = assert_bad_input(invoke("plot", "attention", "--run", tmp_path, "--task", "digits", "--steps", 5))
    assert "expected --run or the options of a run to train, not both; found --run with --steps, --task" in line
    assert list(tmp_path.iterdir()) == []


def test_a_format_contradicting_the_suffix_is_refused(tmp_path):
    """`--format hdf5 --out x.zarr` wrote an HDF5 file named .zarr (which every reader then took for a folder)."""
    small = ["--task", "bit-xor", "-p", "n_train=20", "-p", "n_test=10", *TINY]
    for fmt, name in (("hdf5", "x.zarr"), ("zarr", "x.h5")):
        line = assert_bad_input(invoke("extract", *small, "--format", fmt, "--out", tmp_path / name))
        assert f"--format {fmt} contradicts the path's suffix" in line
    assert list(tmp_path.iterdir()) == []
    assert_ok(invoke("extract", *small, "--format", "hdf5", "--out", tmp_path / "x.store"))
    assert (tmp_path / "x.store").read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"
