"""TAPE remote homology: JSON and LMDB fixtures in TAPE's formats, token ids, splits, drops, malformed files."""

import json
import os
import pickle

import lmdb
import numpy as np
import pytest

from reservoir.errors import ReservoirError
from reservoir.tasks import TASKS, get_task
from reservoir.tasks.homology import AMINO_ACIDS, TAPE_SPLITS, VOCAB, read_split

SEQS = {
    "train": ["ACDY", "BOUXZ", "MKV", "ACDEFGHIK", "W"],  # "ACDEFGHIK" (9) is dropped at max_length=6
    "valid": ["GG", "LLLLLLL"],  # "LLLLLLL" (7) dropped
    "test_fold_holdout": ["PQ", "RST"],
    "test_superfamily_holdout": ["VW", "Y"],
    "test_family_holdout": ["HHHHHH", "K"],  # "HHHHHH" (6 = max_length) dropped
}


def records(split, seqs=None):
    out = []
    for i, seq in enumerate(SEQS[split] if seqs is None else seqs):
        out.append({"id": f"d{split}{i}", "primary": seq, "protein_length": len(seq),
                    "fold_label": (7 * i + len(split)) % 1195, "superfamily_label": 3, "family_label": 5,
                    "class_label": 1})  # fmt: skip
    return out


def write_json(folder, split, recs):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"remote_homology_{split}.json").write_text(json.dumps(recs))


def write_lmdb(folder, split, recs, subdir=True, num_examples=True, extra=None):
    """As TAPE's files: pickled count under b"num_examples", pickled dicts under b"0", b"1", ..."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"remote_homology_{split}.lmdb"
    env = lmdb.open(str(path), map_size=1 << 22, subdir=subdir)
    with env.begin(write=True) as txn:
        if num_examples:
            txn.put(b"num_examples", pickle.dumps(len(recs)))
        for i, rec in enumerate(recs):
            rec = dict(rec, evolutionary=np.zeros((len(rec["primary"]), 30), np.float32),
                       fold_label=np.int64(rec["fold_label"])) if isinstance(rec, dict) else rec  # fmt: skip
            txn.put(str(i).encode(), pickle.dumps(rec))
        for key, value in (extra or {}).items():
            txn.put(key, value)
    env.close()
    return path


def write_all(folder, fmt="json", **kw):
    for split in TAPE_SPLITS:
        (write_json if fmt == "json" else write_lmdb)(folder, split, records(split), **kw)


def assert_one_line_error(exc_info, *fragments):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_vocabulary_order():
    assert AMINO_ACIDS == "ACDEFGHIKLMNPQRSTVWY" + "BOUXZ" and VOCAB == list(AMINO_ACIDS)
    assert len(VOCAB) == 25


def test_splits_ids_lengths_and_drops(tmp_path, capsys):
    write_all(tmp_path)
    task = get_task("remote-homology", data_dir=tmp_path, max_length=6)
    assert list(task.splits) == ["train", "val", "test", "test_superfamily_holdout", "test_family_holdout"]
    assert (task.kind, task.d_in, task.n_classes, task.vocab) == ("tokens", 25, 1195, VOCAB)
    tr = task.splits["train"]
    assert tr.inputs.dtype == np.uint8 and tr.inputs.shape == (4, 5)
    assert tr.inputs[0].tolist() == [0, 1, 2, 19, 0]  # ACDY, right-padded with 0
    assert tr.inputs[1].tolist() == [20, 21, 22, 23, 24]  # BOUXZ
    assert tr.inputs[3].tolist() == [18, 0, 0, 0, 0]  # W
    assert tr.lengths.dtype == np.int64 and tr.lengths.tolist() == [4, 5, 3, 1]
    assert tr.labels.dtype == np.int64 and tr.labels.tolist() == [5, 12, 19, 33]  # records 0, 1, 2, 4
    assert task.splits["test"].labels.tolist() == [17, 24]  # the fold holdout
    assert task.params["dropped"] == {"train": 1, "val": 1, "test": 0, "test_superfamily_holdout": 0,
                                      "test_family_holdout": 1}  # fmt: skip
    json.dumps(task.params)
    assert "data_dir" not in task.params and "format" not in task.params
    err = capsys.readouterr().err
    assert err.count("dropped") == 1 and "train 1" in err and "test_family_holdout 1" in err


def test_test_split_choice_and_subset(tmp_path):
    write_all(tmp_path / "remote_homology")  # the TAPE subfolder is found too
    task = get_task("remote-homology", data_dir=tmp_path, test_split="test_family_holdout",
                    splits="train,test_family_holdout,test_fold_holdout")  # fmt: skip
    assert list(task.splits) == ["train", "test", "test_fold_holdout"]
    assert task.splits["test"].lengths.tolist() == [6, 1]  # default max_length 1024 keeps all
    assert task.params["splits"] == ["train", "test_fold_holdout", "test_family_holdout"]
    small = get_task("remote-homology", data_dir=tmp_path, n_per_split=1, splits=["train", "test_fold_holdout"])
    assert len(small.splits["train"]) == 1 and len(small.splits["test"]) == 1


@pytest.mark.parametrize("subdir", [True, False])
def test_json_and_lmdb_give_identical_arrays(tmp_path, subdir):
    write_all(tmp_path / "j")
    write_all(tmp_path / "l", fmt="lmdb", subdir=subdir)
    a = get_task("remote-homology", data_dir=tmp_path / "j", max_length=6)
    b = get_task("remote-homology", data_dir=tmp_path / "l", max_length=6)
    for name in a.splits:
        for field in ("inputs", "lengths", "labels"):
            x, y = getattr(a.splits[name], field), getattr(b.splits[name], field)
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    assert a.fingerprint == b.fingerprint
    n = get_task("remote-homology", data_dir=tmp_path / "l", n_per_split=2, format="lmdb")
    assert len(n.splits["train"]) == 2


def test_json_preferred_and_format_param(tmp_path):
    write_all(tmp_path)
    write_lmdb(tmp_path, "train", records("train", ["Y"] * 5))
    assert get_task("remote-homology", data_dir=tmp_path).splits["train"].lengths[0] == 4  # JSON: ACDY
    write_lmdb(tmp_path, "test_fold_holdout", records("test_fold_holdout"))
    task = get_task("remote-homology", data_dir=tmp_path, format="lmdb", splits=["train", "test_fold_holdout"])
    assert task.splits["train"].inputs.tolist() == [[19]] * 5  # LMDB: Y x 5
    with pytest.raises(ReservoirError) as e:  # no LMDB test file
        get_task("remote-homology", data_dir=tmp_path, format="lmdb")
    assert_one_line_error(e, "remote_homology_valid.lmdb", str(tmp_path))


def test_read_split_lmdb_directly(tmp_path):
    path = write_lmdb(tmp_path, "train", records("train", ["Y"] * 3))
    split, dropped = read_split(str(path), max_length=1024)
    assert split.inputs.tolist() == [[19]] * 3 and dropped == 0


def test_a_json_file_beyond_the_toolkits_own_json_bound_is_read_when_memory_allows(tmp_path, monkeypatch):
    """TAPE's JSON records carry per-residue fields (PSSMs): files larger than the 64 MiB bound on the toolkit's own
    JSON files. They are bound by memory instead."""
    import reservoir.io

    recs = [dict(r, evolutionary=[[0.5] * 30] * len(r["primary"])) for r in records("train")]
    write_json(tmp_path, "train", recs)
    path = tmp_path / "remote_homology_train.json"
    monkeypatch.setattr(reservoir.io.reads, "MAX_JSON_BYTES", 1024)  # the file is ~5 KiB
    assert path.stat().st_size > 4096
    split, _ = read_split(str(path), max_length=1024)
    assert len(split.labels) == len(recs)
    monkeypatch.setattr(reservoir.io.system, "available_memory", lambda: 8 * path.stat().st_size)
    with pytest.raises(ReservoirError) as e:
        read_split(str(path), max_length=1024)
    assert_one_line_error(e, str(path), "expected records read as Python objects (about ten times the file) that fit")


def _bad_json(folder, case):
    path = folder / "remote_homology_train.json"
    recs = records("train")
    if case == "not-json":
        path.write_text("{not json")
        return ()
    if case == "not-list":
        path.write_text(json.dumps({"primary": "A"}))
        return ("list", "dict")
    bad = {
        "not-dict": ["ACD"],
        "no-primary": [{"fold_label": 1}],
        "no-fold": [{"primary": "ACD"}],
        "fold-high": [{"primary": "ACD", "fold_label": 1195}],
        "fold-neg": [{"primary": "ACD", "fold_label": -1}],
        "fold-str": [{"primary": "ACD", "fold_label": "3"}],
        "empty-seq": [{"primary": "", "fold_label": 3}],
        "letter": [{"primary": "ACJD", "fold_label": 3}],
        "lower": [{"primary": "acd", "fold_label": 3}],
    }[case]
    path.write_text(json.dumps(recs + bad))
    return {"letter": ("'J'", "record 5", "position 2"), "lower": ("'a'", "record 5"),
            "fold-high": ("0..1194", "1195")}.get(case, ("record 5",))  # fmt: skip


@pytest.mark.parametrize("case", ["not-json", "not-list", "not-dict", "no-primary", "no-fold", "fold-high",
                                  "fold-neg", "fold-str", "empty-seq", "letter", "lower"])  # fmt: skip
def test_malformed_json(tmp_path, case):
    write_all(tmp_path)
    fragments = _bad_json(tmp_path, case)
    with pytest.raises(ReservoirError) as e:
        get_task("remote-homology", data_dir=tmp_path)
    assert_one_line_error(e, "remote_homology_train.json", *fragments)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize("case", ["no-count", "missing-record", "garbage", "not-dict", "evil", "not-lmdb"])
def test_malformed_lmdb(tmp_path, case, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_all(tmp_path, fmt="lmdb")
    recs = records("valid")
    path = tmp_path / "remote_homology_valid.lmdb"
    for f in os.listdir(path):
        os.unlink(path / f)
    os.rmdir(path)
    fragments = ()
    if case == "no-count":
        write_lmdb(tmp_path, "valid", recs, num_examples=False)
        fragments = ("num_examples",)
    elif case == "missing-record":
        write_lmdb(tmp_path, "valid", recs, extra={b"num_examples": pickle.dumps(3)})
        fragments = ("b'2'",)
    elif case == "garbage":
        write_lmdb(tmp_path, "valid", recs, extra={b"1": b"\x80\x04garbage"})
        fragments = ("b'1'",)
    elif case == "not-dict":
        write_lmdb(tmp_path, "valid", recs, extra={b"1": pickle.dumps(["GG"])})
        fragments = ("record 1", "list")
    elif case == "evil":
        write_lmdb(tmp_path, "valid", recs, extra={b"0": pickle.dumps(Evil())})
        fragments = ("b'0'",)
    else:
        path.write_bytes(b"this is not an lmdb file" * 100)
    with pytest.raises(ReservoirError) as e:
        get_task("remote-homology", data_dir=tmp_path)
    assert_one_line_error(e, str(path), *fragments)
    assert not (tmp_path / "pwned").exists()


def test_bad_params_and_missing_files(tmp_path):
    with pytest.raises(ReservoirError) as e:
        get_task("remote-homology")
    assert_one_line_error(e, "data_dir=None", "remote_homology_")
    with pytest.raises(ReservoirError) as e:
        get_task("remote-homology", data_dir=tmp_path)
    assert_one_line_error(e, "remote_homology_train.{json,lmdb}", str(tmp_path))
    write_all(tmp_path)
    for params, frag in (({"splits": ["train", "bogus"]}, "'bogus'"), ({"splits": ["test_fold_holdout"]}, "'train'"),
                         ({"test_split": "valid"}, "test_split"), ({"format": "csv"}, "format"),
                         ({"max_length": 0}, "max_length"), ({"n_per_split": 0}, "n_per_split")):  # fmt: skip
        with pytest.raises(ReservoirError) as e:
            get_task("remote-homology", data_dir=tmp_path, **params)
        assert_one_line_error(e, frag)
    with pytest.raises(ReservoirError) as e:  # every test sequence dropped
        get_task("remote-homology", data_dir=tmp_path, max_length=2, splits=["train", "test_fold_holdout"])
    assert_one_line_error(e, "remote_homology_test_fold_holdout.json", "max_length=2", "none of 2")
    json.dumps(TASKS["remote-homology"].defaults)


def test_fingerprints_are_pinned(tmp_path, capsys):
    """Fingerprints recorded before the task modules were reorganized: same files and params, same arrays."""
    write_all(tmp_path)
    assert get_task("remote-homology", data_dir=str(tmp_path), max_length=6).fingerprint == (
        "728cae2c2363ee73659a17feab74571bba9bf551b9472c6e74a29c82948f645b")
    sub = get_task("remote-homology", data_dir=str(tmp_path), splits="train,test_family_holdout",
                   test_split="test_family_holdout")  # fmt: skip
    assert sub.fingerprint == "b49c66f93797eee9bd4d0cdf0101855f757b6dc6eefe73e2b5ef60d9d7c34cdd"
    counts = get_task("remote-homology", data_dir=str(tmp_path), max_length=np.int64(6), n_per_split=np.int32(2))
    assert counts.params["max_length"] == 6 and counts.params["n_per_split"] == 2
    json.dumps(counts.params)  # numpy integers are kept as plain ints
