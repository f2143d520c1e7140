"""Hostile and mistaken input: checkpoints that would run code, training numbers out of range, recipes that
would write outside their results folder, recipe files that are not UTF-8 and cells with bad values.

Each refusal is one ``Error:`` line on stderr with exit status 2, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shlex
import shutil
import textwrap

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.recipes import Recipe, run_recipe
from reservoir.training import TrainConfig, run
from reservoir.training.attention import attention

XOR = {"n_train": 80, "n_test": 40, "n_bits": 2}
XOR_ARGS = ["--task", "bit-xor", "-p", "n_train=80", "-p", "n_test=40", "-p", "n_bits=2"]
TINY_ARGS = ["--backbone", "tiny-gpt2", "--device", "cpu", "--quiet"]


def invoke(*args):
    """The CLI in-process; ``stdout`` and ``stderr`` are kept apart (click >= 8.2)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result) -> str:
    """The single ``Error:`` line of a refused command (exit status 2, no traceback)."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


class RunsAShellCommand:
    """Unpickling this runs ``touch <marker>``: what a crafted checkpoint does to ``torch.load(weights_only=False)``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def write_malicious(path, marker, form: str) -> None:
    """A checkpoint that creates ``marker`` when unpickled: a torch zip file, or a bare pickle."""
    evil = {"config": RunsAShellCommand(marker), "trainable": {}, "step": 1}
    if form == "torch.save":
        torch.save(evil, path)
    else:
        path.write_bytes(pickle.dumps(evil, protocol=2))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished tiny run (results.json, best.pt, last.pt); tests copy it before changing it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run(TrainConfig(task="bit-xor", task_params=XOR, backbone="tiny-gpt2", steps=4, eval_every=2, device="cpu",
                    out=str(out)), progress=False)
    return out


def copy_of(run, tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


# ------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize("form", ["torch.save", "pickle"])
def test_the_malicious_payload_is_live(tmp_path, form):
    """The test files below really run a command when unpickled without weights_only (else they prove nothing)."""
    marker = tmp_path / "MARKER"
    write_malicious(tmp_path / "x.pt", marker, form)
    with contextlib.suppress(RuntimeError):  # a bare pickle runs while torch reads its "magic number", then fails
        torch.load(tmp_path / "x.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("form", ["torch.save", "pickle"])
def test_malicious_last_pt_is_refused_on_resume(tmp_path, form):
    out, marker = tmp_path / "run", tmp_path / "MARKER"
    out.mkdir()
    write_malicious(out / "last.pt", marker, form)
    line = one_error_line(invoke("train", *XOR_ARGS, *TINY_ARGS, "--steps", 4, "--out", out))
    assert not marker.exists()
    assert line.startswith(f"Error: {out / 'last.pt'}: expected a reservoir checkpoint (tensors and plain data), "
                           "found a file torch.load(weights_only=True) refuses: ")
    assert "system" in line  # the refused global, e.g. posix.system
    assert sorted(p.name for p in out.iterdir()) == ["last.pt"]  # no best.pt or results.json claims a run


@pytest.mark.parametrize("form", ["torch.save", "pickle"])
def test_malicious_best_pt_is_refused_by_plot_attention(finished_run, tmp_path, form):
    run, marker = copy_of(finished_run, tmp_path), tmp_path / "MARKER"
    write_malicious(run / "best.pt", marker, form)
    line = one_error_line(invoke("plot", "attention", "--run", run, "--device", "cpu"))
    assert not marker.exists()
    assert f"{run / 'best.pt'}: expected a reservoir checkpoint (tensors and plain data), found a file " in line
    assert not list(run.glob("*.png"))


@pytest.mark.parametrize("case, found", [
    ("garbage", "found a file torch.load(weights_only=True) refuses: Unsupported operand"),
    ("text", "refuses: not a file torch writes (KeyError 174812789)"),  # was the bare number
    ("truncated", "refuses: PytorchStreamReader failed reading zip archive: failed finding central directory"),
    ("empty", "found an empty file"),
    ("a list", "found a list"),
    ("keys missing", "(tensors and plain data) with config, trainable, optimizer, rng, state, found one without "
                     "optimizer, rng, state"),
    ("deflated", "found compressed entries that inflate to 67,"),  # 64 MiB of zeros in a file of ~70 KB
])
def test_unreadable_last_pt_is_one_line(finished_run, tmp_path, case, found):
    out = tmp_path / "run"
    out.mkdir()
    last = out / "last.pt"
    if case == "garbage":
        last.write_bytes(b"\x80\x02not a checkpoint\x00\xff" * 10)
    elif case == "text":
        last.write_text("junk\n")
    elif case == "truncated":
        last.write_bytes((finished_run / "last.pt").read_bytes()[:2000])
    elif case == "empty":
        last.write_bytes(b"")
    elif case == "deflated":  # torch's own zip, repacked with deflate: torch.load inflates it without a word
        import zipfile

        torch.save({"t": torch.zeros(16 << 20)}, tmp_path / "big.pt")
        with zipfile.ZipFile(tmp_path / "big.pt") as src, zipfile.ZipFile(last, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info))
        assert last.stat().st_size < 1 << 20
    else:
        torch.save([1, 2] if case == "a list" else {"config": {}, "trainable": {}}, last)
    line = one_error_line(invoke("train", *XOR_ARGS, *TINY_ARGS, "--steps", 4, "--out", out))
    assert line.startswith(f"Error: {last}: expected a reservoir checkpoint") and found in line, line


def test_checkpoints_hold_only_plain_data(tmp_path):
    """Settings given as numpy numbers are saved as plain numbers: the checkpoint loads with weights_only=True."""
    cfg = TrainConfig(task="bit-xor", task_params={**XOR, "n_train": np.int64(80)}, backbone="tiny-gpt2", steps=4,
                      eval_every=2, device="cpu", out=str(tmp_path / "run"))
    first = run(cfg, progress=False)

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, (str, int)) and plain(v) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return all(plain(v) for v in x)
        return x is None or isinstance(x, (str, int, float, bool, torch.Tensor))

    for name in ("last.pt", "best.pt"):
        ckpt = torch.load(tmp_path / "run" / name, weights_only=True)
        assert plain(ckpt) and ckpt["config"]["task_params"]["n_train"] == 80
    again = run(cfg, progress=False)  # resumes the finished run from its checkpoints
    assert again.metrics == first.metrics and again.curve == first.curve


def test_best_pt_of_another_run_is_refused(finished_run, tmp_path):
    other = tmp_path / "other"
    run(TrainConfig(task="bit-xor", task_params=XOR, backbone="tiny-gpt2", lr=0.01, steps=2, eval_every=2,
                    device="cpu", out=str(other)), progress=False)
    folder = copy_of(finished_run, tmp_path)
    shutil.copy(other / "best.pt", folder / "best.pt")
    with pytest.raises(ReservoirError) as err:
        attention(folder)
    assert str(err.value) == (f"{folder / 'best.pt'}: expected the checkpoint of the run in results.json, found a run "
                              "with lr=0.01, this run has 0.001")


def test_unreadable_results_json_is_one_line(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path)
    (run / "results.json").write_text("{not json")
    with pytest.raises(ReservoirError, match=r"results.json: expected the results of a `reservoir train` run; found "
                                             r"invalid JSON \(Expecting property name"):
        attention(run)


# ------------------------------------------------------------------ training numbers


@pytest.mark.parametrize("args, message", [
    (["--steps", 0], "--steps must be an integer >= 1, found 0"),
    (["--steps", -5], "--steps must be an integer >= 1, found -5"),
    (["--epochs", -1], "--epochs must be a finite number > 0, found -1.0"),
    (["--epochs", 0], "--epochs must be a finite number > 0, found 0.0"),
    (["--epochs", "nan"], "--epochs must be a finite number > 0, found nan"),
    (["--lr", 0], "--lr must be a finite number > 0, found 0.0"),
    (["--lr", "inf"], "--lr must be a finite number > 0, found inf"),
    (["--batch-size", 0], "--batch-size must be an integer >= 1, found 0"),
    (["--eval-every", 0], "--eval-every must be an integer >= 1, found 0"),
    (["--dropout", 1], "--dropout must be a number in [0, 1), found 1.0"),
    (["--dropout", -0.1], "--dropout must be a number in [0, 1), found -0.1"),
    (["--layers", -1], "--layers must be an integer >= 0, found -1"),
    (["--split-layer", -1], "--split-layer must be an integer >= 0, found -1"),
])
def test_bad_training_numbers_leave_no_run_folder(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke("train", *XOR_ARGS, *TINY_ARGS, *args))  # the default folder: results/train/...
    assert line == f"Error: {message}"
    line = one_error_line(invoke("train", *XOR_ARGS, *TINY_ARGS, *args, "--out", tmp_path / "run"))
    assert line == f"Error: {message}"
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("field, value, message", [
    ("grad_clip", -1.0, "grad_clip must be a finite number >= 0 (0: no clipping), found -1.0"),
    ("val_fraction", 1.0, "val_fraction must be a number in (0, 1), found 1.0"),
    ("projection_gain", 0.0, "projection_gain must be a finite number > 0, found 0.0"),
    ("steps", 2.5, "--steps must be an integer >= 1, found 2.5"),
    ("lr", "1e-3", "--lr must be a finite number > 0, found '1e-3'"),
    ("batch_size", True, "--batch-size must be an integer >= 1, found True"),
    ("seed", -1, "--seed must be an integer in 0..4294967295, found -1"),
])
def test_bad_settings_of_the_python_api(field, value, message):
    with pytest.raises(ReservoirError) as err:
        TrainConfig(task="bit-xor", **{field: value})
    assert str(err.value) == message


# ------------------------------------------------------------------ recipes


RECIPE = {"name": "safe", "cells": [{"kind": "fit-raw", "task": "digits"}]}


def write_recipe(path, data) -> None:
    path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "has space", "semi;colon"])
def test_recipe_name_must_be_one_folder_name(tmp_path, monkeypatch, name):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    write_recipe(tmp_path / "r.yaml", {**RECIPE, "name": name})
    line = one_error_line(invoke("recipe", "run", tmp_path / "r.yaml"))
    assert line == (f"Error: recipe r.yaml: name: expected letters, digits, '.', '_' or '-' (one folder name, not "
                    f"'.' or '..'), found {name!r}")
    assert sorted(os.listdir(tmp_path)) == ["r.yaml", "work"] and os.listdir(work) == []


def test_recipe_name_from_the_file_stem_is_checked_too(tmp_path):
    data = {"cells": RECIPE["cells"]}
    with pytest.raises(ReservoirError, match=r"name \(the file's stem; set name: in the recipe\): expected letters"):
        Recipe.from_dict(data, "my recipe.yaml")
    assert Recipe.from_dict(data, "my-recipe.yaml").name == "my-recipe"


@pytest.mark.parametrize("tag", ["../../outside", "x/../../../victim", "..", ""])
def test_cell_tag_must_be_one_folder_name(tmp_path, tag):
    data = {**RECIPE, "cells": [{**RECIPE["cells"][0], "tag": tag}]}
    write_recipe(tmp_path / "r.yaml", data)
    line = one_error_line(invoke("recipe", "run", tmp_path / "r.yaml", "--out", tmp_path / "results"))
    assert line == (f"Error: recipe r.yaml: tag in cells[0]: expected letters, digits, '.', '_' or '-' (one folder "
                    f"name, not '.' or '..'), found {tag!r}")
    assert sorted(os.listdir(tmp_path)) == ["r.yaml"]


def test_force_never_removes_outside_the_results_folder(tmp_path):
    """Even if an id got past validation, --force's removal and every write stay inside the results folder."""
    out = tmp_path / "deep" / "results"
    (out / "fit-raw__digits__x").mkdir(parents=True)
    victim = tmp_path / "victim__seed0"  # where the id below points, seen from `out`
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    recipe = Recipe.from_dict(RECIPE, "r.yaml")
    recipe.cells[0].tag = "x/../../../victim"  # a tag the schema refuses, planted after validation
    with pytest.raises(ReservoirError, match=r"expected a path inside .*results, found one resolving to "
                                             r".*victim__seed0; refusing to write or remove it"):
        run_recipe(recipe, out=out, force=True, progress=False)
    assert (victim / "precious.txt").read_text() == "keep me"
    assert not (out / "recipe.yaml").exists()


@pytest.mark.parametrize("force", [False, True])
def test_symlinked_run_folder_is_not_followed(tmp_path, force):
    """A run folder that is a symbolic link to another place is refused: nothing written there, nothing removed."""
    out, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me")
    (out / "fit-raw__digits__seed0").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ReservoirError, match="refusing to write or remove it"):
        run_recipe(Recipe.from_dict(RECIPE, "r.yaml"), out=out, force=force, progress=False)
    assert sorted(os.listdir(elsewhere)) == ["precious.txt"]
    assert (elsewhere / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfename: x\n", "recipe bad.yaml: expected UTF-8 text, found byte 0xff at offset 0"),
    ("name: caf\xe9\ncells: []\n".encode("latin-1"),
     "recipe bad.yaml: expected UTF-8 text, found byte 0xe9 at offset 9"),
    (b"cells: [\n", "recipe bad.yaml: expected YAML, found a syntax error"),  # was already one line; kept so
])
def test_unreadable_recipe_file_is_one_line(tmp_path, monkeypatch, content, message):
    (tmp_path / "bad.yaml").write_bytes(content)
    line = one_error_line(invoke("recipe", "run", tmp_path / "bad.yaml", "--out", tmp_path / "out"))
    assert line.startswith(f"Error: {message}"), line
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("RESERVOIR_RECIPES", str(tmp_path))  # `recipe list` names it as invalid instead of crashing
    r = invoke("recipe", "list")
    assert r.exit_code == 0 and f"(invalid: {message}" in r.stdout


TRAIN_CELL = {"kind": "train", "task": "bit-xor", "backbone": "tiny-gpt2", "steps": 2,
              "task_params": {"n_train": 32, "n_test": 16}}
BENCH_CELL = {"kind": "bench", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 2}


# Values the schema newly refuses, then values it refused before too (id refused-before), kept as regression guards.
@pytest.mark.parametrize("cell, message", [
    ({**TRAIN_CELL, "lr": -1}, "lr in cells[0] must be a finite number > 0, found -1.0"),
    ({**TRAIN_CELL, "lr": [1e-3, float("nan")]}, "lr in cells[0] must be a finite number > 0, found nan"),
    ({**TRAIN_CELL, "steps": 0}, "steps in cells[0] must be an integer >= 1, found 0"),
    ({**TRAIN_CELL, "steps": None, "epochs": -1}, "epochs in cells[0] must be a finite number > 0, found -1.0"),
    ({**TRAIN_CELL, "eval_every": 0}, "eval_every in cells[0] must be an integer >= 1, found 0"),
    ({**TRAIN_CELL, "batch_size": 0}, "batch_size in cells[0] must be an integer >= 1, found 0"),
    ({**TRAIN_CELL, "dropout": 1.5}, "dropout in cells[0] must be a number in [0, 1), found 1.5"),
    ({**TRAIN_CELL, "seeds": -1}, "seeds in cells[0] must be an integer in 0..4294967295, found -1"),
    ({**TRAIN_CELL, "seeds": []}, "seeds in cells[0]: expected at least one value, found an empty list"),
    ({**TRAIN_CELL, "layers": -1}, "layers in cells[0] must be an integer >= 0, found -1"),
    ({**TRAIN_CELL, "finetune": []}, "finetune in cells[0]: expected at least one value, found an empty list"),
    ({**TRAIN_CELL, "task_params": 0}, "task_params in cells[0] must be a mapping, found 0"),
    ({**BENCH_CELL, "max_live_rows": 0}, "max_live_rows in cells[0] must be an integer >= 1, found 0"),
    ({**BENCH_CELL, "split_layer": -1}, "split_layer in cells[0] must be an integer >= 0, found -1"),
    ({**BENCH_CELL, "init": []}, "init in cells[0]: expected at least one value, found an empty list"),
    pytest.param({**TRAIN_CELL, "lr": "abc"}, "lr in cells[0] must be a number, found 'abc'",
                 id="refused-before:lr-abc"),
    pytest.param({**TRAIN_CELL, "layers": 1.5}, "layers in cells[0] must be an integer, found 1.5",
                 id="refused-before:layers-1.5"),
    pytest.param({**TRAIN_CELL, "init": "trained"}, "unknown init 'trained' in cells[0]",
                 id="refused-before:init-trained"),
    pytest.param({**TRAIN_CELL, "finetune": "norms"}, "finetune in cells[0]: unknown finetune group 'norms'",
                 id="refused-before:finetune-norms"),
    pytest.param({"kind": "fit-raw", "task": "digits", "readout": "svm"}, "unknown readout 'svm' in cells[0]",
                 id="refused-before:readout-svm"),
    pytest.param({**TRAIN_CELL, "task_params": [1]}, "task_params in cells[0] must be a mapping, found [1]",
                 id="refused-before:task_params-list"),
])
def test_bad_cell_values_are_refused_before_anything_is_written(tmp_path, cell, message):
    write_recipe(tmp_path / "r.yaml", {"name": "bad", "cells": [cell]})
    line = one_error_line(invoke("recipe", "run", tmp_path / "r.yaml", "--out", tmp_path / "out"))
    assert line.startswith(f"Error: recipe r.yaml: {message}"), line
    assert not (tmp_path / "out").exists()


def test_recipe_of_good_values_still_runs(tmp_path):
    """The checks refuse only bad values: a tiny train cell with YAML-string numbers runs and writes its results."""
    recipe = textwrap.dedent("""\
        name: fine
        cells:
          - {kind: train, task: bit-xor, backbone: tiny-gpt2, steps: "2", eval_every: 1, lr: 1e-3, tag: v1.0_a-b,
             seeds: 0, task_params: {n_train: 32, n_test: 16}}
    """)
    (tmp_path / "r.yaml").write_text(recipe)
    r = invoke("recipe", "run", tmp_path / "r.yaml", "--out", tmp_path / "out", "--cache", tmp_path / "cache",
               "--device", "cpu", "--quiet")
    assert r.exit_code == 0, r.output
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert run.name == "train__bit-xor__v1.0_a-b__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0"
    assert json.loads((run / "results.json").read_text())["metrics"]["steps"] == 2
