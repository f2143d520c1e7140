"""Feature store: round trip on both backends, resume, refusal of other settings."""

import numpy as np
import pytest

from reservoir.errors import ReservoirError
from reservoir.extraction import ExtractConfig, run as run_extract
from reservoir.store import FeatureStore, first_difference, rows_per_chunk

XOR = {"n_train": 96, "n_test": 40, "n_bits": 5}


def _config(out, **kw):
    base = dict(task="bit-xor", backbone="tiny-gpt2", layers=2, out=str(out), task_params=dict(XOR), batch_size=16,
                device="cpu")
    base.update(kw)
    return ExtractConfig(**base)


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
    original = FeatureStore.write_chunk

    def flaky(self, *args, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kw)

    monkeypatch.setattr(FeatureStore, "write_chunk", flaky)
    out = tmp_path / f"resumed{suffix}"
    with pytest.raises(KeyboardInterrupt):
        run_extract(_config(out, dtype="float32", task_params=params, batch_size=512), progress=False)
    with FeatureStore.open(out, allow_incomplete=True) as store:
        assert not store.complete
        assert store.done("train").tolist() == [True, False, False]
    monkeypatch.setattr(FeatureStore, "write_chunk", original)
    written = []
    monkeypatch.setattr(FeatureStore, "write_chunk",
                        lambda self, split, c, *a, **kw: (written.append((split, c)), original(self, split, c, *a, **kw)))
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


def test_helpers():
    assert rows_per_chunk(1024, 10_000) == 1024
    assert rows_per_chunk(1024, 10) == 10
    assert rows_per_chunk(10 << 20, 5) == 1
    assert first_difference({"backbone": {"id": "a", "init": "x"}}, {"backbone": {"id": "a", "init": "y"}}) == (
        "backbone.init", "x", "y")
    assert first_difference({"layers": [0, 1]}, {"layers": [0, 1]}) is None
