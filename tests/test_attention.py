"""Attention maps of trained runs: captured weights, their consistency with the trained model, the plot and CLI."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.training import TrainConfig, load_run, run
from reservoir.training.attention import attention, capture_attention, plot_attention

XOR = {"n_train": 80, "n_test": 40, "n_bits": 3}


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-bert"])
def run_dir(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "run"
    run(TrainConfig(task="bit-xor", task_params=XOR, backbone=request.param, steps=10, eval_every=5,
                    device="cpu", out=str(out)), progress=False)
    return out


def test_weights_are_attention_distributions(run_dir):
    maps = attention(run_dir, layer=1, example=3)
    task, _, config = load_run(run_dir)
    L = 2 * XOR["n_bits"]
    n_heads = load_run(run_dir)[1].backbone.config.num_attention_heads
    assert maps["weights"].shape == (n_heads, L, L) and maps["readout_mean"].shape == (n_heads, L)
    np.testing.assert_allclose(maps["weights"].sum(-1), 1.0, atol=1e-5)  # each query's row is a distribution
    np.testing.assert_allclose(maps["readout_mean"].sum(-1), 1.0, atol=1e-5)
    if config.backbone == "tiny-gpt2":  # causal: no query sees a later key
        assert np.abs(np.triu(maps["weights"], k=1)).max() == 0.0
    else:
        assert np.triu(maps["weights"], k=1).max() > 0
    assert maps["n_averaged"] == len(task.splits["test"])  # bit XOR: every example has the same length
    assert [int(v) for v in maps["label"]] == task.splits["test"].labels[3].tolist()
    assert len(maps["ticks"]) == L and maps["ticks"][0].startswith("1 (")


def test_eager_reload_is_the_trained_model(run_dir):
    """The eager model that the maps come from predicts exactly what the trained (SDPA) model predicts."""
    task, sdpa, _ = load_run(run_dir)
    _, eager, _ = load_run(run_dir, attn_implementation="eager")
    te = task.splits["test"]
    x, lengths = torch.as_tensor(te.inputs).float(), torch.as_tensor(te.lengths)
    with torch.inference_mode():
        torch.testing.assert_close(sdpa(x, lengths), eager(x, lengths), atol=1e-5, rtol=1e-5)
    saved = json.loads((run_dir / "results.json").read_text())["metrics"]["test_accuracy"]
    with torch.inference_mode():
        pred = eager(x, lengths).argmax(-1).reshape(len(te), -1).numpy()
    assert np.mean(pred == te.labels.reshape(len(te), -1)) == pytest.approx(saved)


def test_sdpa_model_gives_no_weights(run_dir):
    task, model, _ = load_run(run_dir)  # SDPA returns no attention weights
    te = task.splits["test"]
    with pytest.raises(ReservoirError, match="attn_implementation='eager'"):
        capture_attention(model, torch.as_tensor(te.inputs[:2]).float(), torch.as_tensor(te.lengths[:2]), 1)


def test_plot_writes_png(run_dir, tmp_path):
    path = plot_attention(attention(run_dir), tmp_path / "a" / "att.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_bad_layer_and_example(run_dir):
    with pytest.raises(ReservoirError, match=r"--layer must be within 1\.\.2"):
        attention(run_dir, layer=3)
    with pytest.raises(ReservoirError, match=r"--example must be within 0\.\.39 \(test split\)"):
        attention(run_dir, example=40)


def test_unfinished_run_folder_is_refused(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "last.pt").write_bytes(b"")
    with pytest.raises(ReservoirError, match="expected a finished `reservoir train` folder .* found last.pt"):
        attention(tmp_path / "half")


def test_lstm_has_no_attention(tmp_path):
    out = tmp_path / "lstm"
    run(TrainConfig(task="bit-xor", task_params=XOR, backbone="lstm-1x16", init="random", steps=2, eval_every=2,
                    device="cpu", out=str(out)), progress=False)
    with pytest.raises(ReservoirError, match="has no attention"):
        attention(out)


def test_cli_trains_then_reuses_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["plot", "attention", "--task", "bit-xor", "-p", "n_train=80", "-p", "n_test=40", "-p", "n_bits=2",
            "--backbone", "tiny-bert", "--steps", "5", "--device", "cpu"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "trained: test accuracy" in r.output and "head  1: position" in r.output
    (png,) = (tmp_path / "results" / "train").glob("*/attention-layer1-example0.png")
    r = CliRunner().invoke(main, [*args, "--example", "1"])
    assert r.exit_code == 0 and "using the finished run" in r.output
    assert (png.parent / "attention-layer1-example1.png").is_file()
    r = CliRunner().invoke(main, [*args[:-4], "--steps", "6", "--device", "cpu"])  # same folder, other settings
    assert r.exit_code == 2 and "holds a run with steps=5, these options give 6" in r.output


def test_cli_needs_task_or_run():
    r = CliRunner().invoke(main, ["plot", "attention"])
    assert r.exit_code == 2 and "Missing option '--task' (or pass --run)" in r.output


def test_out_path_is_the_file_written(run_dir, tmp_path):
    """Without a suffix the figure is a .png, and the path printed is the file's; a suffix matplotlib cannot write is
    refused before anything is drawn."""
    r = CliRunner().invoke(main, ["plot", "attention", "--run", str(run_dir), "--out", str(tmp_path / "att")])
    assert r.exit_code == 0, r.output
    assert f"wrote {tmp_path / 'att.png'}" in r.output and not (tmp_path / "att").exists()
    assert (tmp_path / "att.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = CliRunner().invoke(main, ["plot", "attention", "--run", str(run_dir), "--out", str(tmp_path / "att.svg")])
    assert r.exit_code == 0 and (tmp_path / "att.svg").read_text().lstrip().startswith("<?xml")
    r = CliRunner().invoke(main, ["plot", "attention", "--run", str(run_dir), "--out", str(tmp_path / "sub" / "a.xyz")])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output
    assert lines[0].startswith(f"Error: --out {tmp_path / 'sub' / 'a.xyz'}: expected a figure file ending in .eps, ")
    assert lines[0].endswith("found '.xyz'") and not (tmp_path / "sub").exists()
    with pytest.raises(ReservoirError, match="expected a figure file ending in"):
        plot_attention(attention(run_dir), tmp_path / "a.xyz")
