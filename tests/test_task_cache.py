"""Tasks built once: the on-disk task cache and the block-parallel ListOps generator."""

import logging
import random

import numpy as np
import pytest

from reservoir.tasks import get_task, load_task
from reservoir.tasks.base import resolve_params
from reservoir.tasks.cache import cache_key
from reservoir.tasks.listops import (
    FPT_VOCAB,
    LRA_VOCAB,
    draw_ids,
    evaluate,
    generate_split,
    generate_tree,
    tree_tokens,
)

PARAMS = {"n_train": 120, "n_test": 30, "min_length": 5, "max_length": 60, "seed": 3}


def _same(a, b):
    assert a.fingerprint == b.fingerprint and a.params == b.params
    assert (a.kind, a.d_in, a.n_classes, a.n_out_tokens, a.vocab) == (b.kind, b.d_in, b.n_classes, b.n_out_tokens,
                                                                      b.vocab)
    assert list(a.splits) == list(b.splits)
    for name in a.splits:
        for field in ("inputs", "lengths", "labels"):
            x, y = getattr(a.splits[name], field), getattr(b.splits[name], field)
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def test_second_load_comes_from_the_cache_with_identical_arrays(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reservoir")
    built = load_task("listops", PARAMS, cache_dir=tmp_path)
    assert "built and saved to the task cache" in caplog.text
    caplog.clear()
    cached = load_task("listops", PARAMS, cache_dir=tmp_path)
    assert "loaded from the task cache" in caplog.text
    _same(cached, built)
    _same(cached, get_task("listops", **PARAMS))
    assert len(list(tmp_path.iterdir())) == 1  # one entry, no temporary folder left behind
    # cached inputs are memory-mapped copy-on-write: writable, and writes never reach the file
    cached.splits["train"].inputs[0, 0] = 99
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), built)


def test_a_tampered_entry_is_refused_and_rebuilt(tmp_path, caplog):
    load_task("listops", PARAMS, cache_dir=tmp_path)
    entry = next(tmp_path.iterdir())
    labels = np.load(entry / "train.labels.npy")
    labels[0] = (labels[0] + 1) % 10
    np.save(entry / "train.labels.npy", labels)
    caplog.set_level(logging.INFO, logger="reservoir")
    task = load_task("listops", PARAMS, cache_dir=tmp_path)
    assert "does not match its fingerprint; refused and rebuilt" in caplog.text
    _same(task, get_task("listops", **PARAMS))
    (entry / "test.inputs.npy").write_bytes(b"not an array")  # unreadable: refused too
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), task)
    lengths = np.load(entry / "train.lengths.npy")
    np.save(entry / "train.lengths.npy", lengths[:-1])  # one length short of the rows: Split refuses it
    caplog.clear()
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), task)
    assert "refused and rebuilt" in caplog.text


def test_an_entry_is_served_only_under_its_own_key_and_only_if_readable(tmp_path, caplog):
    """An entry copied over another's (or moved) is refused, as are a garbled .npy header and a FIFO in its place:
    each rebuilt, never served or hung on."""
    import os
    import shutil

    caplog.set_level(logging.INFO, logger="reservoir")
    other = {**PARAMS, "seed": 4}
    load_task("listops", PARAMS, cache_dir=tmp_path)
    load_task("listops", other, cache_dir=tmp_path)
    mine, theirs = (tmp_path / f"listops-{cache_key('listops', resolve_params('listops', p))}" for p in (PARAMS, other))
    shutil.rmtree(mine)
    shutil.copytree(theirs, mine)  # seed 4's arrays where seed 3's belong
    caplog.clear()
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), get_task("listops", **PARAMS))
    assert "refused and rebuilt" in caplog.text
    import json

    from reservoir.tasks.cache import _digest

    meta = json.loads((mine / "task.json").read_text())
    del meta["key"]
    meta["digest"] = _digest(meta)
    (mine / "task.json").write_text(json.dumps(meta))  # as an earlier version wrote it: rebuilt, not "refused"
    caplog.clear()
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), get_task("listops", **PARAMS))
    assert "was written by an earlier version; rebuilt" in caplog.text and "refused" not in caplog.text
    header = mine / "train.labels.npy"
    header.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': (    \n")  # a header dict that never closes
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), get_task("listops", **PARAMS))
    (mine / "test.lengths.npy").unlink()
    os.mkfifo(mine / "test.lengths.npy")  # reading it would block for ever
    _same(load_task("listops", PARAMS, cache_dir=tmp_path), get_task("listops", **PARAMS))


def test_a_data_file_edited_in_place_or_named_from_home_is_read_again(tmp_path, monkeypatch):
    """The key stamps every data file with its inode and change time (a same-size edit whose modification time was
    put back still changes it), for a data_dir and for a path under ~ alike."""
    import os

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "f.tsv").write_bytes(b"1234")
    before = cache_key("listops", {"data_dir": str(folder)})
    st = os.stat(folder / "f.tsv")
    (folder / "f.tsv").write_bytes(b"5678")
    os.utime(folder / "f.tsv", ns=(st.st_atime_ns, st.st_mtime_ns))  # what cp -p or rsync -t leave
    assert cache_key("listops", {"data_dir": str(folder)}) != before
    monkeypatch.setenv("HOME", str(tmp_path))
    home = cache_key("data", {"path": "~/data/f.tsv"})
    (folder / "f.tsv").write_bytes(b"90")
    assert cache_key("data", {"path": "~/data/f.tsv"}) != home


def test_the_key_follows_params_and_data_files(tmp_path):
    from reservoir.tasks.base import resolve_params

    a = cache_key("listops", resolve_params("listops", PARAMS))
    assert a == cache_key("listops", resolve_params("listops", dict(PARAMS)))
    assert a != cache_key("listops", resolve_params("listops", {**PARAMS, "seed": 4}))
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.bin").write_bytes(b"1234")
    k1 = cache_key("mnist", {"data_dir": str(data)})
    (data / "f.bin").write_bytes(b"123456")
    assert cache_key("mnist", {"data_dir": str(data)}) != k1


def test_the_key_follows_the_default_data_folder(tmp_path, monkeypatch):
    """data_dir=None reads ~/.cache/reservoir/<task>: an edited file there is a new key, never a stale entry."""
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / ".cache" / "reservoir" / "mnist"
    folder.mkdir(parents=True)
    (folder / "train-labels-idx1-ubyte").write_bytes(b"1234")
    k1 = cache_key("mnist", {"data_dir": None})
    (folder / "train-labels-idx1-ubyte").write_bytes(b"123456")
    assert cache_key("mnist", {"data_dir": None}) != k1


def test_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("RESERVOIR_TASK_CACHE", "off")
    monkeypatch.chdir(tmp_path)
    _same(load_task("bit-xor", {"n_train": 16, "n_test": 8}), get_task("bit-xor", n_train=16, n_test=8))
    assert not (tmp_path / "cache").exists()


def test_draw_ids_makes_the_draws_of_generate_tree():
    for seed in range(3):
        r1, r2 = random.Random(seed), random.Random(seed)
        for _ in range(500):
            tree, _ = generate_tree(r1, max_length=200)
            ids, value = draw_ids(r2, 200)
            assert (tree is None) == (ids is None)
            if tree is not None:
                assert ids == [LRA_VOCAB.index(t) for t in tree_tokens(tree)] and value == evaluate(tree)


def test_generated_rows_do_not_depend_on_workers():
    one = generate_split("train", 2500, 0, 20, 300, workers=1)
    two = generate_split("train", 2500, 0, 20, 300, workers=2)
    for field in ("inputs", "lengths", "labels"):
        np.testing.assert_array_equal(getattr(one, field), getattr(two, field))
    # blocks are seeded by (seed, split, block): the first rows do not depend on n
    short = generate_split("train", 1000, 0, 20, 300, workers=1)
    np.testing.assert_array_equal(short.labels, one.labels[:1000])


@pytest.mark.parametrize("tokenization", ["lra", "fpt"])
def test_generated_split_rows_evaluate_to_their_labels(tokenization):
    """Every lra row evaluates (by a stack, independently of the generator) to its label; fpt rows are the same
    draws with the brackets dropped."""
    lra = generate_split("test", 300, 1, 4, 120, tokenization="lra", max_tokens=None, workers=1)
    split = generate_split("test", 300, 1, 4, 120, tokenization=tokenization, max_tokens=None, workers=1)
    np.testing.assert_array_equal(split.labels, lra.labels)
    for i in range(len(lra)):
        toks = [LRA_VOCAB[t] for t in lra.inputs[i, : lra.lengths[i]]]
        if tokenization == "fpt":
            words = [t.lstrip("[") for t in toks if t != "]"]
            assert [FPT_VOCAB[t] for t in split.inputs[i, : split.lengths[i]]] == words
        stack = [[]]
        for t in toks:
            if t.startswith("["):
                stack.append([t])
            elif t == "]":
                op, *args = stack.pop()
                v = {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)),
                     "[SM": lambda a: sum(a) % 10}[op](args)
                stack[-1].append(v)
            else:
                stack[-1].append(int(t))
        assert stack[0][0] == lra.labels[i]


def test_the_key_follows_files_in_a_linked_folder_and_a_link_loop_ends(tmp_path):
    """A data folder whose subfolder is a link (cifar-10-batches-py -> elsewhere): the files there are read by the
    task, so an edit there is a new key; a link back up is walked once."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "data_batch_1").write_bytes(b"1234")
    data = tmp_path / "data"
    data.mkdir()
    (data / "cifar-10-batches-py").symlink_to(real)
    (real / "up").symlink_to(data)  # a loop through the link
    before = cache_key("cifar10", {"data_dir": str(data)})
    (real / "data_batch_1").write_bytes(b"567890")
    assert cache_key("cifar10", {"data_dir": str(data)}) != before


def _tamper(entry, **fields):
    """Edit an entry's metadata and recompute its digest, as anyone can (it is a hash, not a secret)."""
    import json

    from reservoir.tasks.cache import _digest

    meta = json.loads((entry / "task.json").read_text())
    meta.update(fields)
    meta["digest"] = _digest(meta)
    (entry / "task.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("fields", [{"n_classes": 1}, {"d_in": 3}, {"kind": "vectors"}, {"n_out_tokens": 7}],
                         ids=["n_classes", "d_in", "kind", "n_out_tokens"])
def test_metadata_edited_with_its_digest_against_the_arrays_is_rebuilt(tmp_path, fields, caplog):
    """An entry's metadata is checked against its arrays as a build checks them: an edited n_classes (labels above
    it), d_in (token ids above it), kind or n_out_tokens is a damaged entry, rebuilt, never served."""
    built = load_task("listops", PARAMS, cache_dir=tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    _tamper(entry, **fields)
    with caplog.at_level(logging.INFO, logger="reservoir"):
        again = load_task("listops", PARAMS, cache_dir=tmp_path)
    assert "loaded from the task cache" not in caplog.text
    _same(again, built)


@pytest.mark.parametrize("how", ["name", "link"])
def test_an_entry_never_reads_outside_itself(tmp_path, how, caplog):
    """A split name with '..' in it, or an array file linked from elsewhere, is refused before anything is read
    there: the entry is rebuilt."""
    import shutil

    built = load_task("listops", PARAMS, cache_dir=tmp_path / "cache")
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    outside = tmp_path / "outside"
    outside.mkdir()
    for a in ("inputs", "lengths", "labels"):
        shutil.copy(entry / f"test.{a}.npy", outside / f"x.{a}.npy")
    if how == "name":
        rel = "../../outside/x"
        import json

        from reservoir.tasks.base import fingerprint

        meta = json.loads((entry / "task.json").read_text())
        splits = {**built.splits, rel: built.splits["test"]}  # the fingerprint of what it would then read
        _tamper(entry, splits=list(splits), fingerprint=fingerprint(meta["name"], meta["params"], splits))
    else:
        for a in ("inputs", "lengths", "labels"):
            (entry / f"test.{a}.npy").unlink()
            (entry / f"test.{a}.npy").symlink_to(outside / f"x.{a}.npy")
    with caplog.at_level(logging.INFO, logger="reservoir"):
        again = load_task("listops", PARAMS, cache_dir=tmp_path / "cache")
    assert "loaded from the task cache" not in caplog.text
    _same(again, built)
