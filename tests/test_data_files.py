"""Labelled arrays in a file as a task (``--data PATH``): every format end to end, the task equal to the arrays
written, its fingerprint following the file, and one line (exit 2, no store) for every bad file."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from reservoir import Task, TaskData
from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig
from reservoir.store import FeatureStore
from reservoir.tasks import get_task, load_task

TINY = ["--backbone", "tiny-bert", "--layers", "2", "--quiet"]


# --------------------------------------------------------------------- helpers


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"


def assert_one_line(result, *fragments) -> str:
    """Exit 2, exactly one line on stderr, holding every fragment."""
    assert result.exit_code == 2, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


def vector_arrays(seed=0, n=(60, 12, 20), L=6, d=3):
    """Float vectors (N, L, d) whose label is the sign of the last position's first entry; train, val, test."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, rows in zip(("train", "val", "test"), n):
        x = rng.normal(size=(rows, L, d)).astype(np.float32)
        out[split] = (x, (x[:, -1, 0] > 0).astype(np.int64))
    return out


def token_rows(seed=0, n=(60, 20)):
    """Ragged token id lists (ids 1..8) and labels (the first id mod 3) for train and test."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, rows in zip(("train", "test"), n):
        seqs = [rng.integers(1, 9, size=rng.integers(2, 7)).tolist() for _ in range(rows)]
        out[split] = (seqs, [s[0] % 3 for s in seqs])
    return out


def padded(seqs):
    lengths = np.array([len(s) for s in seqs])
    x = np.zeros((len(seqs), lengths.max()), dtype=np.int64)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = s
    return x, lengths


def write_columnar(path: Path, rows, fmt: str) -> Path:
    """``rows`` ({split: (sequences, labels)}) as one table with a ``split`` column, or a DatasetDict folder."""
    if fmt == "save_to_disk":
        datasets = pytest.importorskip("datasets")
        tables = {s: datasets.Dataset.from_dict({"inputs": x, "label": y}) for s, (x, y) in rows.items()}
        datasets.disable_progress_bars()
        try:
            datasets.DatasetDict(tables).save_to_disk(str(path))
        finally:
            datasets.enable_progress_bars()
        return path
    table = {"inputs": [], "label": [], "split": []}
    for s, (x, y) in rows.items():
        table["inputs"] += x
        table["label"] += y
        table["split"] += [s] * len(x)
    if fmt == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table(table), path)
    else:  # CSV: JSON lists and space-separated numbers, both read
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["inputs", "label", "split"])
            for i, row in enumerate(zip(*table.values())):
                seq = json.dumps(row[0]) if i % 2 else " ".join(map(str, row[0]))
                w.writerow([seq, row[1], row[2]])
    return path


# ----------------------------------------------------------- end to end, by format


def test_npz_extract_and_fit_linear_through_the_cli(tmp_path):
    raw = vector_arrays()
    data = tmp_path / "signs.npz"
    np.savez(data, **{f"{s}_{k}": v for s, (x, y) in raw.items() for k, v in (("inputs", x), ("labels", y))})
    store = tmp_path / "signs.zarr"
    result = invoke("extract", "--data", data, *TINY, "--out", store)
    assert_ok(result)
    with FeatureStore.open(store) as st:
        assert st.splits == ["train", "val", "test"]
        assert st.attrs["task"]["name"] == "data" and st.attrs["task"]["params"] == {"path": str(data.resolve())}
        assert st.attrs["task"]["fingerprint"] == get_task("data", path=str(data)).fingerprint
    result = invoke("fit-linear", store, "--layer", "all", "--results", tmp_path / "results")
    assert_ok(result)
    assert "majority-class test accuracy" in result.stdout
    assert sorted(p.name for p in (tmp_path / "results" / "signs").iterdir()) == [
        f"logistic-layer{k}.json" for k in range(3)]


@pytest.mark.parametrize("fmt", ["save_to_disk", "parquet", "csv"])
def test_columnar_formats_extract_and_fit_linear_through_the_cli(tmp_path, fmt):
    rows = token_rows()
    data = write_columnar(tmp_path / {"save_to_disk": "tokens", "parquet": "tokens.parquet", "csv": "tokens.csv"}[fmt],
                          rows, fmt)
    store = tmp_path / "tokens.zarr"
    assert_ok(invoke("extract", "--data", data, *TINY, "--out", store))
    result = invoke("fit-linear", store, "--layer", "all", "--results", tmp_path / "results")
    assert_ok(result)
    task = get_task("data", path=str(data))
    assert (task.kind, task.d_in, task.n_classes) == ("tokens", 9, 3)
    for split, (seqs, labels) in rows.items():  # the file's rows, right-padded, with their lengths
        x, lengths = padded(seqs)
        s = task.splits[split]
        np.testing.assert_array_equal(s.inputs, x)
        np.testing.assert_array_equal(s.lengths, lengths)
        np.testing.assert_array_equal(s.labels, labels)


def test_train_and_fit_raw_take_data(tmp_path):
    raw = vector_arrays()
    data = tmp_path / "signs.npz"
    np.savez(data, **{f"{s}_{k}": v for s, (x, y) in raw.items() for k, v in (("inputs", x), ("labels", y))})
    result = invoke("fit-raw", "--data", data)
    assert_ok(result)
    assert "\ndata-signs raw inputs (18 features)" in result.stdout  # after the task cache's line
    out = tmp_path / "run"
    result = invoke("train", "--data", data, "--backbone", "tiny-bert", "--layers", "1", "--steps", "4",
                    "--eval-every", "4", "--quiet", "--out", out)
    assert_ok(result)
    assert json.loads((out / "results.json").read_text())["task"]["name"] == "data"


# ------------------------------------------------------------- the task and its arrays


def test_npz_task_equals_the_arrays_written(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 7, size=(30, 9)).astype(np.int32)
    lengths = rng.integers(1, 10, size=30)
    labels = rng.integers(0, 4, size=30)
    data = tmp_path / "ids.npz"
    np.savez(data, train_inputs=ids[:20], train_lengths=lengths[:20], train_labels=labels[:20],
             test_inputs=ids[20:], test_lengths=lengths[20:], test_labels=labels[20:], vocab_size=np.int64(12))
    task = get_task("data", path=str(data))
    expected = Task.from_arrays(train=(ids[:20], labels[:20]), test=(ids[20:], labels[20:]), vocab=None, d_in=12,
                                lengths={"train": lengths[:20], "test": lengths[20:]}, name="ids")
    assert (task.name, task.kind, task.d_in, task.n_classes) == ("data", "tokens", 12, expected.n_classes)
    assert list(task.splits) == list(expected.splits) == ["train", "test"]
    for split in expected.splits:
        for part in ("inputs", "lengths", "labels"):
            np.testing.assert_array_equal(getattr(task.splits[split], part), getattr(expected.splits[split], part))
    assert task.splits["train"].inputs.dtype == np.int32  # a dtype the backbone reads is kept


def test_fingerprint_and_task_cache_follow_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RESERVOIR_TASK_CACHE", str(tmp_path / "tasks"))
    raw = vector_arrays(n=(30, 0, 10))
    data = tmp_path / "d.npz"

    def write(labels_flipped: bool):
        (x, y), (xt, yt) = raw["train"], raw["test"]
        np.savez(data, train_inputs=x, train_labels=1 - y if labels_flipped else y, test_inputs=xt, test_labels=yt)

    write(False)
    first = load_task("data", {"path": str(data)})
    again = load_task("data", {"path": str(data)})  # from the task cache
    assert again.fingerprint == first.fingerprint
    write(True)  # same size; the modification time moves on (set it, in case the clock is coarse)
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = load_task("data", {"path": str(data)})
    assert changed.fingerprint != first.fingerprint
    np.testing.assert_array_equal(changed.splits["train"].labels, 1 - raw["train"][1])
    assert len(list((tmp_path / "tasks").iterdir())) == 2


def test_default_store_and_run_paths_name_the_file():
    config = ExtractConfig(task="data", backbone="tiny-bert", task_params={"path": "/data/my digits.npz"})
    assert config.default_out() == os.path.join("cache", "data-my_digits-tiny-bert-pretrained.zarr")
    assert ExtractConfig(task="digits", backbone="tiny-bert").default_out() == os.path.join(
        "cache", "digits-tiny-bert-pretrained.zarr")
    from reservoir.training import TrainConfig

    out = TrainConfig(task="data", backbone="tiny-bert", task_params={"path": "/x/signs.parquet"}).default_out()
    assert Path(out).name.startswith("data-signs-tiny-bert-pretrained-")


def test_recipe_cell_reads_a_data_file_beside_the_recipe(tmp_path, monkeypatch):
    from reservoir.recipes import load_recipe, run_recipe

    folder = tmp_path / "exp"
    folder.mkdir()
    raw = vector_arrays(n=(40, 0, 12))
    np.savez(folder / "signs.npz", train_inputs=raw["train"][0], train_labels=raw["train"][1],
             test_inputs=raw["test"][0], test_labels=raw["test"][1])
    (folder / "mine.yaml").write_text("cells:\n  - {kind: fit-linear, task: data, task_params: {path: signs.npz}, "
                                      "backbone: tiny-bert, layers: 1, fit_layers: [1]}\n")
    monkeypatch.chdir(tmp_path)  # elsewhere: the path is the recipe folder's
    recipe = load_recipe(folder / "mine.yaml")
    assert recipe.cells[0].task_params["path"] == str((folder / "signs.npz").resolve())
    (run,) = recipe.runs()
    assert run.id.startswith("fit-linear__data-signs__tiny-bert") and run.label()["task"] == "data-signs"
    done = run_recipe(recipe, out=tmp_path / "out", progress=False, cache_dir=tmp_path / "stores", device="cpu")
    assert done["ran"] == [run.id]
    assert (tmp_path / "out" / run.id / "logistic-layer1.json").is_file()
    with pytest.raises(ReservoirError, match="task 'data' needs path"):
        from reservoir.recipes import Recipe

        Recipe.from_dict({"cells": [{"kind": "fit-raw", "task": "data"}]})


def test_a_recipe_redoes_the_runs_whose_data_file_changed_and_its_report_says_so(tmp_path, monkeypatch):
    """A data file rewritten at the same path: its runs are redone, not skipped (the dry run says why). The report
    reads nothing outside the results folder: it judges the results by their recorded settings, data or none."""
    from reservoir.recipes import load_recipe, run_recipe
    from reservoir.report import report

    monkeypatch.setenv("RESERVOIR_TASK_CACHE", str(tmp_path / "tasks"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3, 2)).astype(np.float32)

    def write(labels):
        np.savez(tmp_path / "d.npz", train_inputs=x[:40], train_labels=labels[:40], test_inputs=x[40:],
                 test_labels=labels[40:])

    write((x[:, 0, 0] > 0).astype(np.int64))
    # a relative path: taken from the recipe's folder, wherever the run is started from
    (tmp_path / "r.yaml").write_text("cells:\n  - {kind: fit-raw, task: data, task_params: {path: d.npz}}\n")
    recipe, out = load_recipe(tmp_path / "r.yaml"), tmp_path / "out"
    kw = dict(out=out, progress=False, cache_dir=tmp_path / "stores", device="cpu")
    (run,) = recipe.runs()
    assert run_recipe(recipe, **kw)["ran"] == [run.id]
    assert run_recipe(recipe, **kw)["skipped"] == [run.id]  # the same data: skipped
    before = json.loads((out / run.id / "logistic.json").read_text())["recipe"]["data"]
    write(rng.integers(0, 2, 60))  # other labels, same path
    monkeypatch.setenv("RESERVOIR_TASK_CACHE", str(tmp_path / "no-tasks"))
    assert "not run" not in report(out).markdown and not (tmp_path / "no-tasks").exists()  # the data never read
    assert "(computed on other data (data digest " in invoke("recipe", "run", tmp_path / "r.yaml", "--out", out,
                                                                  "--dry-run").output
    monkeypatch.setenv("RESERVOIR_TASK_CACHE", str(tmp_path / "tasks"))
    assert run_recipe(recipe, **kw)["ran"] == [run.id]
    after = json.loads((out / run.id / "logistic.json").read_text())["recipe"]["data"]
    assert len(before) == len(after) == 64 and before != after
    (tmp_path / "d.npz").unlink()  # the results, read without their data
    assert "not run" not in report(out).markdown


# ------------------------------------------------------------ Python: the keyword form


def test_from_arrays_keyword_form_equals_the_mapping_form():
    raw = vector_arrays()
    lengths = {"train": np.full(60, 4), "test": np.arange(20) % 6 + 1}
    kw = TaskData.from_arrays(train=raw["train"], val=raw["val"], test=raw["test"], lengths=lengths, name="signs")
    mapping = TaskData.from_arrays("signs", {"train": (raw["train"][0], lengths["train"], raw["train"][1]),
                                             "val": raw["val"], "test": (raw["test"][0], lengths["test"],
                                                                         raw["test"][1])})
    assert kw.fingerprint == mapping.fingerprint and list(kw.splits) == ["train", "val", "test"]
    assert Task is TaskData and TaskData.from_arrays(train=raw["train"], test=raw["test"]).name == "arrays"
    for bad, match in (
        (dict(splits={"train": raw["train"], "test": raw["test"]}, train=raw["train"]), "not both"),
        (dict(train=(raw["train"][0], lengths["train"], raw["train"][1]), test=raw["test"], lengths=lengths),
         "not both places"),
        (dict(train=raw["train"], test=raw["test"], lengths={"val": lengths["train"]}), "lengths="),
        (dict(), "found neither"),
    ):
        with pytest.raises(ReservoirError, match=match) as err:
            TaskData.from_arrays(**bad)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------- bad files


def _npz(path, **fields):
    np.savez(path, **fields)
    return path


def _bad_npz_cases(tmp_path):
    """``(file, fragments the one line must hold)`` for each bad .npz."""
    raw = vector_arrays(n=(20, 0, 8))
    (x, y), (xt, yt) = raw["train"], raw["test"]
    nan, inf = xt.copy(), x.copy()
    nan[3, 2, 1], inf[5, 0, 0] = np.nan, np.inf
    ok = dict(train_inputs=x, train_labels=y, test_inputs=xt, test_labels=yt)
    return {
        "missing split": (_npz(tmp_path / "nosplit.npz", train_inputs=x, train_labels=y),
                          ["test_inputs", "expected this field", "split 'test' is required",
                           "found fields train_inputs, train_labels"]),
        "no field of ours": (_npz(tmp_path / "other.npz", x=x, y=y),  # the file's own fields, not "(none)"
                             ["train_inputs", "expected this field", "found fields x, y"]),
        "labels not integers": (_npz(tmp_path / "floats.npz", **{**ok, "train_labels": y.astype(np.float64)}),
                                ["train_labels", "expected integer labels", "found float64"]),
        "lengths beyond L": (_npz(tmp_path / "long.npz", **ok, train_lengths=np.full(20, 7)),
                             ["train_lengths", "expected lengths in 1..6", "found 7 at row 0"]),
        "NaN in inputs": (_npz(tmp_path / "nan.npz", **{**ok, "test_inputs": nan}),
                          ["test_inputs", "expected finite numbers", "found NaN at row 3"]),
        "inf in inputs": (_npz(tmp_path / "inf.npz", **{**ok, "train_inputs": inf}),
                          ["train_inputs", "expected finite numbers", "found infinity at row 5"]),
        "mismatched row counts": (_npz(tmp_path / "rows.npz", **{**ok, "test_labels": yt[:-1]}),
                                  ["test_labels", "expected 8 rows, one per row of test_inputs", "found 7 rows"]),
        "a misspelt field": (_npz(tmp_path / "typo.npz", **ok, train_length=np.full(20, 6)),
                             ["train_length", "expected train_inputs, train_labels or train_lengths"]),
        "beyond float32": (_npz(tmp_path / "big.npz", **{**ok, "train_inputs": np.full(x.shape, 1e300)}),
                           ["train_inputs", "expected finite numbers (as float32)", "found infinity at row 0"]),
        "a huge token id": (_npz(tmp_path / "huge_id.npz", **{**ok, "train_inputs": np.full((20, 6), 10**9),
                                                               "test_inputs": np.zeros((8, 6), np.int64)}),
                            ["expected token ids below 1,048,576", "found id 1,000,000,000"]),
        "a uint64 id beyond int64": (_npz(tmp_path / "u64.npz", **{**ok, "train_inputs": np.full((20, 6), 2**63,
                                                                                                 np.uint64),
                                                                    "test_inputs": np.zeros((8, 6), np.uint64)}),
                                     ["expected token ids below 1,048,576", "found id 9,223,372,036,854,775,808"]),
        "a huge label": (_npz(tmp_path / "huge_label.npz", **{**ok, "train_labels": np.full(20, 10**8)}),
                         ["expected labels below 100,000", "found 100,000,000"]),
        "a split named valid": (_npz(tmp_path / "valid.npz", **ok, valid_inputs=xt, valid_labels=yt),  # was dropped
                                ["valid_inputs: expected the fields of the splits train, val and test",
                                 "a validation split is named val", "found 'valid_inputs'"]),
        "a split in capitals": (_npz(tmp_path / "VAL.npz", **ok, VAL_inputs=xt, VAL_labels=yt),
                                ["VAL_inputs: expected the fields of the splits", "found 'VAL_inputs'"]),
        "one train class": (_npz(tmp_path / "one.npz", **{**ok, "train_labels": np.ones(20, np.int64)}),
                            ["expected at least two classes in the train split; found only class 1"]),
    }


def _npy(a) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _zip(path, members, encrypted=False):
    """An .npz written member by member (names and bytes as given); ``encrypted`` sets every member's encryption
    flag, as a zip tool's password would."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members:
            z.writestr(name, data)
    if encrypted:
        raw = bytearray(path.read_bytes())
        for signature, flag in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local and central headers
            at = raw.find(signature)
            while at >= 0:
                raw[at + flag] |= 1
                at = raw.find(signature, at + 4)
        path.write_bytes(bytes(raw))
    return path


def _zip_cases(tmp_path):
    """Archives numpy.savez never writes: a field twice, a garbled .npy header, encrypted members."""
    raw = vector_arrays(n=(20, 0, 8))
    (x, y), (xt, yt) = raw["train"], raw["test"]
    ok = [(f"{k}.npy", _npy(v)) for k, v in dict(train_inputs=x, train_labels=y, test_inputs=xt,
                                                  test_labels=yt).items()]
    head = b"{'descr': '<f4', 'fortran_order': False, 'shape': (20, \n"  # a header whose dict never closes
    garbled = b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head
    return {
        "a field stored twice": (_zip(tmp_path / "twice.npz", [*ok, ("train_labels", _npy(np.zeros(20, int)))]),
                                 ["train_labels: expected each field once",
                                  "found the members 'train_labels.npy' and 'train_labels'"]),
        "a garbled .npy header": (_zip(tmp_path / "garbled.npz", [*ok[1:], ("train_inputs.npy", garbled)]),
                                  ["train_inputs: expected a numeric array (.npy data)"]),
        "encrypted members": (_zip(tmp_path / "enc.npz", ok, encrypted=True),
                              ["expected an .npz archive written by numpy.savez", "is encrypted"]),
    }


@pytest.mark.parametrize("case", ["a field stored twice", "a garbled .npy header", "encrypted members"])
def test_archives_numpy_never_writes_are_one_line(tmp_path, case):
    path, fragments = _zip_cases(tmp_path)[case]
    store = tmp_path / "out.zarr"
    assert_one_line(invoke("extract", "--data", path, *TINY, "--out", store), str(path), *fragments)
    assert not store.exists()


BAD_NPZ = ["missing split", "no field of ours", "labels not integers", "lengths beyond L", "NaN in inputs",
           "inf in inputs", "mismatched row counts", "a misspelt field", "beyond float32", "a huge token id",
           "a uint64 id beyond int64", "a huge label", "a split named valid", "a split in capitals", "one train class"]


@pytest.mark.parametrize("case", BAD_NPZ)
def test_bad_npz_is_one_line_exit_2_and_no_store(tmp_path, case):
    path, fragments = _bad_npz_cases(tmp_path)[case]
    store = tmp_path / "out.zarr"
    assert_one_line(invoke("extract", "--data", path, *TINY, "--out", store), str(path), *fragments)
    assert not store.exists()


def test_unreadable_and_unknown_files_are_one_line(tmp_path):
    store = tmp_path / "out.zarr"
    cases = {
        tmp_path / "junk.npz": ["expected an .npz archive", "not a zip archive"],
        tmp_path / "notes.txt": ["expected an .npz, .parquet or .csv file", "'.txt'"],
        tmp_path / "absent.npz": ["no such file or folder"],
        tmp_path / "empty_folder": ["expected a folder written by datasets' save_to_disk"],
    }
    (tmp_path / "junk.npz").write_text("hello")
    good = _npz(tmp_path / "good.npz", train_inputs=np.zeros((4, 3), np.int64), train_labels=np.arange(4) % 2,
                test_inputs=np.zeros((2, 3), np.int64), test_labels=np.arange(2))
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:100])
    cases[tmp_path / "cut.npz"] = ["expected an .npz archive", "a damaged or truncated zip archive"]
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty_folder").mkdir()
    for path, fragments in cases.items():
        if path.name == "empty_folder":
            pytest.importorskip("datasets")
        assert_one_line(invoke("extract", "--data", path, *TINY, "--out", store), str(path), *fragments)
        assert not store.exists()


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_bad_columnar_files_are_one_line(tmp_path, fmt):
    pytest.importorskip("pyarrow")
    rows = token_rows(n=(10, 4))
    path = write_columnar(tmp_path / f"t.{fmt}", rows, fmt)
    store = tmp_path / "out.zarr"
    assert_one_line(invoke("extract", "--data", path, "--label-column", "target", *TINY, "--out", store),
                    str(path), "column 'target'", "expected a column of that name (--label-column)",
                    "found columns inputs, label, split")
    train_only = write_columnar(tmp_path / f"train-only.{fmt}", {"train": rows["train"]}, fmt)
    assert_one_line(invoke("extract", "--data", train_only, *TINY, "--out", store), str(train_only),
                    "splits: expected 'train' and 'test'", "found 'train'")
    import pyarrow as pa

    floats = {"inputs": [[1, 2], [3]] * 2, "label": [0.0, 1.5] * 2, "split": ["train", "train", "test", "test"]}
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(pa.table(floats), tmp_path / "f.parquet")
    else:
        (tmp_path / "f.csv").write_text("inputs,label,split\n1 2,0.0,train\n3,1.5,train\n1 2,0.0,test\n3,1.5,test\n")
    assert_one_line(invoke("extract", "--data", tmp_path / f"f.{fmt}", *TINY, "--out", store),
                    f"f.{fmt}", "split 'train', column 'label': expected integer labels", "found values of type double")
    assert not store.exists()


def test_csv_columns_named_twice_or_for_two_roles_are_one_line_and_one_number_is_a_sequence(tmp_path):
    pytest.importorskip("pyarrow")
    store = tmp_path / "out.zarr"
    rows = "".join(f"{i % 5},{i % 2},{'train' if i < 12 else 'test'}\n" for i in range(16))
    (tmp_path / "one.csv").write_text("inputs,label,split\n" + rows)  # every cell one token: pyarrow reads ints
    task = load_task("data", {"path": str(tmp_path / "one.csv")}, cache_dir=None)
    assert task.kind == "tokens" and task.splits["train"].inputs.shape == (12, 1)
    np.testing.assert_array_equal(task.splits["train"].inputs[:, 0], np.arange(12) % 5)
    (tmp_path / "twice.csv").write_text("inputs,inputs,label,split\n1 2,3,0,train\n1,2,1,test\n")
    assert_one_line(invoke("extract", "--data", tmp_path / "twice.csv", *TINY, "--out", store),
                    "column 'inputs': expected it once in the header row; found it 2 times")
    for flag in ("--label-column", "--input-column"):
        assert_one_line(invoke("extract", "--data", tmp_path / "one.csv", flag, "split", *TINY, "--out", store),
                        f"column 'split': expected another column for {flag}; found 'split', which names each "
                        "row's split in a single table")
    assert_one_line(invoke("extract", "--data", tmp_path / "one.csv", "--input-column", "label", *TINY, "--out",
                           store), "expected the inputs and the labels in two columns; found 'label' named for both")
    (tmp_path / "vals.csv").write_text("inputs,label,split\n1 2,0,train\n2,1,train\n1,1,val\n2,0,validation\n"
                                       "1,1,test\n2,0,test\n")  # two names of one split: not merged
    assert_one_line(invoke("extract", "--data", tmp_path / "vals.csv", *TINY, "--out", store),
                    "column 'split': expected one name for the validation split; found both 'val' and 'validation'")
    assert not store.exists()


def test_one_long_row_that_would_pad_beyond_memory_is_refused_before_padding(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    import reservoir.io.system as rio

    long_row = " ".join(["1"] * 2000)
    rows = "".join(f"{long_row if i == 0 else 2},{i % 2},{'train' if i < 3000 else 'test'}\n" for i in range(4000))
    (tmp_path / "long.csv").write_text("inputs,label,split\n" + rows)
    monkeypatch.setattr(rio, "available_memory", lambda: 16 * 2**20)  # 3,000 x 2,000 int64 ids are 45.8 MiB
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "long.csv"), "split 'train', column 'inputs'",
                    "expected padded sequences (3,000 rows x 2,000 positions) that fit in the 16.0 MiB of memory "
                    "available; found 45.8 MiB")


def test_small_token_ids_are_checked_against_memory_as_the_int64_they_become(tmp_path, monkeypatch):
    """int8 ids of 3 MB (compressed to a few KiB) become 24 MB of int64: the check counted the 3 MB alone."""
    import reservoir.io.system as rio

    np.savez_compressed(tmp_path / "small.npz", train_inputs=np.zeros((3000, 1000), np.int8),
                        train_labels=np.arange(3000) % 2, test_inputs=np.zeros((10, 1000), np.int8),
                        test_labels=np.arange(10) % 2)
    monkeypatch.setattr(rio, "available_memory", lambda: 16 * 2**20)
    assert_one_line(invoke("extract", "--data", tmp_path / "small.npz", *TINY, "--out", tmp_path / "s.zarr"),
                    "expected arrays read and converted (token ids to int64, numbers to float32) that fit in the "
                    "16.0 MiB of memory available")
    assert not (tmp_path / "s.zarr").exists()


def test_save_to_disk_folders_whose_arrow_data_or_names_mislead_the_reader_are_one_line(tmp_path):
    """Offsets past a column's buffers crashed the process in pyarrow's kernels (exit 139); a folder named with
    '::' was read by datasets as the folder before it; a shard listed twice gave its rows twice."""
    datasets = pytest.importorskip("datasets")
    import json
    import shutil

    def saved(path, first=0):
        datasets.Dataset.from_dict({"inputs": [[1, 2, 3], [2, 3]] * 6, "label": [first, 1 - first] * 6,
                                    "split": ["train"] * 8 + ["test"] * 4}).save_to_disk(str(path))
        return path

    bad = saved(tmp_path / "bad")
    (arrow,) = bad.glob("*.arrow")
    raw = bytearray(arrow.read_bytes())
    offsets = np.array([0, 3, 5, 8], np.int32).tobytes()  # the inputs column's first offsets, as written
    at = raw.find(offsets)
    assert at > 0
    raw[at + 8:at + 12] = np.array([-5], np.int32).tobytes()
    arrow.write_bytes(bytes(raw))
    assert_one_line(invoke("extract", "--data", bad, *TINY, "--out", tmp_path / "b.zarr"),
                    "expected Arrow data as datasets writes it", "non-monotonic offset")
    saved(tmp_path / "my", 0)
    shutil.move(saved(tmp_path / "other", 1), tmp_path / "my::data")
    assert_one_line(invoke("extract", "--data", tmp_path / "my::data", *TINY, "--out", tmp_path / "c.zarr"),
                    "expected a folder path without '::' (datasets would read another folder")
    twice = saved(tmp_path / "twice")
    state = json.loads((twice / "state.json").read_text())
    state["_data_files"] *= 2
    (twice / "state.json").write_text(json.dumps(state))
    assert_one_line(invoke("extract", "--data", twice, *TINY, "--out", tmp_path / "t.zarr"),
                    "state.json: _data_files: expected each name once")
    assert not any(tmp_path.glob("*.zarr"))


def test_csv_cells_quoted_over_several_lines_read_in_a_file_of_many_blocks(tmp_path):
    """pyarrow reads a CSV file in blocks of about 1 MB and split quoted cells holding line breaks at a block's
    end: a file of such cells was refused past 1 MB ("expected a CSV file with a header row")."""
    pytest.importorskip("pyarrow")
    import json

    rng = np.random.default_rng(0)
    rows = [(rng.integers(0, 5, 40).tolist(), i % 2, "train" if i < 10000 else "test") for i in range(12000)]
    text = "inputs,label,split\n" + "".join(f'"{json.dumps(x, indent=1)}",{y},{s}\n' for x, y, s in rows)
    assert len(text) > 2_000_000
    (tmp_path / "big.csv").write_text(text)
    from reservoir.tasks.data import build_data

    task = build_data(str(tmp_path / "big.csv"))
    assert task.splits["train"].inputs.shape == (10000, 40) and task.splits["test"].labels.tolist() == [0, 1] * 1000


def test_a_table_that_would_decode_beyond_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A Parquet column of one repeated run is a few KiB on disk and 32 MB decoded: its footer is checked against
    memory before pyarrow decodes it (and a CSV file's size before pyarrow reads it)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    import reservoir.io.system as rio

    n = 4000
    pq.write_table(pa.table({"inputs": [[1] * 1000] * n, "label": [i % 2 for i in range(n)],
                             "split": ["train" if i < 3000 else "test" for i in range(n)]}), tmp_path / "runs.parquet")
    assert (tmp_path / "runs.parquet").stat().st_size < 2**20
    monkeypatch.setattr(rio, "available_memory", lambda: 16 * 2**20)
    line = assert_one_line(invoke("fit-raw", "--data", tmp_path / "runs.parquet"),
                           "expected decoded columns that fit in the 16.0 MiB of memory available; found")
    assert float(line.rsplit("found ", 1)[1].split()[0]) >= 30  # about 32 MB of int64 values, in MiB
    write_columnar(tmp_path / "t.csv", token_rows(n=(40, 20)), "csv")
    size = (tmp_path / "t.csv").stat().st_size
    monkeypatch.setattr(rio, "available_memory", lambda: size)
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "t.csv"),
                    "expected columns read as a table (about twice the file's size) that fit in the")
    monkeypatch.setattr(rio, "available_memory", lambda: 64 * 2**20)
    ok = invoke("extract", "--data", tmp_path / "t.csv", *TINY, "--out", tmp_path / "t.zarr")
    assert ok.exit_code == 0, ok.output  # with memory enough, the same file is read


def test_a_uint64_label_beyond_int64_is_named_as_it_is(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "u64.parquet"
    pq.write_table(pa.table({"inputs": [[1, 2], [3], [1], [2]], "label": pa.array([0, 2**63 + 1, 0, 1], pa.uint64()),
                             "split": ["train", "train", "test", "test"]}), path)
    assert_one_line(invoke("fit-raw", "--data", path), "expected labels below 100,000",
                    "found 9,223,372,036,854,775,809")  # not wrapped to a negative int64


def test_csv_cells_parse_as_json_reads_them_and_what_json_refuses_is_refused(tmp_path):
    """Flat cells are parsed by pyarrow's kernels: every JSON number form (NaN and Infinity too) as Python's json
    reads it, ints staying ints unless a float is among them, and nothing json refuses taken."""
    from reservoir.tasks.cells import sequence_arrays

    pa = pytest.importorskip("pyarrow")

    def parsed(*cells):
        inputs, lengths = sequence_arrays(Path("f.csv"), "column 'x'", pa.array(cells, pa.string()))
        return inputs.dtype, inputs.tolist(), lengths.tolist()

    assert parsed(" [ 1 ,2 ] ", "\t7\n8", "-0 5 6") == (np.int64, [[1, 2, 0], [7, 8, 0], [0, 5, 6]], [2, 2, 3])
    assert parsed("[0.5, 1]", "2 1e3", "-2.25E+2")[:2] == (np.float32, [[[0.5], [1.0]], [[2.0], [1000.0]],
                                                                       [[-225.0], [0.0]]])
    assert parsed("[[1, 2], [3, 4]]", "[[5, 6]]")[1] == [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [0.0, 0.0]]]
    assert parsed("1\u00a02", "3\u20034")[1] == [[1, 2], [3, 4]]  # spaces as str.split() takes them
    with pytest.raises(ReservoirError, match="expected lists of numbers .*cannot mix list and non-list"):
        parsed("1 2", "[[5, 6]]")  # a flat cell among nested ones: said so, not "found '1 2'"
    for cells, found in [(("1, 2",), "'1, 2' at row 0"), (("3", "[1,,2]"), "'[1,,2]' at row 1"),
                         (("01 2",), "'01 2' at row 0"), (("1 x",), "'1 x' at row 0"),
                         (("1 [2]",), "'1 [2]' at row 0"), (("[1, 2",), "'[1, 2' at row 0")]:
        with pytest.raises(ReservoirError, match=re.escape(f"expected a JSON list or numbers separated by spaces in "
                                                           f"every cell; found {found}")):
            parsed(*cells)
    for cells, found in [(("0.1 nan",), "'nan' at row 0"), (("1", "0.1 -INF"), "'-INF' at row 1"),
                         (("[0.1, nan]",), "'nan' at row 0"), (("[[1, 2], [inf, 3]]",), "'inf' at row 0")]:
        with pytest.raises(ReservoirError, match=re.escape(f"expected finite numbers in every cell; found {found}")):
            parsed(*cells)  # the cause named, not the cell's form
    for cells, row in [(("1", "[ ]"), 1), (("  ", "1"), 0)]:
        with pytest.raises(ReservoirError, match=f"expected at least one position per row; found an empty sequence "
                                                 f"at row {row}"):
            parsed(*cells)
    with pytest.raises(ReservoirError, match="expected lists of numbers .* '99999999999999999999'"):
        parsed("1 99999999999999999999")


def test_csv_cells_are_parsed_at_the_speed_of_the_file_and_checked_against_memory_first(tmp_path, monkeypatch):
    """25,000 numbers a row took 40 ms a row in Python (json.loads each); pyarrow's kernels parse them in one pass.
    The parse's memory (about eight times the cells' text) is checked before it."""
    pytest.importorskip("pyarrow")
    import reservoir.io.system as rio

    row = " ".join(["7"] * 25_000)
    text = "".join(f"{row},{i % 2},{'train' if i < 60 else 'test'}\n" for i in range(80))
    (tmp_path / "wide.csv").write_text("inputs,label,split\n" + text)
    task = load_task("data", {"path": str(tmp_path / "wide.csv")}, cache_dir=None)
    assert task.splits["train"].inputs.shape == (60, 25_000) and (task.splits["train"].inputs == 7).all()
    monkeypatch.setattr(rio, "available_memory", lambda: 8 * 2**20)  # the file (4 MiB) is read; its cells' parse
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "wide.csv"),  # needs about 8 x 3 MiB
                    "column 'inputs': expected cells parsed (about eight times their text) that fit "
                    "in the 8.0 MiB of memory available")


def test_a_csv_file_is_tokens_or_numbers_as_a_whole(tmp_path):
    """A writer that prints 1.0 as 1 left one split all integers: the file was refused as continuous in one split
    and tokens in another. The kind is decided over the whole column: here, numbers."""
    pytest.importorskip("pyarrow")
    text = "inputs,label,split\n1.0 2.5,0,train\n0.5 2,1,train\n2 2,0,test\n3 1,1,test\n"
    (tmp_path / "mixed.csv").write_text(text)
    task = load_task("data", {"path": str(tmp_path / "mixed.csv")}, cache_dir=None)
    assert task.kind == "continuous" and task.splits["test"].inputs.dtype == np.float32
    np.testing.assert_array_equal(task.splits["test"].inputs[..., 0], [[2, 2], [3, 1]])


def test_token_ids_beyond_int64_and_floats_beyond_float32_are_one_line_as_they_are(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    split = ["train", "train", "test", "test"]
    pq.write_table(pa.table({"inputs": pa.array([[1], [2**64 - 1], [1], [2]], pa.list_(pa.uint64())),
                             "label": [0, 1, 0, 1], "split": split}), tmp_path / "ids.parquet")
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "ids.parquet"),
                    "expected token ids below 1,048,576 (a one-hot vocabulary); found id 18,446,744,073,709,551,615")
    pq.write_table(pa.table({"inputs": [[1e300], [3.0], [1.0], [2.0]], "label": [0, 1, 0, 1], "split": split}),
                   tmp_path / "big.parquet")
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "big.parquet"),  # no RuntimeWarning line before it
                    "column 'inputs': expected finite numbers (as float32); found infinity at row 0")
    x = np.array([[[1e300]], [[1.0]]])
    with pytest.raises(ReservoirError, match="expected finite inputs"), warnings.catch_warnings():
        warnings.simplefilter("error")  # from_arrays' own cast: no warning either
        TaskData.from_arrays("big", train=(x, [0, 1]), test=(x, [0, 1]))


def test_a_csv_file_not_in_utf8_is_named_so(tmp_path):
    pytest.importorskip("pyarrow")
    text = "inputs,label,split\n1 2,0,train\n3,1,train\n1 2,0,test\n3,1,test\n"
    (tmp_path / "u16.csv").write_bytes(text.encode("utf-16"))  # with its byte-order mark, as editors save it
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "u16.csv"),
                    "expected a CSV file of UTF-8 text; found UTF-16 (its byte-order mark): save it as UTF-8")
    (tmp_path / "latin1.csv").write_bytes(text.replace("1 2,0,test", "1 2\u00e9,0,test").encode("latin-1"))
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "latin1.csv"),
                    "expected a CSV file of UTF-8 text; found a byte that is not UTF-8 at byte 44 (0xe9)")
    # the byte in the split or label column (pyarrow reads those as bytes, not text): the same line
    for i, row in enumerate(["3,1,tr\u00e9in", "3,\u00e91,train"]):
        (tmp_path / f"other{i}.csv").write_bytes(text.replace("3,1,train", row).encode("latin-1"))
        assert_one_line(invoke("fit-raw", "--data", tmp_path / f"other{i}.csv"),
                        "expected a CSV file of UTF-8 text; found a byte that is not UTF-8 at byte "
                        f"{31 + row.index(chr(0xe9))} (0xe9)")  # the row starts at byte 31


def test_a_saved_dataset_with_an_empty_split_says_so(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"inputs": [[1, 2], [3]], "label": [0, 1]}),
                          "test": datasets.Dataset.from_dict({"inputs": [], "label": []})}).save_to_disk(
        str(tmp_path / "hf"))
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "hf"),
                    "split 'test': expected at least one row; found none (its state.json lists no data files)")


def test_an_npz_member_with_rows_after_its_data_is_refused(tmp_path):
    """A member whose header claims fewer rows than it holds (numpy writes exactly the header and the data): refused,
    as an IDX file's trailing bytes are, not read with rows dropped."""
    import io
    import zipfile

    def member(a, claimed_rows):
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": a.dtype.str, "fortran_order": False,
                                                   "shape": (claimed_rows, *a.shape[1:])})
        return buf.getvalue() + a.tobytes()

    x, y = np.arange(28 * 6).reshape(28, 6) % 5, np.arange(28) % 2
    with zipfile.ZipFile(tmp_path / "t.npz", "w") as z:
        z.writestr("train_inputs.npy", member(x, 14))
        z.writestr("train_labels.npy", member(y, 14))
        z.writestr("test_inputs.npy", member(x, 28))
        z.writestr("test_labels.npy", member(y, 28))
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "t.npz"), "train_inputs: expected the 672 bytes of data its header claims (shape (14, 6), int64); found 1.3 KiB",
                    "(trailing bytes)")


def test_a_vocab_size_above_the_largest_vocabulary_names_its_field(tmp_path):
    x = np.array([[1, 2], [0, 3]])
    np.savez(tmp_path / "v.npz", train_inputs=x, train_labels=[0, 1], test_inputs=x, test_labels=[0, 1],
             vocab_size=np.int64(2**40))
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "v.npz"),
                    "vocab_size: expected at most 1,048,576 (a one-hot vocabulary); found 1,099,511,627,776")


def test_missing_optional_package_says_how_to_install(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    parquet = write_columnar(tmp_path / "t.parquet", token_rows(n=(4, 2)), "parquet")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "state.json").write_text("{}")  # the top of a saved dataset
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ReservoirError, match=r"datasets to read a save_to_disk .*pip install 'reservoir\[datasets\]'"):
        get_task("data", path=str(folder))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ReservoirError, match=r"pyarrow to read Parquet.*pip install 'reservoir\[datasets\]'"):
        get_task("data", path=str(parquet))


def test_a_folder_not_saved_by_datasets_is_refused_without_walking_it(tmp_path, monkeypatch):
    """A mistyped --data /usr walked its 137,000 files twice (the cache key's stamps, the links check): 23 s before
    the refusal. A folder without dataset_dict.json or state.json at its top is refused before any walk."""
    from pathlib import Path

    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "file.txt").write_text("x")

    def walk(*args, **kwargs):
        raise AssertionError("the folder was walked")

    monkeypatch.setattr(Path, "rglob", walk)
    assert_one_line(invoke("fit-raw", "--data", tmp_path), "expected a folder written by datasets' save_to_disk "
                    "(dataset_dict.json or state.json at its top)", "found neither file")


def test_empty_data_path_is_refused():
    result = invoke("extract", "--data", "", *TINY)
    assert result.exit_code == 2 and "expected a data file or folder; found an empty path" in result.stderr


def test_task_and_data_together_or_neither_are_usage_errors(tmp_path):
    assert_one_line(invoke("extract", "--task", "bit-xor", "--data", tmp_path / "x.npz"), "expected --task or --data, "
                    "not both")
    assert_one_line(invoke("bench", "speedup", "--task", "bit-xor", "--data", tmp_path / "x.npz"), "not both")
    assert_one_line(invoke("extract", "--quiet"), "Missing option '--task' (or pass --data PATH)")
    assert_one_line(invoke("fit-raw", "--data", tmp_path / "x.npz", "-p", "path=y.npz"), "found -p path=...")
    assert_one_line(invoke("extract", "--task", "data"), "task 'data': expected path")


@pytest.mark.parametrize("command", ["extract", "train", "fit-raw", "bench"])
def test_column_options_without_data_are_refused_not_ignored(tmp_path, command):
    args = {"extract": ["extract", *TINY, "--out", tmp_path / "x.zarr"], "train": ["train", *TINY, "--steps", "1"],
            "fit-raw": ["fit-raw"], "bench": ["bench", "extract", *TINY]}[command]
    for flag in ("--input-column", "--label-column"):
        assert_one_line(invoke(*args, "--task", "bit-xor", flag, "x"),
                        f"{flag} names a column of a --data file; found it without --data")
    assert not (tmp_path / "x.zarr").exists()
