"""Feature store: round trip on both backends, resume, refusal of other settings."""

import numpy as np
import pytest

import reservoir.extract.plan

from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig, run as run_extract
from reservoir.store import FeatureStore, WritableStore, first_difference, rows_per_chunk

XOR = {"n_train": 96, "n_test": 40, "n_bits": 5}


def _config(out, **kw):
    base = dict(task="bit-xor", backbone="tiny-gpt2", layers=2, out=str(out), task_params=dict(XOR), batch_size=16,
                device="cpu", amp="none")  # float32 compute: compared with float32 references
    base.update(kw)
    return ExtractConfig(**base)


def _four_chunks(path, attrs, feats, labels, lengths):
    """A 10-row store of 3-row chunks written as an extraction would: chunks 0, 2 and the 1-row edge chunk 3 in one
    call, chunk 1 in another."""
    rows = np.r_[0:3, 6:10]
    with WritableStore.create(path, attrs, {"train": (10, ())}, (2, 1, 3), np.eye(2, 3, dtype=np.float32)) as st:
        st.write_chunks("train", [0, 2, 3], feats[rows], labels[rows], lengths=lengths[rows])
        st.write_chunk("train", 1, feats[3:6], labels[3:6], lengths=lengths[3:6])
        st.mark_complete()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_chunk_files_written_directly_are_the_files_zarr_writes(tmp_path, monkeypatch, dtype):
    import reservoir.store.files
    from reservoir.store import backends

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * np.dtype(dtype).itemsize)
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": dtype, "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    feats = np.random.default_rng(0).standard_normal((10, 2, 1, 3)).astype(dtype)
    labels, lengths = np.arange(10) % 4, np.arange(10) + 1
    put, direct = backends._put, []
    monkeypatch.setattr(backends, "_put", lambda path, data: (direct.append(path), put(path, data)))
    _four_chunks(tmp_path / "direct.zarr", attrs, feats, labels, lengths)
    arrays = sorted(str(p.relative_to(tmp_path / "direct.zarr")).split("/c/")[0] for p in direct)
    # every chunk of every row array and flag: four chunks, each written once
    assert arrays == sorted(4 * [f"train/{a}" for a in ("features", "labels", "lengths", "checksums", "done")])
    monkeypatch.setattr(backends.ZarrBackend, "_raw_chunk_rows", lambda self, name: None)
    _four_chunks(tmp_path / "zarr.zarr", attrs, feats, labels, lengths)
    assert len(direct) == 20

    def chunk_files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("c/**/*")) if p.is_file()}

    ours, theirs = chunk_files(tmp_path / "direct.zarr"), chunk_files(tmp_path / "zarr.zarr")
    assert sorted(ours) == sorted(theirs) and len([k for k in ours if k.startswith("train/features")]) == 4
    assert ours == theirs
    with FeatureStore.open(tmp_path / "direct.zarr") as st:
        assert st.verify() == {}
        np.testing.assert_array_equal(st.features("train")[...], feats)
    assert not list(tmp_path.rglob("*.partial"))


def test_a_store_whose_small_arrays_are_compressed_resumes_through_zarr(tmp_path, monkeypatch):
    """Stores written before every array was raw keep zstd on labels, lengths, checksums and flags: resuming one
    writes those through Zarr (a raw write would corrupt them), the features directly."""
    import zarr

    import reservoir.store.files
    from reservoir.store import backends

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 2)
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float16", "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    feats = np.random.default_rng(1).standard_normal((10, 2, 1, 3)).astype(np.float16)
    labels, lengths = np.arange(10) % 4, np.arange(10) + 1
    raw_create = backends.ZarrBackend.create

    def create_as_before(self, name, shape, dtype, chunk_rows):  # Zarr's default codecs for all but floats
        if np.dtype(dtype).kind == "f":
            return raw_create(self, name, shape, dtype, chunk_rows)
        return self.root.create_array(name, shape=shape, chunks=(chunk_rows, *shape[1:]), dtype=dtype, fill_value=0)

    path, rows = tmp_path / "old.zarr", np.r_[0:3, 6:10]
    monkeypatch.setattr(backends.ZarrBackend, "create", create_as_before)
    with WritableStore.create(path, attrs, {"train": (10, ())}, (2, 1, 3), np.eye(2, 3, dtype=np.float32)) as st:
        st.write_chunks("train", [0, 2, 3], feats[rows], labels[rows], lengths=lengths[rows])
    monkeypatch.setattr(backends.ZarrBackend, "create", raw_create)
    put, direct = backends._put, []
    monkeypatch.setattr(backends, "_put", lambda p, data: (direct.append(p.relative_to(path).parts[:2]), put(p, data)))
    with WritableStore.create(path, attrs, {"train": (10, ())}, (2, 1, 3), np.eye(2, 3, dtype=np.float32)) as st:
        assert st.done("train").tolist() == [True, False, True, True]
        st.write_chunk("train", 1, feats[3:6], labels[3:6], lengths=lengths[3:6])
        st.mark_complete()
    assert direct == [("train", "features")]  # the compressed arrays went through Zarr
    for name in ("labels", "lengths", "checksums", "done"):
        assert len(zarr.open_array(path / "train" / name, mode="r").compressors) == 1
    with FeatureStore.open(path) as st:
        assert st.verify() == {}
        np.testing.assert_array_equal(st.features("train")[...], feats)
        np.testing.assert_array_equal(st.labels("train"), labels)
        np.testing.assert_array_equal(st.lengths("train"), lengths)


def test_reopening_a_store_removes_the_temporaries_of_a_killed_write(tmp_path, monkeypatch):
    """A run killed inside a chunk's write leaves its temporary beside the chunk; the run that resumes the store
    removes it (and only it: a chunk file, a look-alike name and a link outside are kept)."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    import reservoir.store.files

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 4)
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float32", "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    path, feats = tmp_path / "s.zarr", np.ones((10, 2, 1, 3), np.float32)

    def reopen():
        return WritableStore.create(path, attrs, {"train": (10, ())}, (2, 1, 3), np.eye(2, 3, dtype=np.float32))

    with reopen() as st:
        st.write_chunk("train", 0, feats[:3], np.zeros(3), np.ones(3))
    # a real kill inside _put: the process dies between writing the temporary and renaming it into place
    script = textwrap.dedent(f"""
        import os, signal, numpy as np
        import reservoir.store.files
        from reservoir.store import WritableStore, backends
        reservoir.store.files.MIN_CHUNK_BYTES = {3 * 2 * 3 * 4}
        backends.os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
        st = WritableStore.create({str(path)!r}, {attrs!r}, {{"train": (10, ())}}, (2, 1, 3),
                                  np.eye(2, 3, dtype=np.float32))
        st.write_chunk("train", 1, np.ones((3, 2, 1, 3), np.float32), np.zeros(3), np.ones(3))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(p.relative_to(path).as_posix() for p in path.rglob("*.partial"))
    assert len(left) == 1 and left[0].startswith("train/features/c/1/0/0/0.")
    look_alike = path / "train/features/c/notes.partial"
    look_alike.write_text("not a chunk temporary")
    outside = tmp_path / "outside.partial"
    outside.write_text("x")
    with reopen() as st:  # resumed: the killed write's temporary is gone
        assert not st.done("train")[1]
        st.write_chunk("train", 1, feats[3:6], np.zeros(3), np.ones(3))
    assert sorted(p.name for p in path.rglob("*.partial")) == ["notes.partial"] and outside.exists()
    assert sorted(os.listdir(path / "train/features/c")) == ["0", "1", "notes.partial"]
    with FeatureStore.open(path, allow_incomplete=True) as st:
        assert st.done("train").tolist() == [True, True, False, False]


def test_writes_other_than_whole_chunks_of_the_row_shape_go_through_zarrs_checks(tmp_path, monkeypatch):
    import reservoir.store.files

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 4)
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float32", "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    with WritableStore.create(tmp_path / "s.zarr", attrs, {"train": (10, ())}, (2, 1, 3),
                              np.eye(2, 3, dtype=np.float32)) as st:
        with pytest.raises(ReservoirError, match=r"expected train/features of shape \(3, 2, 1, 3\) \(the rows of "
                                                 r"chunks \[0\]\), found \(3, 3\)"):
            st.write_chunk("train", 0, np.ones((3, 3), np.float32), np.zeros(3), np.ones(3))  # rows of another shape
        assert not st.done("train").any()
        st._b.write_rows("train/features", 12, np.ones((3, 2, 1, 3), np.float32))  # past the last row: nothing
        st._b.write_rows("train/features", 4, np.full((2, 2, 1, 3), 5, np.float32))  # inside a chunk: Zarr's
        assert sorted(p.name for p in (tmp_path / "s.zarr/train/features/c").iterdir()) == ["1"]
        np.testing.assert_array_equal(st._b.array("train/features")[3:6, 0, 0, 0], [0, 5, 5])


def test_a_chunk_file_linked_from_outside_is_replaced_not_written_through(tmp_path, monkeypatch):
    import os

    import reservoir.store.files

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 4)
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float32", "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    feats = np.ones((10, 2, 1, 3), np.float32)
    with WritableStore.create(tmp_path / "s.zarr", attrs, {"train": (10, ())}, (2, 1, 3),
                              np.eye(2, 3, dtype=np.float32)) as st:
        st.write_chunk("train", 0, feats[:3], np.zeros(3), np.ones(3))
        chunk, outside = tmp_path / "s.zarr/train/features/c/0/0/0/0", tmp_path / "outside"
        os.link(chunk, outside)
        before = outside.read_bytes()
        st.write_chunk("train", 0, 2 * feats[:3], np.zeros(3), np.ones(3))
        assert outside.read_bytes() == before and chunk.read_bytes() != before
        np.testing.assert_array_equal(st.features("train")[:3], 2 * feats[:3])


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_round_trip(tmp_path, suffix):
    from reservoir.backbones import load_backbone
    from reservoir.tasks import get_task

    path = run_extract(_config(tmp_path / f"s{suffix}", dtype="float32"), progress=False)
    task = get_task("bit-xor", **XOR)
    bb = load_backbone("tiny-gpt2", d_in=1)
    with FeatureStore.open(path) as store:
        assert store.format == ("hdf5" if suffix == ".h5" else "zarr")
        assert store.complete
        assert store.splits == ["train", "test"]
        assert store.layers == [0, 1, 2]
        a = store.attrs
        assert a["schema"] == "reservoir.features/2"
        assert a["backbone"]["weights_sha256"] == bb.info.weights_sha256
        assert a["task"]["fingerprint"] == task.fingerprint
        assert a["projection"] == {"kind": "orthogonal", "gain": 1.41, "seed": 0, "d_in": 1, "input": "continuous"}
        np.testing.assert_array_equal(store.projection_weight(), bb.input.weight.detach().t().numpy())
        np.testing.assert_array_equal(store.final_norm()["weight"], bb.final_norm.weight.detach().numpy())
        for name, split in task.splits.items():
            feats = np.asarray(store.features(name)[...])
            assert feats.shape == (len(split), 3, 1, 32)
            np.testing.assert_array_equal(store.labels(name), split.labels)
            assert store.done(name).all()
        # features equal a direct forward of the same backbone
        import torch

        x = torch.from_numpy(task.splits["test"].inputs[:5])
        with torch.no_grad():
            direct = bb.features(x, torch.from_numpy(task.splits["test"].lengths[:5]), [0, 1, 2]).numpy()
        np.testing.assert_allclose(np.asarray(store.features("test")[:5]), direct, atol=1e-5)


def test_float16_is_default_and_close_to_float32(tmp_path):
    p16 = run_extract(_config(tmp_path / "a.zarr"), progress=False)
    p32 = run_extract(_config(tmp_path / "b.zarr", dtype="float32"), progress=False)
    with FeatureStore.open(p16) as s16, FeatureStore.open(p32) as s32:
        f16 = np.asarray(s16.features("train")[...])
        assert f16.dtype == np.float16
        np.testing.assert_allclose(f16.astype(np.float32), s32.features("train")[...], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_resume_after_interruption_equals_uninterrupted(tmp_path, monkeypatch, suffix):
    # n rows big enough for several chunks: tiny-gpt2 rows are 3 * 32 * 4 bytes -> 2731 rows per chunk
    params = {"n_train": 6000, "n_test": 100}
    full = run_extract(_config(tmp_path / f"full{suffix}", dtype="float32", task_params=params, batch_size=512),
                   progress=False)
    calls = {"n": 0}
    original = WritableStore.write_chunks
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 1)  # a window (and a write) per chunk

    def flaky(self, *args, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kw)

    monkeypatch.setattr(WritableStore, "write_chunks", flaky)
    out = tmp_path / f"resumed{suffix}"
    with pytest.raises(KeyboardInterrupt):
        run_extract(_config(out, dtype="float32", task_params=params, batch_size=512), progress=False)
    with FeatureStore.open(out, allow_incomplete=True) as store:
        assert not store.complete
        assert store.done("train").tolist() == [True, False, False]
    monkeypatch.setattr(WritableStore, "write_chunks", original)
    written = []
    monkeypatch.setattr(WritableStore, "write_chunks", lambda self, split, cs, *a, **kw: (
        written.extend((split, c) for c in cs), original(self, split, cs, *a, **kw)))
    run_extract(_config(out, dtype="float32", task_params=params, batch_size=512), progress=False)
    assert written == [("train", 1), ("train", 2), ("test", 0)]  # the done chunk was skipped
    with FeatureStore.open(out) as a, FeatureStore.open(full) as b:
        assert a.complete
        for split in ("train", "test"):
            np.testing.assert_array_equal(a.features(split)[...], b.features(split)[...])
            np.testing.assert_array_equal(a.labels(split), b.labels(split))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"init": "random"}, "backbone.init"),
        ({"seed": 3}, "backbone.seed"),
        ({"layers": 1}, "backbone.depth"),
        ({"dtype": "float32"}, "dtype"),
        ({"projection_gain": 1.0}, "projection.gain"),
        ({"task_params": {**XOR, "seed": 9}}, "task.params.seed"),
    ],
)
def test_other_settings_refused_naming_the_field(tmp_path, change, field):
    out = tmp_path / "s.zarr"
    run_extract(_config(out), progress=False)
    before = np.asarray(FeatureStore.open(out).features("train")[...])
    with pytest.raises(ReservoirError, match=f"written with {field}=") as err:
        run_extract(_config(out, **change), progress=False)
    assert "\n" not in str(err.value)
    with FeatureStore.open(out) as store:
        assert store.complete
        np.testing.assert_array_equal(store.features("train")[...], before)


def test_open_refuses_other_schema_and_non_stores(tmp_path):
    import zarr

    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").attrs["schema"] = "other/9"
    with pytest.raises(ReservoirError, match="expected a store of schema 'reservoir.features/2', found schema 'other/9'"):
        FeatureStore.open(tmp_path / "other.zarr")
    (tmp_path / "f.txt").write_text("hello")
    with pytest.raises(ReservoirError, match="found another file"):
        FeatureStore.open(tmp_path / "f.txt")
    with pytest.raises(ReservoirError, match="found no such file"):
        FeatureStore.open(tmp_path / "missing.zarr")


def test_chunk_checksum_is_crc32c_of_place_then_bytes_for_any_layout():
    """The CRC32C of the place's name, then the array's bytes in C order (what stores of every version hold): the
    standard check value, and the same for a strided view, an empty array and a 0-d one as for their bytes."""
    from reservoir.store.layout import crc

    assert crc(np.frombuffer(b"123456789", np.uint8), "") == 0xE3069283  # CRC-32C's published check value
    whole = np.arange(60, dtype=np.float16).reshape(5, 3, 4)
    strided = whole[:, 1]
    assert not strided.flags.c_contiguous
    assert crc(strided, "train/features/2") == crc(np.frombuffer(strided.tobytes(), np.uint8), "train/features/2")
    assert crc(strided, "train/features/2") != crc(strided, "train/features/3")  # the place is part of it
    assert crc(np.zeros((0, 3), np.float16), "a") == crc(np.frombuffer(b"a", np.uint8), "")
    assert crc(np.array(True), "d") == crc(np.frombuffer(b"d\x01", np.uint8), "")


def test_helpers():
    assert rows_per_chunk(1024, 10_000) == 1024
    assert rows_per_chunk(1024, 10) == 10
    assert rows_per_chunk(10 << 20, 5) == 1
    assert rows_per_chunk(20_000, 20_000) == 313  # 400 MB: 64 chunks of 6.25 MB
    assert rows_per_chunk(1024, 1 << 20) == 8192  # 1 GB: chunks of 8 MB, the largest
    assert first_difference({"backbone": {"id": "a", "init": "x"}}, {"backbone": {"id": "a", "init": "y"}}) == (
        "backbone.init", "x", "y")
    assert first_difference({"layers": [0, 1]}, {"layers": [0, 1]}) is None


def test_slug_keeps_a_hub_ids_organization(tmp_path):
    """Two hub ids of one model name get two store names; a local folder gives its own name."""
    from reservoir.settings import slug

    assert slug("openai-community/gpt2") == "openai-community_gpt2"
    assert slug("someone/gpt2") != slug("openai-community/gpt2")
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert slug(str(folder)) == slug(str(folder) + "/") == "my-model"
    assert slug("layernorm,output") == "layernorm+output"


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_write_chunks_writes_runs_of_chunks_and_checks_each(tmp_path, monkeypatch, suffix):
    """Chunks 0, 2, 3 of a 10-row split (3 rows a chunk, the last of one row) in one call: each chunk's rows,
    checksums and done flag as separate write_chunk calls would leave them."""
    import reservoir.store.files

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 4)
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float32", "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    feats = np.random.default_rng(0).standard_normal((10, 2, 1, 3)).astype(np.float32)
    labels, lengths = np.arange(10) % 4, np.arange(10) + 1
    rows = np.r_[0:3, 6:10]
    with WritableStore.create(tmp_path / f"a{suffix}", attrs, {"train": (10, ())}, (2, 1, 3),
                              np.eye(2, 3, dtype=np.float32)) as st:
        assert st.chunk_rows("train") == 3
        with pytest.raises(ReservoirError, match=r"expected train/features of shape \(7, 2, 1, 3\) \(the rows of "
                                                 r"chunks \[0, 2, 3\]\), found \(6, 2, 1, 3\)"):
            st.write_chunks("train", [0, 2, 3], feats[rows[:-1]], labels[rows[:-1]], lengths=lengths[rows[:-1]])
        with pytest.raises(ReservoirError, match="ascending chunks"):
            st.write_chunks("train", [2, 0, 3], feats[rows], labels[rows], lengths=lengths[rows])
        st.write_chunks("train", [0, 2, 3], feats[rows], labels[rows], lengths=lengths[rows])
        assert st.done("train").tolist() == [True, False, True, True]
        with WritableStore.create(tmp_path / f"b{suffix}", attrs, {"train": (10, ())}, (2, 1, 3),
                                  np.eye(2, 3, dtype=np.float32)) as one:
            for c, (lo, hi) in zip((0, 2, 3), ((0, 3), (6, 9), (9, 10))):
                one.write_chunk("train", c, feats[lo:hi], labels[lo:hi], lengths=lengths[lo:hi])
            for name in ("checksums", "done"):
                np.testing.assert_array_equal(st._b.array(f"train/{name}")[...], one._b.array(f"train/{name}")[...])
        st.write_chunk("train", 1, feats[3:6], labels[3:6], lengths=lengths[3:6])
        st.mark_complete()
    with FeatureStore.open(tmp_path / f"a{suffix}") as st:
        assert st.verify() == {}
        np.testing.assert_array_equal(st.features("train")[...], feats)
        np.testing.assert_array_equal(st.lengths("train"), lengths)


MINIMAL = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
           "dtype": "float32", "pooling": {"kinds": ["last"], "n_out_tokens": 1}, "full_seq_layer": None}


@pytest.fixture
def three_row_chunks(monkeypatch):
    import reservoir.store.files

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 4)


def _small(path, attrs=MINIMAL, **kw):
    """A 10-row store (of 3-row chunks under ``three_row_chunks``), ``MINIMAL`` attributes unless given."""
    return WritableStore.create(path, attrs, {"train": (10, ())}, (2, 1, 3), np.eye(2, 3, dtype=np.float32), **kw)


def test_tuple_params_are_stored_as_lists_and_the_store_reopens(tmp_path, three_row_chunks):
    """Attributes go through JSON (a tuple comes back a list): the key a store is compared with goes the same way."""
    attrs = {**MINIMAL, "task": {**MINIMAL["task"], "params": {"window": (2, 3), 4: "four"}}}
    path = tmp_path / "t.zarr"
    with _small(path, attrs) as st:
        assert st.attrs["task"]["params"] == {"window": [2, 3], "4": "four"}
        st.write_chunk("train", 0, np.ones((3, 2, 1, 3), np.float32), np.zeros(3), np.ones(3))
    with _small(path, attrs) as st:  # reopened to resume, not refused as written with other settings
        assert st.done("train").tolist() == [True, False, False, False]
    with pytest.raises(ReservoirError, match=r"was written with task.params.window=\[2, 3\], this run has \[2, 4\]"):
        _small(path, {**attrs, "task": {**attrs["task"], "params": {"window": (2, 4)}}})
    with pytest.raises(ReservoirError, match="expected store attributes that JSON can write, found"):
        _small(tmp_path / "nan.zarr", {**attrs, "task": {**attrs["task"], "params": {"x": float("nan")}}})
    assert not (tmp_path / "nan.zarr").exists()


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_store_refused_right_after_it_was_built_is_removed(tmp_path, suffix):
    """Attributes that contradict the arrays (a label shape the splits do not have) are found when the new store is
    opened: the store this call built is removed before its lock is released, so nothing reads as interrupted."""
    from reservoir.store.lock import holder, lock_path

    path = tmp_path / f"s{suffix}"
    bad = {**MINIMAL, "task": {**MINIMAL["task"], "label_shape": [2]}}
    with pytest.raises(ReservoirError, match="damaged store: train/labels has shape"):
        _small(path, bad)
    assert not path.exists() and not lock_path(path).exists() and holder(path) is None
    assert not list(tmp_path.iterdir())
    with _small(path) as st:  # the path is free for a store of consistent settings
        assert st.n_rows("train") == 10


@pytest.mark.parametrize("missing, named", [("backbone", "backbone"), ("pooling", "pooling"),
                                            ("backbone.n_dim", "backbone.n_dim"),
                                            ("task.label_shape", "task.label_shape")])
def test_attrs_lacking_what_create_needs_are_refused_before_building(tmp_path, missing, named):
    outer, _, inner = missing.partition(".")
    attrs = dict(MINIMAL)
    if inner:
        attrs[outer] = {k: v for k, v in attrs[outer].items() if k != inner}
    else:
        del attrs[outer]
    with pytest.raises(ReservoirError, match=f"expected attrs with .*, found no {named}$"):
        _small(tmp_path / "s.zarr", attrs)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
@pytest.mark.parametrize("bad, message", [
    ("short", r"expected train/features of shape \(3, 2, 1, 3\) \(the rows of chunks \[0\]\), found \(2, 2, 1, 3\)"),
    ("layers", r"expected train/features of shape \(3, 2, 1, 3\) \(the rows of chunks \[0\]\), found \(3, 3, 1, 3\)"),
    ("labels", r"expected train/labels of shape \(3,\) \(the rows of chunks \[0\]\), found \(3, 1\)"),
    ("lengths", r"expected train/lengths of shape \(3,\) \(the rows of chunks \[0\]\), found \(2,\)"),
    ("no lengths", r"expected train/lengths of shape \(3,\) \(the rows of chunks \[0\]\), found none"),
    ("chunk", r"expected ascending chunks of split 'train' among 0..3, found chunks \[4\]"),
])
def test_rows_of_another_count_or_shape_are_refused_before_anything_is_written(tmp_path, three_row_chunks, suffix, bad,
                                                                               message):
    feats, labels, lengths, chunk = np.ones((3, 2, 1, 3), np.float32), np.zeros(3), np.ones(3), 0
    if bad == "short":
        feats = feats[:2]
    elif bad == "layers":
        feats = np.ones((3, 3, 1, 3), np.float32)
    elif bad == "labels":
        labels = np.zeros((3, 1))
    elif bad == "lengths":
        lengths = lengths[:2]
    elif bad == "no lengths":
        lengths = None
    else:
        chunk = 4
    with _small(tmp_path / f"s{suffix}") as st:
        with pytest.raises(ReservoirError, match=message):
            st.write_chunk("train", chunk, feats, labels, lengths)
        assert not st.done("train").any()
        for name in ("features", "labels", "lengths"):
            assert not np.asarray(st.backend_array(f"train/{name}")[...]).any(), name  # nothing written


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_rows_in_any_order_and_step_are_read_checked_as_numpy_reads_them(tmp_path, three_row_chunks, suffix):
    """Indexing the backend does not take itself (HDF5: indices out of order; Zarr: negative steps) reads the
    checked chunks; an index numpy refuses is an IndexError or TypeError, never a damaged store."""
    feats = np.random.default_rng(0).standard_normal((10, 2, 1, 3)).astype(np.float32)
    path = tmp_path / f"s{suffix}"
    with _small(path) as st:
        for c, (lo, hi) in enumerate(((0, 3), (3, 6), (6, 9), (9, 10))):
            st.write_chunk("train", c, feats[lo:hi], np.arange(lo, hi), np.ones(hi - lo))
        st.mark_complete()
    with FeatureStore.open(path) as st:
        arr, labels = st.features("train"), st.labels("train", lazy=True)
        keys = [[3, 1], np.s_[::-1], np.s_[8::-3, 1], ([3, 1, 3], [0, 1, 1]), np.array([[0, 9], [2, 2]]),
                feats[:, 0, 0, 0] > 0, np.s_[[-1, 0], :, 0, [1, 2]], [], np.s_[5:2], -1, np.int64(4), ()]
        for key in keys:
            got = arr[key]
            np.testing.assert_array_equal(got, feats[key])
            assert got.shape == feats[key].shape, key
        np.testing.assert_array_equal(labels[[9, 0, 5]], [9, 0, 5])
        for key, error in [(10, IndexError), ([0, -11], IndexError), (np.ones(3, bool), IndexError),
                           (1.5, TypeError), ([0.5], TypeError), (np.s_[None, 0], TypeError)]:
            with pytest.raises(error) as caught:
                arr[key]
            assert "damaged" not in str(caught.value)


def test_an_unfinished_store_resumes_only_with_the_batching_it_was_begun_with(tmp_path):
    """How rows are batched shapes their features (each batch's padding): one store, one batching. A complete store
    is read whatever batching made it; an unfinished one is refused another, naming the options that resume it."""
    import zarr

    out = tmp_path / "s.zarr"
    run_extract(_config(out, batch_size=16), progress=False)
    with FeatureStore.open(out) as st:
        assert st.attrs["batching"] == {"batch_size": 16, "max_tokens": None}
    run_extract(_config(out, batch_size=5), progress=False)  # complete: nothing to compute, nothing mixed
    root = zarr.open_group(str(out), mode="r+")
    root.attrs["complete"] = False  # as an interrupted run leaves it
    root["test/done"][0] = False
    with pytest.raises(ReservoirError, match=r"expected the batching this store was begun with \(--batch-size 16\); "
                                             r"found --batch-size 5: .* rerun with --batch-size 16 to resume"):
        run_extract(_config(out, batch_size=5), progress=False)
    with pytest.raises(ReservoirError, match=r"begun with \(--batch-size 16\); found --max-tokens 4096"):
        run_extract(_config(out, batch_size=None, max_tokens=4096), progress=False)
    run_extract(_config(out, batch_size=16), progress=False)
    with FeatureStore.open(out) as st:
        assert st.complete and st.done("test").all()


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_closed_store_says_so_in_both_formats(tmp_path, suffix):
    """HDF5 raised h5py's KeyError on a closed file and Zarr read on: both say the store is closed; closing again
    does nothing."""
    from reservoir.readouts import load_layer

    run_extract(_config(tmp_path / f"s{suffix}"))
    with FeatureStore.open(tmp_path / f"s{suffix}") as st:
        assert not st.closed
    assert st.closed
    st.close()
    for read in (lambda: st.features("train"), lambda: load_layer(st, "train", 1), lambda: st.labels("train")):
        with pytest.raises(ReservoirError, match="expected an open store; found it closed"):
            read()
