"""The classes of hostile input a trial found, each closed at its root: a test per class.

Model folders never run code (no remote code, no prompt); writes and repairs
never land outside the output; ``--out`` never replaces what is not a regular
file; a run folder has one writer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_cli import XOR, assert_bad_input, invoke

EXTRACT = ["extract", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--layers", "1", "--quiet"]


# ------------------------------------------------------------------ model folders run no code
def _code_folder(folder: Path, model_type: str, marker: Path) -> Path:
    """A model folder whose config maps the Auto classes to its own code, which would leave ``marker`` if run."""
    folder.mkdir()
    config = {"model_type": model_type, "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
              "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
              "vocab_size": 10, "max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PretrainedConfig, PreTrainedModel\n"
                                    "class EvilConfig(PretrainedConfig):\n    model_type = 'evil-model'\n"
                                    "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n")
    return folder


@pytest.mark.parametrize("model_type", ["evil-model", "bert"])
def test_a_model_folder_with_code_never_runs_it_even_when_told_yes(tmp_path, model_type):
    marker = tmp_path / "code-ran"
    folder = _code_folder(tmp_path / "model", model_type, marker)
    run = subprocess.run([sys.executable, "-m", "reservoir", *EXTRACT, "--backbone", str(folder), "--init", "random",
                          "--out", tmp_path / "x.zarr"], input="y\ny\n", capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert not marker.exists(), "the folder's code ran"
    assert "custom code" not in run.stdout and "[y/N]" not in run.stdout  # nothing asked
    if model_type == "evil-model":  # an architecture only its code defines: refused in one line
        assert run.returncode == 2, run.stderr
        lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr
    else:  # a known architecture: the toolkit's own class, the folder's code ignored
        assert run.returncode == 0, run.stderr


# ------------------------------------------------------------------ writes and repairs stay inside the store
STORE = ["extract", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--backbone", "tiny-gpt2",
         "--layers", "1", "--quiet"]


def test_a_linked_chunk_folder_is_refused_and_never_written_into(tmp_path):
    store, outside = tmp_path / "x.zarr", tmp_path / "outside"
    assert invoke(*STORE, "--out", store).exit_code == 0
    chunks = store / "train" / "features" / "c"
    shutil.copytree(chunks, outside)
    for f in outside.rglob("*"):
        if f.is_file():
            f.write_bytes(b"\0" * 8)  # damaged, so a repair would rewrite it
    shutil.rmtree(chunks)
    chunks.symlink_to(outside, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}
    for args in (STORE + ["--out", store], ["info", store, "--verify"], ["fit-linear", store]):
        r = invoke(*args)
        assert_bad_input(r)
        assert "damaged store: train/features/c is a symbolic link" in r.stderr and "outside the store" in r.stderr
    assert {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("kind", ["external link", "virtual dataset", "external raw storage"])
def test_hdf5_storage_outside_the_file_is_refused_and_never_written_into(tmp_path, kind):
    import h5py
    import numpy as np

    store, other = tmp_path / "x.h5", tmp_path / "other.h5"
    assert invoke(*STORE, "--out", store).exit_code == 0
    with h5py.File(store, "r") as f:
        data = f["train/features"][...]
    with h5py.File(other, "w") as g:
        g["features"] = np.zeros_like(data)
    raw = tmp_path / "raw.bin"
    with h5py.File(store, "r+") as f:
        del f["train/features"]
        if kind == "external link":
            f["train/features"] = h5py.ExternalLink(str(other), "features")
        elif kind == "virtual dataset":
            layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
            layout[...] = h5py.VirtualSource(str(other), "features", shape=data.shape)
            f.create_virtual_dataset("train/features", layout)
        else:
            raw.write_bytes(b"\0" * data.nbytes)
            f.create_dataset("train/features", shape=data.shape, dtype=data.dtype,
                             external=[(str(raw), 0, data.nbytes)])
    before = other.read_bytes(), raw.read_bytes() if raw.exists() else b""
    r = invoke(*STORE, "--out", store)
    assert_bad_input(r)
    assert "damaged store: train/features is" in r.stderr and "reaching outside the store" in r.stderr
    assert (other.read_bytes(), raw.read_bytes() if raw.exists() else b"") == before


# ------------------------------------------------------------------ --out never replaces what is not a regular file
@pytest.mark.parametrize("kind", ["fifo", "device", "link"])
def test_out_that_is_not_a_regular_file_is_refused_before_any_work(tmp_path, kind):
    out = tmp_path / "out.json"
    if kind == "fifo":
        os.mkfifo(out)
        expected = "found a FIFO"
    elif kind == "device":
        out = Path("/dev/null")
        expected = "found a character device"
    else:
        (tmp_path / "target.json").write_text("{}")
        out.symlink_to(tmp_path / "target.json")
        expected = "found a symbolic link"
    for args in (["fit-raw", "--task", "digits"], ["bench", "readout", tmp_path / "no-store.zarr"]):
        r = invoke(*args, "--out", out)
        assert_bad_input(r)
        assert f"{out}: expected a regular file (or no file) to write, {expected}" in r.stderr
    assert out.is_char_device() if kind == "device" else (out.is_fifo() if kind == "fifo" else out.is_symlink())


def test_publish_never_replaces_a_fifo(tmp_path):
    from reservoir.errors import ReservoirError
    from reservoir.io import publish

    fifo, tmp = tmp_path / "f", tmp_path / "t"
    os.mkfifo(fifo)
    tmp.write_text("x")
    with pytest.raises(ReservoirError, match="found a FIFO"):
        publish(tmp, fifo)
    assert fifo.is_fifo() and not tmp.exists()


# ------------------------------------------------------------------ a run folder has one writer
TRAIN = ["train", "--task", "bit-xor", "-p", "n_train=200", "-p", "n_test=50", "--backbone", "tiny-gpt2",
         "--steps", "150", "--eval-every", "50", "--quiet"]


@pytest.mark.parametrize("command", ["train", "recipe"])
def test_two_runs_into_one_folder_one_runs_the_other_is_refused_naming_it(tmp_path, command):
    if command == "train":
        args = [*TRAIN, "--out", tmp_path / "run"]
    else:
        recipe = tmp_path / "r.yaml"
        recipe.write_text("name: twice\ndefaults: {backbone: tiny-gpt2, seeds: [0], task_params: {n_train: 200, "
                          "n_test: 50}}\ncells:\n  - {kind: train, task: bit-xor, steps: 150, eval_every: 50}\n")
        args = ["recipe", "run", recipe, "--out", tmp_path / "res", "--cache", tmp_path / "cache", "--quiet"]
    cmd = [sys.executable, "-m", "reservoir", *map(str, args)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close(), p.stderr.close()
    assert sorted(code for code, _ in results) == [0, 2], results
    refusal = next(err for code, err in results if code == 2)
    lines = [ln for ln in refusal.splitlines() if ln.strip()]
    assert len(lines) == 1 and " is being written by pid " in lines[0], refusal


# ------------------------------------------------------------------ resources: YAML bounded once expanded
def test_a_yaml_alias_bomb_is_refused_in_one_line(tmp_path, monkeypatch):
    bomb = "name: bomb\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    bomb += "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("bcdefgh", "cdefghi"))
    bomb += "cells: [{kind: fit-linear, task: bit-xor, layers: 2, tag: *i}]\n"
    (tmp_path / "bomb.yaml").write_text(bomb)
    r = invoke("recipe", "run", tmp_path / "bomb.yaml", "--out", tmp_path / "res", "--dry-run")
    assert_bad_input(r)
    assert "recipe bomb.yaml: expected at most 100,000 values with its aliases expanded, found more than" in r.stderr
    monkeypatch.setenv("RESERVOIR_RECIPES", str(tmp_path))
    listed = invoke("recipe", "list")
    assert listed.exit_code == 0 and "(invalid: recipe bomb.yaml: expected at most 100,000 values" in listed.output
    (tmp_path / "big.yaml").write_text("name: big\n" + "#" * (2 << 20))
    assert_bad_input(r := invoke("recipe", "run", tmp_path / "big.yaml", "--dry-run"))
    assert "expected a recipe of at most 1024 KiB, found 2,097,162 bytes" in r.stderr


@pytest.mark.parametrize("value", ["1e308", "inf", "0", "soon"])
def test_durations_from_the_environment_are_bounded(monkeypatch, value):
    from reservoir.errors import ReservoirError
    from reservoir.io import env_seconds

    monkeypatch.setenv("RESERVOIR_DIST_TIMEOUT", value)
    with pytest.raises(ReservoirError, match=r"RESERVOIR_DIST_TIMEOUT: expected seconds from 0.01 to 604,800"):
        env_seconds("RESERVOIR_DIST_TIMEOUT", 1800)


@pytest.mark.parametrize("args,message", [
    (["--steps", str(10**300)], "--steps must be at most 1,000,000,000, found 100000000000000000000000"),
    (["--lr", "1e300"], "--lr must be at most 1,000, found 1e+300"),
    (["--epochs", "1e308"], "--epochs must be at most 1,000,000, found 1e+308"),
    (["--batch-size", "100000000"], "--batch-size must be at most 1,048,576, found 100000000"),
])
def test_absurd_sizes_are_refused_in_one_short_line_before_anything_runs(tmp_path, args, message):
    r = invoke("train", "--task", "bit-xor", "--backbone", "tiny-gpt2", *args, "--out", tmp_path / "run")
    assert_bad_input(r)
    assert message in r.stderr and len(r.stderr) < 200
    assert not (tmp_path / "run").exists()


def test_recipe_numbers_must_be_finite_and_bounded(tmp_path):
    for value, message in ((".inf", "steps in cells[0] must be a finite number, found inf"),
                           ("1e300", "steps in cells[0] must be at most 1,000,000,000, found 1000000000000000")):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"name: r\ncells:\n  - {{kind: train, task: bit-xor, steps: {value}}}\n")
        r = invoke("recipe", "run", recipe, "--dry-run")
        assert_bad_input(r)
        assert message in r.stderr, r.stderr


# ------------------------------------------------------------------ results are validated on read
def _ran_fit_linear_recipe(tmp_path):
    """A one-run fit-linear recipe run into ``tmp_path/res``: the recipe, the results folder and the results file."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ndefaults: {backbone: tiny-gpt2, seeds: [0], task_params: {n_train: 64, n_test: 32}}\n"
                      "cells:\n  - {kind: fit-linear, task: bit-xor, layers: 1, fit_layers: [1]}\n")
    out = tmp_path / "res"
    assert invoke("recipe", "run", recipe, "--out", out, "--cache", tmp_path / "c", "--quiet").exit_code == 0
    path = next(out.rglob("logistic-layer1.json"))
    return recipe, out, path


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -5.0, 10**300, "0.9", True])
def test_a_results_file_whose_accuracy_is_no_accuracy_is_refused_and_redone(tmp_path, bad):
    from reservoir.readouts.run import FitResult
    from reservoir.recipes.state import finished

    recipe, out, path = _ran_fit_linear_recipe(tmp_path)
    data = json.loads(path.read_text())
    data["metrics"]["test_accuracy"] = bad
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="expected accuracies in \\[0, 1\\], found metrics.test_accuracy = "):
        FitResult.read(path)
    assert not finished(path)
    r = invoke("report", out, "--no-plots")
    assert_bad_input(r)
    assert f"{path}: expected" in r.stderr and "metrics.test_accuracy" in r.stderr
    rerun = invoke("recipe", "run", recipe, "--out", out, "--cache", tmp_path / "c")
    assert rerun.exit_code == 0 and "1 run(s) done, 0 skipped" in rerun.output  # done again, not skipped
    assert 0 <= FitResult.read(path).metrics["test_accuracy"] <= 1


def _outside(data):
    data["metrics"]["test_accuracy"] = 0.99  # in range, but outside its own interval


def _against_rows(data):
    data["metrics"]["test_accuracy"] = 0.5  # inside a widened interval, but not what the per-row results count
    data["metrics"]["test_interval"] = [0.0, 1.0]


@pytest.mark.parametrize("edit, expected", [
    (_outside, "expected metrics.test_accuracy inside metrics.test_interval; found 0.99 outside ["),
    (_against_rows, "expected metrics.test_accuracy to be its per-row results' (rows.test: "),
])
def test_a_results_file_whose_accuracies_contradict_each_other_is_refused_and_redone(tmp_path, edit, expected):
    """An accuracy the report would print beside an interval that excludes it, or beside paired differences drawn
    from other per-row results, is refused as an out-of-range one is, and the run is done again."""
    from reservoir.readouts.run import FitResult
    from reservoir.recipes.state import finished

    recipe, out, path = _ran_fit_linear_recipe(tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match=re.escape(expected)):
        FitResult.read(path)
    assert not finished(path)
    r = invoke("report", out, "--no-plots")
    assert f"{path}: {expected}" in assert_bad_input(r)
    rerun = invoke("recipe", "run", recipe, "--out", out, "--cache", tmp_path / "c")
    assert rerun.exit_code == 0 and "1 run(s) done, 0 skipped" in rerun.output  # done again, not skipped
    FitResult.read(path)  # agrees with itself again


# ------------------------------------------------------------------ inputs that pass the checks, then crash
def test_labels_of_too_many_axes_are_refused_when_the_task_is_made(tmp_path):
    import numpy as np

    from reservoir import TaskData
    from reservoir.errors import ReservoirError

    x = np.random.default_rng(0).normal(size=(40, 4, 3)).astype(np.float32)
    with pytest.raises(ReservoirError, match=r"expected labels of shape \(40,\) or \(40, heads\); found \(40, 1, 1\)"):
        TaskData.from_arrays("t", {"train": (x, np.zeros((40, 1, 1), int)), "test": (x, np.zeros(40, int))})
    np.savez(tmp_path / "d.npz", train_inputs=x, train_labels=np.zeros((40, 1, 1), int), test_inputs=x,
             test_labels=np.zeros(40, int))
    r = invoke("extract", "--data", tmp_path / "d.npz", "--backbone", "tiny-gpt2", "--layers", 1,
               "--out", tmp_path / "x.zarr", "--quiet")
    assert_bad_input(r)
    assert "expected labels of shape" in r.stderr and not (tmp_path / "x.zarr").exists()


def test_an_output_name_too_long_for_the_filesystem_is_one_line(tmp_path):
    name = "a" * 300
    for args in ([*STORE, "--out", tmp_path / f"{name}.zarr"], ["fit-raw", "--task", "digits", "--out",
                                                                 tmp_path / f"{name}.json"]):
        r = invoke(*args)
        assert_bad_input(r)
        assert "expected an output name of at most 230 bytes, found 30" in r.stderr
    assert not list(tmp_path.iterdir())


def test_a_one_row_train_split_is_one_line_for_train_and_n_a_for_fit_linear(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "one.npz", train_inputs=rng.normal(size=(1, 4, 3)).astype(np.float32),
             train_labels=np.zeros(1, int), test_inputs=rng.normal(size=(20, 4, 3)).astype(np.float32),
             test_labels=np.arange(20) % 2)
    r = invoke("train", "--data", tmp_path / "one.npz", "--backbone", "tiny-gpt2", "--steps", 5, "--out",
               tmp_path / "run", "--quiet")
    assert_bad_input(r)
    assert "expected at least two classes in the train split; found only class 0" in r.stderr  # not "100%"
    assert_bad_input(r := invoke("extract", "--data", tmp_path / "one.npz", "--backbone", "tiny-gpt2", "--layers", 1,
                                 "--out", tmp_path / "one.zarr", "--quiet"))
    assert "expected at least two classes in the train split" in r.stderr and not (tmp_path / "one.zarr").exists()
    np.savez(tmp_path / "two.npz", train_inputs=rng.normal(size=(2, 4, 3)).astype(np.float32),
             train_labels=np.arange(2), test_inputs=rng.normal(size=(20, 4, 3)).astype(np.float32),
             test_labels=np.arange(20) % 2)
    assert invoke("extract", "--data", tmp_path / "two.npz", "--backbone", "tiny-gpt2", "--layers", 1, "--out",
                  tmp_path / "two.zarr", "--quiet").exit_code == 0
    fit = invoke("fit-linear", tmp_path / "two.zarr", "--layer", 1, "--results", tmp_path / "r")
    assert fit.exit_code == 0 and "nan" not in fit.output and "n/a [n/a]" in fit.output  # no validation rows


def test_bench_extract_on_splits_smaller_than_a_naive_batch(tmp_path):
    import numpy as np

    x = np.random.default_rng(0).normal(size=(10, 4, 3)).astype(np.float32)
    np.savez(tmp_path / "small.npz", train_inputs=x, train_labels=np.arange(10) % 2, test_inputs=x,
             test_labels=np.arange(10) % 2)
    r = invoke("bench", "extract", "--data", tmp_path / "small.npz", "--backbone", "tiny-gpt2", "--layers", 1,
               "--quiet")
    assert r.exit_code == 0, r.output
    assert "for 20 rows" in r.output  # the naive way timed on every row there is


def test_an_lr_sweep_of_a_billion_runs_is_refused(tmp_path):
    r = invoke("train", "--task", "bit-xor", "--backbone", "tiny-gpt2", "--lr-sweep", "1e-3:1e-1:1000000000",
               "--out", tmp_path / "s")
    assert_bad_input(r)
    assert "--lr-sweep expects 0 < LOW < HIGH and 2 <= N <= 1000, found '1e-3:1e-1:1000000000'" in r.stderr


def test_task_sizes_past_any_memory_are_refused_before_allocating(tmp_path):
    r = invoke("extract", "--task", "bit-xor", "-p", f"n_train={10**12}", "--backbone", "tiny-gpt2", "--layers", 1,
               "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert "task 'bit-xor': n_train must be at most 100,000,000 (a size bound of the toolkit); found" in r.stderr
    assert_bad_input(r := invoke("bench", "speedup", "--task", "bit-xor", "-p", "n_train=200", "-p", "n_test=50",
                                 "--backbone", "tiny-gpt2", "--layers", 1, "--batch-size", 1000000))
    assert "--batch-size must be at most the 200 rows an epoch is timed on" in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--seeds", "3"], "--seeds 3 applies to an lr sweep: pass --lr-sweep LOW:HIGH:N, or drop --seeds"),
    (["--steps", "10", "--epochs", "2"], "expected --steps or --epochs, not both; found --steps 10 and --epochs 2"),
])
def test_options_that_would_be_silently_ignored_are_refused(tmp_path, args, message):
    r = invoke("train", "--task", "bit-xor", "--backbone", "tiny-gpt2", *args, "--out", tmp_path / "run")
    assert_bad_input(r)
    assert message in r.stderr and not (tmp_path / "run").exists()


# ------------------------------------------------------------------ array headers checked before allocating
def _npz_with_member(path: Path, name: str, header_shape: tuple, data: bytes, **arrays) -> Path:
    """An .npz of ``arrays`` plus a member ``name`` whose .npy header claims ``header_shape`` over ``data``."""
    import io
    import zipfile

    import numpy as np

    np.savez(path, **arrays)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": header_shape})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(f"{name}.npy", head.getvalue() + data)
    return path


def test_an_npz_header_claiming_more_than_its_member_holds_is_refused_before_allocating(tmp_path):
    import numpy as np

    x = np.zeros((8, 4, 2), np.float32)
    data = _npz_with_member(tmp_path / "lie.npz", "train_inputs", (10**12, 10), b"\0" * 64,
                            train_labels=np.zeros(8, int), test_inputs=x, test_labels=np.zeros(8, int))
    r = invoke("extract", "--data", data, "--backbone", "tiny-gpt2", "--layers", 1, "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert "train_inputs: expected the 36.4 TiB of data its header claims (shape (1000000000000, 10), float32); " \
           "found 64 bytes" in r.stderr
    assert not (tmp_path / "x.zarr").exists()


def test_an_npz_is_checked_from_its_headers_before_it_is_decompressed(tmp_path, monkeypatch):
    import numpy as np

    import reservoir.io

    big = np.zeros((4096, 64, 8), np.float32)  # 8 MiB of zeros, deflated to a few KiB
    path = tmp_path / "zeros.npz"
    np.savez_compressed(path, train_inputs=big, train_labels=np.zeros(4095, int), test_inputs=big[:8],
                        test_labels=np.zeros(8, int))
    assert path.stat().st_size < 100_000
    loads = []
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(a) or pytest.fail("decompressed"))
    r = invoke("extract", "--data", path, "--backbone", "tiny-gpt2", "--layers", 1, "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert "train_labels: expected 4096 rows, one per row of train_inputs; found 4095 rows" in r.stderr and not loads
    np.savez_compressed(path, train_inputs=big, train_labels=np.zeros(4096, int), test_inputs=big[:8],
                        test_labels=np.zeros(8, int))
    monkeypatch.setattr(reservoir.io.system, "available_memory", lambda: 4 << 20)  # a machine with 4 MiB free
    r = invoke("extract", "--data", path, "--backbone", "tiny-gpt2", "--layers", 1, "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert ("zeros.npz: expected arrays read and converted (token ids to int64, numbers to float32) that fit in "
            "the 4.0 MiB of memory available; found 8.0 MiB") in r.stderr
    assert not loads


# ------------------------------------------------------------------ the task cache trusts nothing its digest misses
def test_a_task_cache_entry_with_edited_metadata_or_a_lying_header_is_rebuilt(tmp_path):
    import numpy as np

    from reservoir.errors import ReservoirError
    from reservoir.io import load_npy
    from reservoir.tasks.cache import load_task

    params = {"n_train": 64, "n_test": 32}
    first = load_task("bit-xor", params, cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    meta = json.loads((entry / "task.json").read_text())
    for field, value in (("n_classes", 7), ("kind", "tokens"), ("d_in", 3), ("n_out_tokens", 5)):
        (entry / "task.json").write_text(json.dumps({**meta, field: value}))
        again = load_task("bit-xor", params, cache_dir=tmp_path)
        assert (again.n_classes, again.kind, again.d_in, again.n_out_tokens) == \
               (first.n_classes, first.kind, first.d_in, first.n_out_tokens), field
    labels = entry / "train.labels.npy"
    with open(labels, "rb") as f:  # rewritten so that its header claims 10^12 rows over the same few bytes
        np.lib.format.read_magic(f)
        shape, order, dtype = np.lib.format.read_array_header_1_0(f)
        data = f.read()
    with open(labels, "wb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": order, "shape": (10**12, *shape[1:])}
        np.lib.format.write_array_header_1_0(f, header)
        f.write(data)
    with pytest.raises(ReservoirError, match=r"expected the 36.4 TiB of data its header claims \(shape \(1000000000000, 5\)"):
        load_npy(labels)
    again = load_task("bit-xor", params, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.splits["train"].labels, first.splits["train"].labels)


def test_a_datasets_folder_naming_files_outside_itself_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"inputs": [[1, 2, 3]] * 4, "label": [0, 1, 0, 1]}
    outside = tmp_path / "outside"
    datasets.Dataset.from_dict(rows).save_to_disk(str(outside))
    folder = tmp_path / "data"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                          "test": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    state = json.loads((folder / "train" / "state.json").read_text())
    arrow = next(outside.glob("*.arrow"))
    for name in (str(arrow), f"../../outside/{arrow.name}"):
        state["_data_files"] = [{"filename": name}]
        (folder / "train" / "state.json").write_text(json.dumps(state))
        r = invoke("extract", "--data", folder, "--backbone", "tiny-gpt2", "--layers", 1, "--out", tmp_path / "x.zarr")
        assert_bad_input(r)
        assert "train/state.json: _data_files: expected names of files inside the folder; found" in r.stderr
    shutil.rmtree(folder / "train")
    (folder / "train").symlink_to(outside)
    r = invoke("extract", "--data", folder, "--backbone", "tiny-gpt2", "--layers", 1, "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert f"train: expected files inside the folder; found a link to {outside}" in r.stderr
    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.parametrize("backbone", ["lstm-2x1000000", "config"])
def test_a_backbone_larger_than_memory_is_refused_before_allocating(tmp_path, backbone):
    if backbone == "config":  # a random-init model folder of 9 TiB of weights
        backbone = tmp_path / "big"
        backbone.mkdir()
        (backbone / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 65536, "n_layer": 48,
                                                          "n_head": 16, "vocab_size": 50257, "n_positions": 1024}))
    r = invoke(*EXTRACT, "--backbone", backbone, "--init", "random", "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert f"backbone '{backbone}': expected weights that fit in the" in r.stderr
    assert not (tmp_path / "x.zarr").exists()


# ------------------------------------------------------------------ a full disk is one line wherever it strikes
@pytest.fixture
def full_disk(monkeypatch):
    """Every file written through :func:`reservoir.io.atomic_write` (checkpoints, results, probes, figures, the
    recipe's copy) fails with ENOSPC once ``room["bytes"]`` bytes are used; ``room["lock"] = True`` fails the lock
    file's write too."""
    import builtins
    import errno

    import reservoir.io

    room = {"bytes": 0, "lock": False}
    real_open, real_pwrite = builtins.open, os.pwrite

    def no_space():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            if len(data) > room["bytes"]:
                raise no_space()
            room["bytes"] -= len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def opened(file, *args, **kwargs):
        f = real_open(file, *args, **kwargs)
        return Full(f) if isinstance(file, int) else f

    def pwrite(fd, data, offset):
        if room["lock"]:
            raise no_space()
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(reservoir.io.writes, "open", opened, raising=False)
    monkeypatch.setattr(os, "pwrite", pwrite)
    return room


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".") or p.name.endswith((".tmp", ".lock")))


def test_a_full_disk_during_train_is_one_line_and_the_run_resumes(tmp_path, full_disk):
    run = tmp_path / "run"
    args = ["train", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--backbone", "tiny-gpt2",
            "--steps", 20, "--eval-every", 10, "--quiet", "--out", run]
    r = invoke(*args)
    assert_bad_input(r)
    assert f"{run}/last.pt: could not write the checkpoint (No space left on device); none was written" in r.stderr
    assert _leftovers(run) == [] and not (run / "last.pt").exists() and not (run / "best.pt").exists()
    assert not (run / "results.json").exists()
    full_disk["bytes"] = 10**9
    assert invoke(*args).exit_code == 0 and (run / "results.json").is_file()


def test_a_full_disk_in_recipe_run_and_report_is_one_line_and_leaves_no_file(tmp_path, full_disk):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ndefaults: {backbone: tiny-gpt2, seeds: [0], task_params: {n_train: 64, n_test: 32}}\n"
                      "cells:\n  - {kind: fit-linear, task: bit-xor, layers: 1, fit_layers: [0, 1]}\n")
    out = tmp_path / "res"
    r = invoke("recipe", "run", recipe, "--out", out, "--cache", tmp_path / "c", "--quiet")
    assert_bad_input(r)
    assert f"{out}/recipe.yaml: could not write the recipe's copy (No space left on device)" in r.stderr
    assert not (out / "recipe.yaml").exists() and _leftovers(out) == []
    full_disk["bytes"] = 10**9
    assert invoke("recipe", "run", recipe, "--out", out, "--cache", tmp_path / "c", "--quiet").exit_code == 0
    full_disk["bytes"] = 0
    r = invoke("report", out)
    assert_bad_input(r)
    assert "could not write the figure (No space left on device)" in r.stderr
    assert not list(out.glob("*.png")) and _leftovers(out) == []
    r = invoke("report", out, "--no-plots")
    assert_bad_input(r)
    assert f"{out}/report.md: could not write the report (No space left on device)" in r.stderr
    assert not (out / "report.md").exists() and _leftovers(out) == []


def test_a_full_disk_when_taking_a_lock_is_one_line_and_leaves_no_lock_file(tmp_path, full_disk):
    full_disk["lock"] = True
    r = invoke(*STORE, "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert f"could not write its lock file {tmp_path}/x.zarr.lock: No space left on device" in r.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ a stopped run leaves nothing half-written
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_unwinds_like_ctrl_c_and_a_killed_writers_temporaries_are_swept(tmp_path, signame):
    import signal
    import time

    signum = getattr(signal, signame)  # SIGHUP: a closed terminal
    run = tmp_path / "run"
    args = [sys.executable, "-m", "reservoir", "train", "--task", "bit-xor", "-p", "n_train=200", "-p", "n_test=50",
            "--backbone", "tiny-gpt2", "--steps", "100000", "--eval-every", "1", "--quiet", "--out", str(run)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "last.pt").exists() and time.monotonic() < deadline:  # checkpointing at every step by now
        time.sleep(0.1)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert [ln for ln in err.splitlines() if ln.strip()] == ["Terminated; rerun the same command to resume."]
    assert _leftovers(tmp_path) == [], "a temporary or the lock survived SIGTERM"
    stale = run / ".last.pt.k1ll3d.tmp"  # what a SIGKILL during a checkpoint leaves
    stale.write_bytes(b"half a checkpoint")
    r = invoke("train", "--task", "bit-xor", "-p", "n_train=200", "-p", "n_test=50", "--backbone", "tiny-gpt2",
               "--steps", 3, "--eval-every", 1, "--quiet", "--out", tmp_path / "other")
    assert r.exit_code == 0
    assert stale.exists()  # another folder's run leaves it alone
    from reservoir.store.lock import run_folder_lock

    with run_folder_lock(run):
        assert not stale.exists()


def test_a_stop_request_during_a_checkpoint_write_takes_effect_once_the_checkpoint_is_in_place(tmp_path,
                                                                                                 monkeypatch):
    import torch

    from reservoir.cli.common import Terminated
    from reservoir.io import request_stop
    from reservoir.training import checkpoint

    real_save = torch.save

    def save_signalled(obj, f):  # SIGTERM arrives while the checkpoint is being written
        request_stop(Terminated(15))
        real_save(obj, f)

    monkeypatch.setattr(checkpoint.torch, "save", save_signalled)
    with pytest.raises(Terminated):
        checkpoint.save(tmp_path / "last.pt", {"config": {}, "trainable": {"w": torch.ones(3)}, "step": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert checkpoint.load(tmp_path / "last.pt", ("config", "trainable", "step"))["step"] == 1
    with pytest.raises(Terminated):  # outside such a write it is raised at once
        request_stop(Terminated(15))


def test_an_interrupt_before_torch_saves_with_block_does_not_abort_when_its_writer_is_collected(tmp_path):
    # torch makes its zip writer, then enters a `with` block that finishes it; a signal between the two leaves the
    # writer unfinished, and its C++ destructor writes the archive's end into the (by then closed) checkpoint file
    code = f"""
import gc, torch, torch.serialization as s
from pathlib import Path
from reservoir.training import checkpoint
made = s._opener.__init__
def interrupted(self, file_like):
    made(self, file_like)
    raise KeyboardInterrupt
s._opener.__init__ = interrupted
try:
    checkpoint.save(Path({str(tmp_path)!r}) / "last.pt", {{"w": torch.ones(3)}})
except KeyboardInterrupt:
    print("interrupted")
gc.collect()
print("collected")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert (r.returncode, r.stdout.split()) == (0, ["interrupted", "collected"]), r.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ torchrun misuse
def test_a_torchrun_worker_ends_when_its_agent_is_killed(tmp_path):
    import signal
    import time

    pidfile = tmp_path / "worker.pid"
    worker = ("import os, time; from reservoir.distributed.group import _end_with_the_agent; _end_with_the_agent(); "
              f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
    agent = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", agent], env={**os.environ, "TORCHELASTIC_RUN_ID": "test"})
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the worker outlived its agent")


def test_a_rank_that_never_comes_is_the_timeout_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RESERVOIR_DIST_TIMEOUT": "3", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RESERVOIR_TASK_CACHE": "off"}
    run = subprocess.run([sys.executable, "-m", "reservoir", *map(str, STORE), "--out", tmp_path / "x.zarr"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    lines = [ln for ln in run.stderr.splitlines() if ln.strip() and not ln.startswith(("W", "[W"))]
    assert len(lines) == 1 and lines[0].startswith("Error: rank 0 of 2: timed out after 3 s (RESERVOIR_DIST_TIMEOUT) "
                                                   "waiting for the other ranks to join"), run.stderr


def test_an_error_line_stays_short_whatever_a_file_holds(tmp_path):
    assert invoke(*STORE, "--out", tmp_path / "x.zarr").exit_code == 0
    meta = tmp_path / "x.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["schema"] = "x" * 10_000_000
    meta.write_text(json.dumps(doc))
    r = invoke("info", tmp_path / "x.zarr")
    line = assert_bad_input(r)
    assert "expected a store of schema 'reservoir.features/2', found schema 'xxxx" in line and len(line) < 300

    from reservoir.cli.common import MAX_ERROR_CHARS, error_line

    cut = error_line(ValueError("a" * 10**6 + "\nb"))
    assert len(cut) <= MAX_ERROR_CHARS and "\n" not in cut and "characters cut" in cut and cut.endswith("a b")


# ------------------------------------------------------------------ the second trial's findings
@pytest.mark.parametrize("where", ["zarr.json", "train/features/c/0/0/0/0", "store", "probe.json", "probe.safetensors"])
def test_a_fifo_where_a_file_is_read_is_refused_at_once(tmp_path, where):
    store = tmp_path / "s.zarr"
    assert invoke(*STORE, "--out", store).exit_code == 0
    assert invoke("fit-linear", store, "--layer", 1, "--save", "--results", tmp_path / "r").exit_code == 0
    probe = tmp_path / "r" / "s" / "logistic-layer1"
    if where == "store":
        store = tmp_path / "q.h5"
        target = store
    elif where.startswith("probe"):
        target = Path(f"{probe}.probe.json" if where == "probe.json" else f"{probe}.safetensors")
    else:
        target = store / where
    target.unlink(missing_ok=True)
    os.mkfifo(target)  # opening it for reading would block until a writer comes
    r = invoke("predict", f"{probe}.probe.json", store) if where.startswith("probe") else invoke("info", store)
    assert_bad_input(r)
    assert "found a FIFO" in r.stderr


def test_a_json_file_past_the_size_limit_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import reservoir.io
    from reservoir.errors import ReservoirError
    from reservoir.io import read_json

    path = tmp_path / "big.json"
    path.write_text(json.dumps({"x": "y" * 5000}))
    monkeypatch.setattr(reservoir.io.reads, "MAX_JSON_BYTES", 4096)
    with pytest.raises(ReservoirError, match=r"big.json: expected a results JSON object of at most 4.0 KiB; found 4.9"):
        read_json(path, "a results JSON object")


@pytest.mark.parametrize("name,value", [("WORLD_SIZE", "two"), ("RANK", "abc")])
def test_torchrun_variables_that_are_not_counts_are_one_line(tmp_path, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    r = invoke(*STORE, "--out", tmp_path / "x.zarr")
    assert_bad_input(r)
    assert f"{name}: expected a non-negative integer (as torchrun sets it), found {value!r}" in r.stderr
    assert not (tmp_path / "x.zarr").exists()


def test_smaller_findings_of_the_second_trial(tmp_path, monkeypatch):
    from reservoir.errors import ReservoirError
    from reservoir.io import env_seconds

    monkeypatch.setenv("RESERVOIR_RECIPES", str(tmp_path / "missing"))
    r = invoke("recipe", "list")
    assert_bad_input(r)
    assert "RESERVOIR_RECIPES: expected a folder of recipe files, found no such folder at" in r.stderr
    monkeypatch.setenv("RESERVOIR_DIST_TIMEOUT", "1e-300")  # a timer of zero
    with pytest.raises(ReservoirError, match="RESERVOIR_DIST_TIMEOUT: expected seconds from 0.01 to 604,800"):
        env_seconds("RESERVOIR_DIST_TIMEOUT", 1800)
    import numpy as np

    x = np.random.default_rng(0).normal(size=(40, 3, 2)).astype(np.float32)
    from reservoir import TaskData
    from reservoir.extract import ExtractConfig, run as run_extract

    one = TaskData.from_arrays("one", train=(x, np.zeros(40, int)), test=(x[:8], np.arange(8) % 2))  # one class
    store = tmp_path / "one.zarr"  # in train, two in the task (a data file of it is refused before its pass)
    run_extract(ExtractConfig(task="one", backbone="tiny-gpt2", layers=1, out=str(store)), progress=False, task=one)
    r = invoke("bench", "readout", store)
    assert_bad_input(r)
    assert "the comparison needs at least two classes in the train split, found only class 0" in r.stderr
    assert_bad_input(r := invoke("fit-linear", store, "--layer", "1", "--results", tmp_path / "res"))
    assert "expected at least two classes in the train split; found only class 0" in r.stderr
    np.savez(tmp_path / "two.npz", train_inputs=x, train_labels=np.arange(40) % 2, test_inputs=x[:8],
             test_labels=np.arange(8) % 2)
    assert invoke("extract", "--data", tmp_path / "two.npz", "--backbone", "tiny-gpt2", "--layers", 1, "--quiet",
                  "--out", tmp_path / "two.zarr").exit_code == 0
    r = invoke("fit-linear", tmp_path / "two.zarr", "--layer", "1,1,0", "--results", tmp_path / "res")
    assert "--layer: expected each layer once; found layer 1 twice in [1, 1, 0]" in assert_bad_input(r)


def test_an_out_that_is_one_of_the_inputs_is_refused_and_the_input_kept(tmp_path):
    import numpy as np

    store = tmp_path / "s.h5"
    assert invoke(*STORE, "--out", store).exit_code == 0
    assert invoke("fit-linear", store, "--layer", 1, "--save", "--results", tmp_path / "r").exit_code == 0
    probe = tmp_path / "r" / "s" / "logistic-layer1"
    x = np.random.default_rng(0).normal(size=(40, 3, 2)).astype(np.float32)
    data = tmp_path / "d.npz"
    np.savez(data, train_inputs=x, train_labels=np.arange(40) % 2, test_inputs=x[:8], test_labels=np.arange(8) % 2)
    before = {p: p.read_bytes() for p in (store, data, Path(f"{probe}.safetensors"))}
    cases = [(["predict", f"{probe}.probe.json", store, "--out", store], "is the input"),
             (["predict", f"{probe}.probe.json", store, "--out", f"{probe}.safetensors"], "is the input"),
             (["fit-raw", "--data", data, "--out", data], "is the input"),
             (["bench", "readout", store, "--out", store], "is the input")]
    for args, found in cases:
        r = invoke(*args)
        assert_bad_input(r)
        assert f"expected an output apart from the command's inputs; found it {found}" in r.stderr, args
    assert all(p.read_bytes() == b for p, b in before.items())


# ------------------------------------------------------------------ probes: what they hold is checked, not trusted
@pytest.fixture(scope="module")
def saved_probe(tmp_path_factory):
    """A store and a logistic probe fitted on its layer 1 (``--save``); tests tamper with copies."""
    root = tmp_path_factory.mktemp("probe")
    store = root / "s.zarr"
    assert invoke(*STORE, "--out", store).exit_code == 0
    assert invoke("fit-linear", store, "--layer", 1, "--save", "--results", root / "r").exit_code == 0
    return store, root / "r" / "s" / "logistic-layer1"


def _probe_copy(saved_probe, tmp_path, meta=None, arrays=None):
    """A copy of the probe with JSON fields replaced and arrays replaced (the sha256 recorded again)."""
    import hashlib

    from safetensors.numpy import load as st_load
    from safetensors.numpy import save as st_save

    store, probe = saved_probe
    base = tmp_path / "p"
    record = json.loads(Path(f"{probe}.probe.json").read_text())
    blob = Path(f"{probe}.safetensors").read_bytes()
    if arrays is not None:
        blob = arrays(dict(st_load(blob))) if callable(arrays) else arrays
        blob = blob if isinstance(blob, bytes) else st_save(blob)
    record.update({"weights": "p.safetensors", "weights_sha256": hashlib.sha256(blob).hexdigest(), **(meta or {})})
    Path(f"{base}.safetensors").write_bytes(blob)
    Path(f"{base}.probe.json").write_text(json.dumps(record))
    return store, f"{base}.probe.json"


@pytest.mark.parametrize("field, value, expected", [
    ("layer", True, "expected layer to be an integer >= 0; found True"),
    ("layer", -1, "expected layer to be an integer >= 0"),
    ("n_features", "32", "expected n_features to be an integer >= 1"),
    ("n_heads", 1.5, "expected n_heads to be an integer >= 0"),
    ("alpha", float("nan"), "expected alpha to be a finite number >= 0"),
    ("classes", [0, 0], "expected classes to be a list of distinct integers"),
    ("params", "C=1", "expected params to be an object"),
    ("params", {"max_iter": -5}, "expected the readout's parameters; found LogisticReadout: max_iter"),
    ("final_norm", "yes", "expected final_norm to be true or false"),
    ("pooling", "max", "expected pooling to be one of last, first, mean"),
    ("backbone", ["gpt2"], "expected backbone to be an object"),
    ("n_heads", None, "expected n_heads to be an integer >= 0; found None"),
])
def test_a_probe_json_field_of_the_wrong_type_is_refused_in_one_line(saved_probe, tmp_path, field, value, expected):
    store, probe = _probe_copy(saved_probe, tmp_path, meta={field: value})
    assert expected in assert_bad_input(invoke("predict", probe, store))


def _bf16(arrays):
    import torch
    from safetensors.torch import save as st_save

    return st_save({k: torch.from_numpy(v).to(torch.bfloat16 if k == "coef" else None) for k, v in arrays.items()})


@pytest.mark.parametrize("change, expected", [
    (lambda a: {**a, "coef": np.where(np.arange(a["coef"].size).reshape(a["coef"].shape) == 3, np.nan, a["coef"])
                .astype(np.float32)}, "expected finite weights; found NaN or inf in coef"),
    (lambda a: {**a, "intercept": np.full_like(a["intercept"], np.inf)}, "NaN or inf in intercept"),
    (lambda a: {**a, "coef": a["coef"].astype(np.int32)}, "expected coef as floats of shape"),
    (lambda a: {**a, "classes": a["classes"].astype(np.float64)}, "expected classes as distinct integers"),
    (lambda a: {**a, "classes": a["classes"][None]}, "expected classes as distinct integers, one row"),
    (lambda a: {**a, "classes": np.zeros_like(a["classes"])}, "expected classes as distinct integers"),
    (lambda a: {**a, "classes": a["classes"][::-1].copy()}, "expected the classes p.probe.json records"),
    (lambda a: {k: v for k, v in a.items() if k != "mean"}, "found no mean"),
    (_bf16, "expected safetensors weights of float and int64 arrays; found 'BF16'"),
    # finite, but their product with the features overflows float32: every row would be predicted class 0
    (lambda a: {**a, "coef": np.full_like(a["coef"], 3e38), "mean": np.full_like(a["mean"], -1e3)},
     "expected finite class scores; found NaN or infinite ones: the readout's weights or these features overflow"),
])
def test_probe_arrays_are_checked_beyond_their_shapes(saved_probe, tmp_path, change, expected):
    store, probe = _probe_copy(saved_probe, tmp_path, arrays=change)
    r = invoke("predict", probe, store, "--out", tmp_path / "pred.npz")
    assert expected in assert_bad_input(r) and "RuntimeWarning" not in r.output
    assert not (tmp_path / "pred.npz").exists()


def test_a_split_named_twice_is_refused_by_predict(saved_probe, tmp_path):
    store, probe = _probe_copy(saved_probe, tmp_path)
    r = invoke("predict", probe, store, "--split", "test", "--split", "test", "--out", tmp_path / "p.npz")
    assert "splits (--split): expected each split once; found 'test' twice" in assert_bad_input(r)
    assert not (tmp_path / "p.npz").exists()


def test_a_probe_applied_to_features_rounded_otherwise_says_so(tmp_path):
    """The same features stored as float16 instead of the probe's float32 are scored, with one warning line: a
    probe's large weights amplify the rounding."""
    xor = ["--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--backbone", "tiny-gpt2", "--layers", 1]
    for dtype in ("float32", "float16"):
        assert invoke("extract", *xor, "--dtype", dtype, "--quiet", "--out", tmp_path / f"{dtype}.zarr").exit_code == 0
    assert invoke("fit-linear", tmp_path / "float32.zarr", "--layer", 1, "--save", "--results",
                  tmp_path / "r").exit_code == 0
    probe = tmp_path / "r/float32/logistic-layer1.probe.json"
    same = invoke("predict", probe, tmp_path / "float32.zarr", "--out", tmp_path / "a.npz")
    assert same.exit_code == 0 and "rounding" not in same.output
    other = invoke("predict", probe, tmp_path / "float16.zarr", "--out", tmp_path / "b.npz")
    assert other.exit_code == 0 and re.search(r"float16.zarr: features stored as float16, computed in \w+, the "
                                              r"probe's were stored as float32, computed in \w+: predictions can "
                                              r"move with the rounding", other.output), other.output


def test_a_probe_is_refused_on_a_store_with_another_number_of_label_heads(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 6, 4)).astype(np.float32)
    for name, shape in (("multi", (3,)), ("single", ())):
        np.savez(tmp_path / f"{name}.npz", train_inputs=X[:80], train_labels=rng.integers(0, 3, (80, *shape)),
                 test_inputs=X[80:], test_labels=rng.integers(0, 3, (40, *shape)))
        assert invoke("extract", "--data", tmp_path / f"{name}.npz", "--backbone", "tiny-gpt2", "--layers", 1,
                      "--quiet", "--out", tmp_path / f"{name}.zarr").exit_code == 0
        assert invoke("fit-linear", tmp_path / f"{name}.zarr", "--layer", 1, "--save", "--results",
                      tmp_path / "r").exit_code == 0
    line = assert_bad_input(invoke("predict", tmp_path / "r/multi/logistic-layer1.probe.json",
                                   tmp_path / "single.zarr"))
    assert "expected labels of the probe's 3 label heads; found one label per row" in line
    line = assert_bad_input(invoke("predict", tmp_path / "r/single/logistic-layer1.probe.json",
                                   tmp_path / "multi.zarr"))
    assert "expected labels of the probe's one label per row; found 3 label heads" in line


# ------------------------------------------------------------------ a results folder is read and written inside it
@pytest.mark.parametrize("what", ["file", "folder"])
def test_report_and_recipe_run_never_follow_a_link_out_of_the_results_folder(tmp_path, what):
    recipe, out, path = _ran_fit_linear_recipe(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if what == "file":
        shutil.move(path, outside / path.name)
        path.symlink_to(outside / path.name)
        link = path
    else:
        link = path.parent
        shutil.move(link, outside / link.name)
        link.symlink_to(outside / link.name, target_is_directory=True)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    line = assert_bad_input(invoke("report", out, "--no-plots"))
    assert "expected results files inside" in line and "found one resolving to" in line and str(outside) in line \
        and "refusing to read it" in line
    for force in ([], ["--force"]):
        line = assert_bad_input(invoke("recipe", "run", recipe, "--out", out, "--cache", tmp_path / "c", *force))
        assert str(outside) in line and "expected a path inside" in line and "refusing to write or remove it" in line
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before  # nothing written out there


def test_report_refuses_a_recipe_copy_linked_from_outside(tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    (tmp_path / "r.yaml").write_text("name: r\ncells:\n  - {kind: fit-linear, task: bit-xor}\n")
    (out / "recipe.yaml").symlink_to(tmp_path / "r.yaml")
    assert "expected the recipe's copy inside" in assert_bad_input(invoke("report", out, "--no-plots"))


# ------------------------------------------------------------------ options that were silently clipped
def test_train_sizes_beyond_the_training_rows_are_refused_before_any_fit(tmp_path):
    store = tmp_path / "s.zarr"
    assert invoke(*STORE, "--out", store).exit_code == 0
    line = assert_bad_input(invoke("fit-linear", store, "--layer", 1, "--train-sizes", "10,65"))
    assert "expected train sizes up to the store's 64 training rows; found 65" in line
    ok = invoke("fit-linear", store, "--layer", 1, "--train-sizes", "10,64", "--results", tmp_path / "r")
    assert ok.exit_code == 0 and "64 rows" in ok.output


# ------------------------------------------------------------------ the last classes of the second trial
@pytest.mark.parametrize("env, expected", [({"RANK": "5"}, "WORLD_SIZE=1 (unset)"),
                                           ({"RANK": "2", "WORLD_SIZE": "2"}, "WORLD_SIZE=2")])
def test_a_rank_outside_its_job_is_refused_not_run_silently(tmp_path, monkeypatch, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    line = assert_bad_input(invoke(*STORE, "--out", tmp_path / "s.zarr"))
    assert f"RANK: expected a rank below {expected} (as torchrun sets them), found {env['RANK']}" in line
    assert not (tmp_path / "s.zarr").exists()


def test_a_zarr_metadata_file_past_the_json_limit_is_refused_before_it_is_parsed(tmp_path):
    from reservoir.io import MAX_JSON_BYTES

    store = tmp_path / "s.zarr"
    assert invoke(*STORE, "--out", store).exit_code == 0
    os.truncate(store / "train" / "features" / "zarr.json", MAX_JSON_BYTES + 1)  # sparse: no disk used
    for args in (["info", store], ["fit-linear", store, "--layer", 1]):
        line = assert_bad_input(invoke(*args))
        assert f"whose metadata files are at most 64.0 MiB; found train/features/zarr.json of {MAX_JSON_BYTES + 1:,} " \
               "bytes" in line


def test_a_scratch_folder_left_by_a_killed_process_is_removed_by_the_next(tmp_path, monkeypatch):
    import socket
    import tempfile

    from reservoir.io import scratch_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname().replace("-", "_")
    stale = tmp_path / f"reservoir-bench-{host}-{dead.pid}-abc"
    live = tmp_path / f"reservoir-bench-{host}-{os.getpid()}-def"
    other_host = tmp_path / f"reservoir-bench-elsewhere-{dead.pid}-ghi"
    for folder in (stale, live, other_host):
        (folder / "store.zarr").mkdir(parents=True)
    with scratch_folder("bench") as tmp:
        assert tmp.parent == tmp_path and tmp.is_dir()
        assert not stale.exists() and live.exists() and other_host.exists()
    assert not tmp.exists()


# ------------------------------------------------------------------ found again when the trial's cases were re-run
@pytest.mark.parametrize("readout", [["LogisticReadout"], {"a": 1}])
def test_a_probe_readout_of_the_wrong_type_is_one_line(saved_probe, tmp_path, readout):
    store, probe = _probe_copy(saved_probe, tmp_path, meta={"readout": readout})
    assert "expected readout LogisticReadout or RidgeReadout" in assert_bad_input(invoke("predict", probe, store))


JOB = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "LOCAL_WORLD_SIZE": "1"}  # a node of one rank


@pytest.mark.parametrize("env, expected", [({"WORLD_SIZE": "\u00b2"}, "WORLD_SIZE: expected a non-negative integer"),
                                           ({"RANK": "\u00b9"}, "RANK: expected a non-negative integer"),
                                           ({"WORLD_SIZE": "0"}, "WORLD_SIZE: expected at least 1 process"),
                                           ({"WORLD_SIZE": "9" * 5000}, "WORLD_SIZE: expected a non-negative integer"),
                                           ({**JOB, "LOCAL_RANK": "-1"}, "LOCAL_RANK: expected a non-negative integer"),
                                           ({**JOB, "LOCAL_RANK": "1"}, "LOCAL_RANK, LOCAL_WORLD_SIZE: expected a "
                                            "local rank below the node's process count, itself from 1 to WORLD_SIZE=2 "
                                            "(as torchrun sets them), found LOCAL_RANK=1, LOCAL_WORLD_SIZE=1"),
                                           ({**JOB, "LOCAL_WORLD_SIZE": "3"}, "LOCAL_RANK=0, LOCAL_WORLD_SIZE=3")])
def test_job_counts_and_places_that_cannot_be_are_one_line(tmp_path, monkeypatch, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert expected in assert_bad_input(invoke(*STORE, "--out", tmp_path / "s.zarr"))
    assert not (tmp_path / "s.zarr").exists()


def test_running_out_of_memory_is_one_line(saved_probe, monkeypatch):
    import reservoir.readouts.probes as probes

    store, probe = saved_probe

    def exhausted(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(probes, "load", exhausted)
    assert "found it ran out of memory" in assert_bad_input(invoke("predict", f"{probe}.probe.json", store))


def test_train_sizes_naming_the_same_rows_twice_are_refused(tmp_path):
    store = tmp_path / "s.zarr"
    assert invoke(*STORE, "--out", store).exit_code == 0
    line = assert_bad_input(invoke("fit-linear", store, "--layer", 1, "--train-sizes", "10,64,all"))
    assert "expected distinct train sizes; found 64 and 'all'" in line


def test_an_output_never_replaces_an_hdf5_store(saved_probe, tmp_path):
    store, probe = saved_probe
    other = tmp_path / "other.h5"
    assert invoke(*STORE, "--out", other).exit_code == 0
    before = other.read_bytes()
    line = assert_bad_input(invoke("predict", f"{probe}.probe.json", store, "--out", other))
    assert "found an HDF5 file (a feature store?)" in line and other.read_bytes() == before


def test_an_output_never_replaces_a_held_lock_file_a_folder_figure_or_a_bench_step_beyond_the_limit(saved_probe,
                                                                                                    tmp_path):
    from reservoir.store.lock import StoreLock

    store, probe = saved_probe
    with StoreLock(tmp_path / "busy.zarr") as lock:  # a writer's lock: replacing it would let a second writer in
        line = assert_bad_input(invoke("predict", f"{probe}.probe.json", store, "--out", lock.path))
        assert "found a file a running process holds locked" in line and lock.path.read_bytes()
    (tmp_path / "figures").mkdir()
    from reservoir.errors import ReservoirError
    from reservoir.training.attention import figure_path

    with pytest.raises(ReservoirError, match="expected a figure file path; found a folder"):
        figure_path(tmp_path / "figures")
    line = assert_bad_input(invoke("bench", "train", "--task", "bit-xor", "--backbone", "tiny-gpt2", "--warmup",
                                   10**9 + 1))
    assert "--warmup: expected 1..1,000,000,000, found 1,000,000,001" in line


def test_an_output_never_replaces_or_joins_the_files_of_a_zarr_store(saved_probe, tmp_path):
    import shutil

    store, probe = saved_probe
    other = tmp_path / "other.zarr"  # a store the command does not read
    shutil.copytree(store, other)
    chunk = next(p for p in sorted((other / "train").rglob("*")) if p.is_file() and "/c/" in p.as_posix())
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    for out in (chunk, other / "zarr.json", other / "train" / "preds.npz"):
        line = assert_bad_input(invoke("predict", f"{probe}.probe.json", store, "--out", out))
        assert f"to write outside any feature store; found it inside the Zarr store {other}" in line
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before


def test_an_output_path_with_a_control_character_is_one_line(tmp_path):
    """A newline in --out would split the "wrote ..." line, and every error naming the path, in two."""
    for args in ((*STORE, "--out", tmp_path / "nl\nx.zarr"), ("fit-raw", "--task", "digits", "--out",
                                                               tmp_path / "tab\tr.json")):
        line = assert_bad_input(invoke(*args))
        assert "expected an output path without control characters (newlines, tabs, ...); found" in line
    assert list(tmp_path.iterdir()) == []


def test_bench_readout_refuses_train_rows_of_one_class_after_the_validation_carve(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 6, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", train_inputs=X[:2], train_labels=np.array([0, 1]), test_inputs=X[2:],
             test_labels=rng.integers(0, 2, 10))
    store = tmp_path / "d.zarr"
    assert invoke("extract", "--data", tmp_path / "d.npz", "--backbone", "tiny-gpt2", "--layers", 1, "--quiet",
                  "--out", store).exit_code == 0
    line = assert_bad_input(invoke("bench", "readout", store))
    assert "needs at least two classes in the train rows left after holding out validation rows" in line


def test_bench_refuses_what_it_would_clip_or_overwrite(tmp_path, monkeypatch):
    """An output inside the backbone's folder, a batch larger than the training rows, a layer twice, a depth with no
    block to split at, the LSTM with no Hugging Face model to compare (before any timing): one line each; more path
    rows than the fit has is fit-linear's "at most", printed as the rows fitted."""
    from reservoir.backbones.load import _load_hf

    hf, _, _ = _load_hf("tiny-gpt2", "pretrained", 0, None, "sdpa")
    hf.save_pretrained(tmp_path / "model")
    weights = (tmp_path / "model" / "model.safetensors").read_bytes()
    xor = ["--task", "bit-xor", "-p", "n_train=60", "-p", "n_test=20"]
    line = assert_bad_input(invoke("bench", "extract", *xor, "--backbone", tmp_path / "model", "--layers", 1,
                                   "--out", tmp_path / "model" / "model.safetensors"))
    assert "expected an output apart from the command's inputs; found it lies inside the input" in line
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == weights
    line = assert_bad_input(invoke("bench", "train", *xor, "--backbone", "tiny-gpt2", "--batch-size", 1000))
    assert "--batch-size must be at most the 54 training rows (after the validation carve), found 1,000" in line
    import reservoir.bench.train as bt

    monkeypatch.setattr(bt, "build", lambda *a, **k: pytest.fail("timed before refusing"), raising=False)
    line = assert_bad_input(invoke("bench", "train", *xor, "--backbone", "lstm-1x16", "--init", "random"))
    assert "compares against a Hugging Face model; backbone 'lstm-1x16' (the LSTM baseline) has none" in line
    store = tmp_path / "s.zarr"  # one label a row: what the scikit-learn comparison takes
    assert invoke("extract", "--task", "digits", "--backbone", "tiny-gpt2", "--layers", 1, "--quiet", "--out",
                  store).exit_code == 0
    assert "--layer: expected each layer once; found layer 0 twice in [0, 0]" in assert_bad_input(
        invoke("bench", "readout", store, "--layer", "0,0"))
    printed = invoke("bench", "readout", store, "--layer", 1, "--path-rows", 100000)  # at most, as fit-linear's
    assert printed.exit_code == 0 and re.search(r"path on 1,\d{3} rows \(at most 100,000 asked\)", printed.output)
    line = assert_bad_input(invoke("bench", "speedup", *xor, "--backbone", "tiny-gpt2", "--layers", 0))
    assert "bench speedup needs a depth of at least 1 (--layers), found 0" in line


def test_running_out_of_memory_in_torch_is_one_line(tmp_path, monkeypatch):
    """The CPU allocator's failure is a RuntimeError, not a MemoryError: one line, exit 2, no store left."""
    import reservoir.extract.passes as passes

    def no_memory(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory:"
                           " you tried to allocate 1048576000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(passes, "iter_windows", no_memory)
    line = assert_bad_input(invoke(*STORE, "--out", tmp_path / "s.zarr"))
    assert "expected batches that fit in the memory this process may use; found an allocation failed" in line
    assert "use a smaller --batch-size or --max-tokens" in line and not (tmp_path / "s.zarr").exists()


def test_a_run_folder_inside_a_zarr_store_is_refused_before_training(tmp_path):
    store = tmp_path / "s.zarr"
    assert invoke(*STORE, "--out", store).exit_code == 0
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    line = assert_bad_input(invoke("train", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--backbone",
                                   "tiny-gpt2", "--steps", 4, "--eval-every", 2, "--quiet", "--out", store / "run"))
    assert f"expected an output folder outside any feature store; found it inside the Zarr store {store}" in line
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before  # nothing made inside it


@pytest.mark.parametrize("case", ["backbone", "lstm", "data", "data-uncached", "out-folder"])
def test_names_longer_than_the_system_takes_are_one_line(tmp_path, monkeypatch, case):
    """A name over 255 bytes raises ENAMETOOLONG from any lookup of it (Path.is_dir included): where a backbone, a
    data file or an output is named so, one line and exit 2, not a traceback."""
    long = "a" * 300
    monkeypatch.setenv("RESERVOIR_TASK_CACHE", "off" if case == "data-uncached" else str(tmp_path / "tasks"))
    data = ["--data", tmp_path / f"{long}.npz"]
    args = {"backbone": ["extract", *XOR, "--backbone", long, "--out", tmp_path / "s.zarr"],
            "lstm": ["train", "--task", "bit-xor", "--backbone", "lstm-" + "1" * 300, "--steps", "1",
                     "--out", tmp_path / "run"],
            "data": ["extract", *data, "--backbone", "tiny-gpt2", "--out", tmp_path / "s.zarr"],
            "data-uncached": ["fit-raw", *data, "--out", tmp_path / "r.json"],
            "out-folder": ["extract", *XOR, "--backbone", "tiny-gpt2", "--out",
                           tmp_path / long / "s.zarr"]}[case]
    line = assert_bad_input(invoke(*args))
    assert "File name too long" in line or "lstm-<layers>x<dim>" in line or "not a valid hub id" in line, line
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "run").exists()


def test_a_revision_names_a_hub_revision_only(tmp_path):
    """--revision pins a hub id; a folder or a built-in name loads as it is, and the revision it would record is
    refused rather than written into the store's provenance."""
    from transformers import GPT2Config, GPT2Model

    folder = tmp_path / "model"
    GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=32)).save_pretrained(folder)
    for backbone, kind in ((folder, "a model folder"), ("tiny-gpt2", "a built-in backbone"),
                           ("lstm-1x8", "a built-in backbone")):
        line = assert_bad_input(invoke("extract", *XOR, "--backbone", backbone, "--init", "random",
                                       "--revision", "v9", "--out", tmp_path / "s.zarr"))
        assert f"expected --revision 'v9' with a hub id only; found {kind}" in line, line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("value", ["maybe", "1", "[]"])
def test_a_download_parameter_is_true_or_false(tmp_path, value):
    line = assert_bad_input(invoke("extract", "--task", "mnist", "-p", f"download={value}", "--backbone", "tiny-gpt2",
                                   "--out", tmp_path / "s.zarr"))
    assert "task 'mnist': download must be true or false; found" in line, line
