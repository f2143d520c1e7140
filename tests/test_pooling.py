"""Pooling in the store: several poolings from one pass, read by every readout; stores written before keep working."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig, run as run_extract
from reservoir.readouts import fit_linear, load_layer
from reservoir.store import FeatureStore

XOR = {"n_train": 300, "n_test": 100}


def _extract(tmp_path, name, **kw):
    return run_extract(ExtractConfig(task="bit-xor", backbone="tiny-bert", layers=2, out=str(tmp_path / name),
                                     task_params=XOR, dtype="float32", **kw), progress=False)


def test_several_poolings_in_one_pass(tmp_path):
    both = _extract(tmp_path, "both.zarr", pooling=["last", "mean", "first"])
    last = _extract(tmp_path, "last.zarr")
    with FeatureStore.open(both) as st, FeatureStore.open(last) as ref:
        assert st.poolings == ["last", "mean", "first"] and ref.poolings == ["last"]
        assert st.attrs["pooling"] == {"kinds": ["last", "mean", "first"], "n_out_tokens": 1}
        for split in ("train", "test"):
            np.testing.assert_array_equal(st.features(split, "last")[...], ref.features(split)[...])
            mean = st.features(split, "mean")[...]
            assert mean.shape == (len(st.labels(split)), 3, 1, 32) and not np.allclose(mean, ref.features(split)[...])
        assert st.verify() == {}
        with pytest.raises(ReservoirError, match=r"expected a pooling among \['last'\], found 'mean'"):
            ref.features("train", "mean")
    mean_fit = fit_linear(both, [2], pooling="mean", results_dir=tmp_path / "res")[0]
    assert mean_fit.config["pooling"] == "mean"
    assert (tmp_path / "res" / "both" / "logistic-mean-layer2.json").is_file()
    last_fit = fit_linear(both, [2], results_dir=tmp_path / "res")[0]
    assert last_fit.config["pooling"] == "last" and (tmp_path / "res" / "both" / "logistic-layer2.json").is_file()
    assert last_fit.metrics["test_accuracy"] == fit_linear(last, [2])[0].metrics["test_accuracy"]


def test_cli_pooling_option_and_refusals(tmp_path):
    runner = CliRunner()
    base = ["extract", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--backbone", "tiny-bert",
            "--layers", "1", "--quiet"]
    r = runner.invoke(main, [*base, "--pooling", "mean,last", "--out", str(tmp_path / "s.zarr")])
    assert r.exit_code == 0, r.output
    assert "pooling mean,last" in r.output
    info = runner.invoke(main, ["info", str(tmp_path / "s.zarr")])
    assert "pooling mean,last x1" in info.output
    fit = runner.invoke(main, ["fit-linear", str(tmp_path / "s.zarr"), "--pooling", "first",
                               "--results", str(tmp_path / "r")])
    assert fit.exit_code == 2 and "expected a pooling among ['mean', 'last'], found 'first'" in fit.stderr
    bad = runner.invoke(main, [*base, "--pooling", "max", "--out", str(tmp_path / "b.zarr")])
    assert bad.exit_code == 2
    assert "--pooling must be one or more of last, first, mean (each once, e.g. last,mean); found max" in bad.stderr
    memory = runner.invoke(main, ["extract", "--task", "bit-memory", "-p", "n_bits=20", "-p", "bits_per_token=10",
                                  "-p", "n_train=8", "-p", "n_test=4", "--backbone", "tiny-bert", "--quiet",
                                  "--pooling", "mean", "--out", str(tmp_path / "m.zarr")])
    assert memory.exit_code == 2 and "expected --pooling last, found mean" in memory.stderr
    assert not (tmp_path / "b.zarr").exists() and not (tmp_path / "m.zarr").exists()


def test_stores_written_before_poolings_are_read_and_resumed(tmp_path):
    """A store whose attributes say pooling {kind: last_real_token} (before poolings existed) opens as ``last``,
    is read by every readout, and is resumed by today's extract with the same settings."""
    import zarr

    from reservoir.store import checks

    path = _extract(tmp_path, "old.zarr")
    with FeatureStore.open(path) as st:
        attrs = {k: v for k, v in st.attrs.items() if k not in ("attrs_crc32c",)}
        feats = {s: st.features(s)[...] for s in st.splits}
        labels = {s: st.labels(s) for s in st.splits}
    attrs["pooling"] = {"kind": "last_real_token", "n_out_tokens": 1}  # as older versions wrote it
    attrs["complete"] = False
    z = zarr.open_group(str(path), mode="r+")
    z.attrs.update({"pooling": attrs["pooling"], "complete": False})
    z.attrs["attrs_crc32c"] = checks.attrs_crc(dict(z.attrs))  # a consistent store, as the old version left it
    z["train/done"][0] = False  # an interrupted run: one chunk left to write
    assert json.loads((tmp_path / "old.zarr" / "zarr.json").read_text())["attributes"]["pooling"] == attrs["pooling"]
    with FeatureStore.open(path, allow_incomplete=True) as st:
        assert st.poolings == ["last"] and not st.complete
    again = _extract(tmp_path, "old.zarr")  # the same settings, today: resumed, not refused
    with FeatureStore.open(again) as st:
        assert st.complete and st.poolings == ["last"]
        for s in st.splits:
            np.testing.assert_array_equal(st.features(s)[...], feats[s])
        X, y = load_layer(st, "test", 2)
        assert X.shape == (100, 32) and np.array_equal(y, labels["test"])
    assert fit_linear(again, [2])[0].config["pooling"] == "last"


def test_the_mean_is_summed_in_float32_under_the_cpus_bf16_autocast():
    """On the CPU the residual stream stays float32 under bf16 autocast; the mean over real tokens must too (a bmm
    ran in bf16 there: errors of about 5e-3 where the last token's were 0)."""
    import torch

    from reservoir.backbones import load_backbone

    torch.manual_seed(0)
    bb = load_backbone("tiny-bert", depth=1, d_in=3).eval()
    x, lengths = torch.randn(4, 40, 3), torch.tensor([40, 31, 7, 1])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        feats, states = bb.features(x, lengths, [0], poolings=("last", "mean"), full_seq_layer=0)
    assert feats.dtype == states.dtype == torch.float32
    mean = torch.stack([states[i, :n].mean(0) for i, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(feats[:, 1, 0, 0], mean, rtol=0, atol=1e-5)
    torch.testing.assert_close(feats[:, 0, 0, 0], states[torch.arange(4), lengths - 1], rtol=0, atol=0)


def test_extract_rows_refuses_layers_it_would_return_in_other_slots():
    import torch

    from reservoir.backbones import load_backbone
    from reservoir.extract import extract_rows

    bb = load_backbone("tiny-gpt2", depth=2, d_in=1)
    x, lengths = np.zeros((4, 5, 1), np.float32), np.array([5, 4, 3, 2])
    with pytest.raises(ReservoirError, match=r"expected layers in increasing order, each once .* found \[2, 0\]"):
        extract_rows(bb, x, lengths, [2, 0], 1)
    with torch.inference_mode():
        both = extract_rows(bb, x, lengths, [0, 2], 1)
        top = extract_rows(bb, x, lengths, [2], 1)
    np.testing.assert_array_equal(both[:, 1], top[:, 0])
