"""`reservoir train` and `reservoir bench speedup` through the CLI."""

import json

import pytest
from click.testing import CliRunner

from reservoir.cli import main

TINY = ["--backbone", "tiny-gpt2", "--device", "cpu", "--quiet"]
XOR = ["--task", "bit-xor", "-p", "n_train=80", "-p", "n_test=40", "-p", "n_bits=2"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_train_writes_results(tmp_path):
    r = run("train", *XOR, *TINY, "--finetune", "fpt", "--steps", 20, "--eval-every", 10, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "trainable params:" in r.stdout and "test accuracy" in r.stdout
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"]["finetune"] == "fpt"
    assert [p["step"] for p in saved["curve"]] == [10, 20]


def test_lr_sweep_over_seeds(tmp_path):
    r = run("train", *XOR, *TINY, "--steps", 10, "--eval-every", 10, "--lr-sweep", "1e-3:1e-2:2", "--seeds", 2,
            "--out", tmp_path / "sweep")
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert len(saved["runs"]) == 4 and saved["best_lr"] in saved["lrs"]
    assert len(saved["metrics"]["test_accuracies"]) == 2
    assert "best lr" in r.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--finetune", "norms"], "unknown finetune group 'norms'"),
        (["--lr-sweep", "1e-2:1e-6:3"], "--lr-sweep expects 0 < LOW < HIGH"),
        (["--lr", "-1"], "--lr must be a finite number > 0, found -1.0"),
        (["--layers", "5"], "depth 5 is beyond"),
    ],
)
def test_train_bad_input(tmp_path, args, expected):
    line = one_error_line(run("train", *XOR, *TINY, "--steps", 5, *args, "--out", tmp_path / "bad"))
    assert expected in line


def test_from_store_bad_split(tmp_path):
    store = tmp_path / "sp.zarr"
    r = run("extract", "--task", "listops", "-p", "n_train=30", "-p", "n_test=10", "-p", "max_length=30",
            "--backbone", "tiny-bert", "--layers", 2, "--full-seq-layer", 1, "--out", store, "--quiet")
    assert r.exit_code == 0, r.output
    line = one_error_line(run("train", "--from-store", store, "--backbone", "tiny-bert", "--layers", 1, "--steps", 2,
                              "--out", tmp_path / "r"))
    assert "training needs depth K > 1, found K=1" in line
    r = run("train", "--from-store", store, "--backbone", "tiny-bert", "--finetune", "layernorm,output", "--steps", 4,
            "--eval-every", 2, "--out", tmp_path / "ok", "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ok" / "results.json").read_text())["config"]["from_store"] == str(store)
    line = one_error_line(run("extract", "--task", "listops", "-p", "n_train=30", "-p", "n_test=10", "-p",
                              "max_length=30", "--backbone", "tiny-bert", "--layers", 2, "--full-seq-layer", 2,
                              "--out", tmp_path / "bad.zarr"))
    assert "--full-seq-layer must be below the depth 2" in line


def test_bench_speedup_cli(tmp_path):
    r = run("bench", "speedup", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=16", "--backbone", "tiny-gpt2",
            "--max-live-rows", 32, "--device", "cpu", "--out", tmp_path / "bench.json")
    assert r.exit_code == 0, r.output
    assert "(a) output layer only" in r.stdout
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["output_only"]["speedup"] > 0


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # the comparison's max_iter is part of it
def test_bench_readout_cli(tmp_path):
    store = tmp_path / "d.zarr"
    r = run("extract", "--task", "listops", "-p", "n_train=120", "-p", "n_test=40", "-p", "max_length=30",
            "--backbone", "tiny-gpt2", "--layers", 1, "--out", store, "--quiet")
    assert r.exit_code == 0, r.output
    r = run("bench", "readout", store, "--layer", 1, "--out", tmp_path / "b.json")
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "b.json").read_text())
    for name in ("reservoir", "sklearn"):
        assert 0.0 <= saved[name]["test_accuracy"] <= 1.0 and saved[name]["fit_s"] > 0
    assert "wall time" in r.stdout
    xor = tmp_path / "x.zarr"
    assert run("extract", *XOR, "--backbone", "tiny-gpt2", "--out", xor, "--quiet").exit_code == 0
    assert "one label per row" in one_error_line(run("bench", "readout", xor, "--layer", 1))
