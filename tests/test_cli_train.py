"""`reservoir train` and `reservoir bench speedup` through the CLI."""

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from reservoir.cli import main
from reservoir.training import SweepResult, TrainResult

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
    saved = TrainResult.read(tmp_path / "run" / "results.json")
    assert saved.config["finetune"] == "fpt"
    assert [p["step"] for p in saved.curve] == [10, 20]
    assert f"test accuracy {saved.metrics['test_accuracy']:.2%}" in r.stdout
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["best.pt", "last.pt", "results.json"]
    m = saved.metrics
    settled = (f"within 1 point of best from step {m['steps_to_converge']})" if m["steps_to_converge"] is not None
               else f"the last validation {m['final_val_accuracy']:.2%} is more than 1 point below it)")
    assert settled in r.stdout and ("None" not in r.stdout)


def test_train_says_when_a_run_ended_off_its_best(tmp_path, monkeypatch):
    import reservoir.training.loop as loop

    accuracies = iter([0.9, 0.5])
    monkeypatch.setattr(loop, "evaluate", lambda *a, **kw: next(accuracies))
    r = run("train", *XOR, *TINY, "--steps", 20, "--eval-every", 10, "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "at step 10; the last validation 50.00% is more than 1 point below it)" in r.stdout
    assert TrainResult.read(tmp_path / "run" / "results.json").metrics["steps_to_converge"] is None


def test_a_run_folder_is_resumed_only_on_its_own_data_and_course(tmp_path):
    """A finished or interrupted run is taken up again only with the data and the course (amp, eval_every) it was
    trained with: a data file rewritten at the same path, or another amp, is refused, never tested with old weights."""
    data = tmp_path / "d.npz"

    def write(bit):
        x = np.random.default_rng(bit).integers(0, 2, (120, 6))
        np.savez(data, train_inputs=x[:80], train_labels=x[:80, bit], test_inputs=x[80:], test_labels=x[80:, bit])

    write(0)
    args = ["train", "--data", data, *TINY, "--steps", 10, "--eval-every", 5, "--out", tmp_path / "run"]
    assert run(*args, "--amp", "bf16").exit_code == 0
    assert run(*args, "--amp", "bf16").exit_code == 0  # the finished run, tested again
    line = one_error_line(run(*args, "--amp", "none"))
    assert line == (f"Error: {tmp_path / 'run'} holds a run with amp='bfloat16', this run has 'float32'; pass "
                    "another --out")  # the dtype each --amp computes in here
    assert "holds a run with eval_every=5, this run has 2" in one_error_line(run(*args, "--amp", "bf16",
                                                                                 "--eval-every", 2))
    write(1)
    line = one_error_line(run(*args, "--amp", "bf16"))
    assert re.fullmatch(r"Error: .* holds a run trained on other data \(task='[0-9a-f]{12}\.\.\.', this run has "
                        r"'[0-9a-f]{12}\.\.\.'\); pass another --out", line), line
    assert TrainResult.read(tmp_path / "run" / "results.json").config["amp"] == "bf16"  # left as trained


def test_a_cached_run_never_replaces_another_run(tmp_path):
    store = tmp_path / "last.zarr"
    assert run("extract", *XOR, *TINY, "--layers", 2, "--out", store).exit_code == 0
    live = ["train", *XOR, *TINY, "--layers", 2, "--finetune", "output", "--steps", 10, "--eval-every", 5]
    assert run(*live, "--out", tmp_path / "live").exit_code == 0
    cached = ["train", "--from-store", store, "--finetune", "output", "--steps", 10, "--eval-every", 5,
              "--device", "cpu", "--quiet"]
    assert "holds a live run (last.pt)" in one_error_line(run(*cached, "--out", tmp_path / "live"))
    assert run(*live, "--out", tmp_path / "live").exit_code == 0  # the live run is still whole
    assert run(*cached, "--out", tmp_path / "c").exit_code == 0
    first = TrainResult.read(tmp_path / "c" / "results.json")
    assert run(*cached, "--out", tmp_path / "c").exit_code == 0  # the same cached run, computed again
    assert TrainResult.read(tmp_path / "c" / "results.json").metrics == first.metrics
    assert "holds a run with lr=0.001, this run has 0.1" in one_error_line(run(*cached, "--lr", 0.1, "--out",
                                                                              tmp_path / "c"))
    for args, expected in ((["--dropout", 0.1], "--dropout 0.0"), (["--amp", "bf16"], "--amp auto or --amp none"),
                           (["--compile"], "no --compile"),
                           (["--cuda-graphs", "on"], "--cuda-graphs auto or --cuda-graphs off")):
        line = one_error_line(run(*cached, *args, "--out", tmp_path / "forward"))  # the head alone runs no forward
        assert f"{' '.join(map(str, args))} with --from-store {store}: expected {expected} (a last-token" in line
    assert not (tmp_path / "forward").exists()
    assert run(*cached, "--amp", "none", "--cuda-graphs", "off", "--out", tmp_path / "forward").exit_code == 0


def test_lr_sweep_over_seeds(tmp_path):
    r = run("train", *XOR, *TINY, "--steps", 10, "--eval-every", 10, "--lr-sweep", "1e-3:1e-2:2", "--seeds", 2,
            "--out", tmp_path / "sweep")
    assert r.exit_code == 0, r.output
    saved = SweepResult.read(tmp_path / "sweep" / "sweep.json")
    assert saved.lrs == [1e-3, 1e-2] and saved.seeds == 2
    assert [(run["lr"], run["seed"]) for run in saved.runs] == [(1e-3, 0), (1e-3, 1), (1e-2, 0), (1e-2, 1)]
    for lr in saved.lrs:  # each lr's mean best validation accuracy over its seeds, and the best of them wins
        vals = [run["best_val_accuracy"] for run in saved.runs if run["lr"] == lr]
        assert saved.mean_val_by_lr[str(lr)] == pytest.approx(np.mean(vals))
    assert saved.mean_val_by_lr[str(saved.best_lr)] == max(saved.mean_val_by_lr.values())
    tests = [run["test_accuracy"] for run in saved.runs if run["lr"] == saved.best_lr]
    assert saved.metrics["test_accuracies"] == tests
    assert saved.metrics["test_accuracy_mean"] == pytest.approx(np.mean(tests))
    for run_ in saved.runs:  # every training wrote its own folder, with the metrics the sweep recorded
        folder = tmp_path / "sweep" / f"lr{run_['lr']:.3g}-seed{run_['seed']}"
        assert TrainResult.read(folder / "results.json").metrics == {k: v for k, v in run_.items()
                                                                     if k not in ("lr", "seed")}
    assert f"best lr {saved.best_lr:.2e}: test {saved.metrics['test_accuracy_mean']:.2%}" in r.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--finetune", "norms"], "unknown finetune group 'norms'"),
        (["--lr-sweep", "1e-2:1e-6:3"], "--lr-sweep expects 0 < LOW < HIGH"),
        (["--lr", "-1"], "--lr must be a finite number > 0, found -1.0"),
        (["--layers", "5"], "depth 5 is beyond"),
        (["--finetune", "recurrent"], "--finetune recurrent: expected parameters to train in backbone 'tiny-gpt2' "
                                      "(gpt2); found the group recurrent empty"),
    ],
)
def test_train_bad_input(tmp_path, args, expected):
    line = one_error_line(run("train", *XOR, *TINY, "--steps", 5, *args, "--out", tmp_path / "bad"))
    assert expected in line


def test_groups_that_train_nothing_are_one_line_everywhere(tmp_path):
    line = one_error_line(run("train", *XOR, "--backbone", "tiny-llama", "--device", "cpu", "--quiet", "--finetune",
                              "positions", "--steps", 2, "--out", tmp_path / "r"))
    assert "found the group positions empty" in line and "'tiny-llama' (llama)" in line
    assert not (tmp_path / "r" / "results.json").exists()
    line = one_error_line(run("bench", "train", *XOR, "--backbone", "tiny-gpt2", "--device", "cpu", "--finetune",
                              "recurrent", "--steps", 1, "--warmup", 1))
    assert "found the group recurrent empty" in line


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
    config = TrainResult.read(tmp_path / "ok" / "results.json").config  # task, init, seed, split from the store
    assert (config["from_store"], config["task"], config["split_layer"], config["init"]) == (str(store), "listops",
                                                                                             1, "pretrained")
    line = one_error_line(run("extract", "--task", "listops", "-p", "n_train=30", "-p", "n_test=10", "-p",
                              "max_length=30", "--backbone", "tiny-bert", "--layers", 2, "--full-seq-layer", 2,
                              "--out", tmp_path / "bad.zarr"))
    assert "--full-seq-layer must be within 0..1, below the depth 2" in line


def test_from_store_refuses_options_the_store_fixes_and_takes_the_seed(tmp_path):
    store = tmp_path / "sp.zarr"
    r = run("extract", *XOR, "--backbone", "tiny-gpt2", "--full-seq-layer", 1, "--out", store, "--quiet")
    assert r.exit_code == 0, r.output
    common = ["train", "--from-store", store, *TINY, "--finetune", "layernorm,output", "--steps", 2, "--eval-every", 2]
    for args, expected in [(["--task", "listops"], "--task with --from-store"), (["--init", "random"], "--init with"),
                           (["-p", "n_train=81"], "--param with"), (["--split-layer", 0], "--split-layer with")]:
        line = one_error_line(run(*common, *args, "--out", tmp_path / "bad"))
        assert expected in line and "expected the store's" in line, line
    assert not (tmp_path / "bad").exists()
    r = run(*common, "--task", "bit-xor", "-p", "n_train=80", "--init", "pretrained", "--seed", 3,
            "--out", tmp_path / "ok")  # the store's own values, and a seed of this run's own
    assert r.exit_code == 0, r.output
    config = TrainResult.read(tmp_path / "ok" / "results.json").config
    assert (config["task"], config["init"], config["seed"], config["split_layer"]) == ("bit-xor", "pretrained", 3, 1)
    assert "are refused. A split-point store's backbone is loaded by --backbone, default the store's own" in " ".join(
        run("train", "--help").stdout.split())


def test_bench_speedup_cli(tmp_path):
    r = run("bench", "speedup", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=16", "--backbone", "tiny-gpt2",
            "--max-live-rows", 32, "--device", "cpu", "--out", tmp_path / "bench.json")
    assert r.exit_code == 0, r.output
    assert "(a) output layer only" in r.stdout
    a = json.loads((tmp_path / "bench.json").read_text())["output_only"]
    assert a["speedup"] == pytest.approx(a["live_epoch_s"] / a["cached_epoch_s"]) and a["speedup"] > 1


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # the comparison's max_iter is part of it
def test_bench_readout_cli(tmp_path):
    store = tmp_path / "d.zarr"
    r = run("extract", "--task", "listops", "-p", "n_train=120", "-p", "n_test=40", "-p", "max_length=30",
            "--backbone", "tiny-gpt2", "--layers", 1, "--out", store, "--quiet")
    assert r.exit_code == 0, r.output
    r = run("bench", "readout", store, "--layer", 1, "--out", tmp_path / "b.json")
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "b.json").read_text())
    assert (saved["layers"], saved["n_train"], saved["n_features"]) == ([1], 120, 32)
    assert saved["time_ratio"] == pytest.approx(saved["sklearn_s"] / saved["reservoir_s"])
    for name in ("reservoir", "sklearn"):  # what is printed is what is saved
        assert f"{100 * saved['per_layer'][0][name]['test_accuracy']:6.2f}%" in r.stdout
    assert f"scikit-learn / reservoir wall time: {saved['time_ratio']:.1f}x" in r.stdout
    assert "wall time" in r.stdout and "standardized penalty, path on every fit row" in r.stdout
    r = run("bench", "readout", store, "--layer", 1, "--penalty", "whitened", "--path-rows", 50)
    assert r.exit_code == 0, r.output
    assert "whitened penalty, path on 50 rows" in r.stdout
    assert "--path-rows: expected 'all' or an integer >= 2, found '1'" in one_error_line(
        run("bench", "readout", store, "--path-rows", 1))
    xor = tmp_path / "x.zarr"
    assert run("extract", *XOR, "--backbone", "tiny-gpt2", "--out", xor, "--quiet").exit_code == 0
    assert "one label per row" in one_error_line(run("bench", "readout", xor, "--layer", 1))


def test_a_split_point_store_trains_its_own_backbone_unless_another_is_named(tmp_path):
    store = tmp_path / "split.zarr"
    r = run("extract", *XOR, "--backbone", "tiny-gpt2", "--init", "random", "--full-seq-layer", 1, "--layers", 2,
            "--dtype", "float32", "--amp", "none", "--quiet", "--out", store)
    assert r.exit_code == 0, r.output
    r = run("train", "--from-store", store, "--finetune", "layernorm,output", "--steps", 4, "--eval-every", 2,
            "--amp", "none", "--device", "cpu", "--quiet", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output  # no --backbone: the store's (tiny-gpt2), not the default minilm
    assert TrainResult.read(tmp_path / "run" / "results.json").backbone["id"] == "tiny-gpt2"
    line = one_error_line(run("train", "--from-store", store, "--backbone", "tiny-bert", "--finetune",
                              "layernorm,output", "--steps", 4, "--device", "cpu", "--quiet", "--out", tmp_path / "r2"))
    assert "expected the backbone the store was extracted with ('tiny-gpt2', weights sha256" in line
    assert "pass --backbone naming that model" in line
