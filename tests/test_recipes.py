"""Recipes and reports: schema validation, expansion, a tiny grid end to end, skipping, store reuse, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import reservoir.bench
import reservoir.extract
import reservoir.readouts.raw
import reservoir.readouts.run
import reservoir.training
from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.recipes import Recipe, list_recipes, load_recipe, plan, run_recipe
from reservoir.recipes.runner import store_for
from reservoir.store import FeatureStore
from reservoir.report import report
from reservoir.report.plots import depth_lines

TINY = textwrap.dedent("""\
    name: tiny
    description: tiny-gpt2 on bit XOR and digits (test recipe)
    defaults: {backbone: tiny-gpt2, seeds: [0], task_params: {n_train: 64, n_test: 32}}
    cells:
      - kind: fit-linear
        task: bit-xor
        init: [pretrained, random]
        layers: 2
      - kind: train
        task: bit-xor
        steps: 20
        eval_every: 10
        batch_size: 8
        lr: 1e-3
      - kind: fit-raw
        task: digits                # defaults' n_train/n_test do not apply: digits has no such parameters
      - {kind: bench, task: bit-xor, layers: 2, max_live_rows: 16}
    paper:
      - {match: {kind: fit-linear, task: bit-xor, init: pretrained, layer: 2}, value: 42.5, source: "Made-up Table 99"}
      - {match: {kind: train}, value: 500, metric: steps_to_converge, source: "Made-up Table 6"}
      - {match: {kind: train}, value: 97, source: "Made-up Table 2"}
      - {match: {kind: bench}, value: 1000, metric: speedup, source: "Made-up Table 10"}
""")


def make(data: dict, name: str = "t.yaml") -> Recipe:
    return Recipe.from_dict(data, name)


def error_of(data: dict) -> str:
    with pytest.raises(ReservoirError) as err:
        make(data)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


BASE = {"cells": [{"kind": "fit-linear", "task": "bit-xor", "layers": 2}]}


# ------------------------------------------------------------------ schema


def test_unknown_top_level_key_is_named():
    msg = error_of({**BASE, "cell": []})
    assert msg.startswith("recipe t.yaml: unknown key 'cell' in the top level; expected one of: ")
    assert "cells" in msg and "paper" in msg


def test_unknown_cell_key_is_named_with_its_place():
    msg = error_of({"cells": [{"kind": "fit-linear", "task": "bit-xor", "layers": 2, "readouts": "logistic"}]})
    assert "unknown key 'readouts' in cells[0] (kind fit-linear); expected one of: " in msg
    assert "readout" in msg and "fit_layers" in msg
    assert error_of({"cells": [{"kind": "fit-linear", "task": "bit-xor"}]}).endswith(
        "layers in cells[0] must be one store depth K for fit-linear (choose the fitted layers with fit_layers), "
        "found none given")


def test_key_of_another_kind_is_refused():
    msg = error_of({"cells": [BASE["cells"][0], {"kind": "fit-linear", "task": "x", "layers": 1, "finetune": "fpt"}]})
    assert "unknown key 'finetune' in cells[1]" in msg


def test_unknown_keys_in_defaults_paper_and_match():
    assert "unknown key 'seed' in defaults" in error_of({**BASE, "defaults": {"seed": 1}})
    assert "unknown key 'val' in paper[0]" in error_of({**BASE, "paper": [{"match": {"task": "x"}, "val": 1}]})
    assert "unknown metric 'loss' in paper[0]; expected one of: test_accuracy, steps_to_converge, speedup" in error_of(
        {**BASE, "paper": [{"match": {"task": "x"}, "value": 1, "metric": "loss"}]})
    msg = error_of({**BASE, "paper": [{"match": {"depth": 6}, "value": 1}]})
    assert "unknown key 'depth' in paper[0].match; expected one of: kind, task" in msg


def test_paper_entry_that_fits_no_row_is_refused():
    assert "paper[0].match {'task': 'bit-xr'} fits no run of this recipe" in error_of(
        {**BASE, "paper": [{"match": {"task": "bit-xr"}, "value": 1}]})
    assert "fits no run" in error_of({**BASE, "paper": [{"match": {"task": "bit-xor", "layer": 3}, "value": 1}]})
    # a steps-to-converge value needs a train row, a speedup a bench row
    assert "fits no train run" in error_of(
        {**BASE, "paper": [{"match": {"task": "bit-xor"}, "value": 500, "metric": "steps_to_converge"}]})
    make({**BASE, "paper": [{"match": {"task": "bit-xor", "layer": 2}, "value": 1}]})


def test_a_paper_value_sits_only_beside_rows_that_measure_its_metric():
    """An entry without `kind` in its match (a Table-6 steps value for a task) fits the recipe's train rows only:
    not a fit-linear row of the same task, and a test accuracy never a bench row."""
    data = {"defaults": {"backbone": "tiny-gpt2"},
            "cells": [BASE["cells"][0], {"kind": "train", "task": "bit-xor", "steps": 4, "eval_every": 2},
                      {"kind": "bench", "task": "bit-xor", "layers": 2}],
            "paper": [{"match": {"task": "bit-xor"}, "value": 500, "metric": "steps_to_converge"},
                      {"match": {"task": "bit-xor"}, "value": 56}]}
    recipe = make(data)
    rows = {run.kind: label for run in recipe.runs() for label, _ in run.outputs()}
    assert recipe.paper_value(rows["train"], "steps_to_converge").value == 500
    assert recipe.paper_value(rows["fit-linear"], "steps_to_converge") is None
    assert recipe.paper_value(rows["fit-linear"]).value == 56 and recipe.paper_value(rows["bench"]) is None
    assert "fits no run" in error_of({**BASE, "cells": [data["cells"][2]], "defaults": data["defaults"],
                                      "paper": [{"match": {"task": "bit-xor"}, "value": 56}]})


def test_a_default_task_parameter_that_only_some_tasks_of_a_cell_take_is_refused():
    """A cell's tasks share one task_params: n_train from the defaults, which bit-xor takes and digits does not,
    used to be dropped for both (bit-xor silently built 4,000 rows)."""
    msg = error_of({"defaults": {"task_params": {"n_train": 64}},
                    "cells": [{"kind": "fit-raw", "task": ["bit-xor", "digits"]}]})
    assert ("task_params 'n_train' in defaults: expected a parameter every task of cells[0] takes, or none; found "
            "it taken by bit-xor, not by digits (split the cell by task)") in msg
    cells = make({"defaults": {"task_params": {"n_train": 64}},
                  "cells": [{"kind": "fit-raw", "task": "digits"}, {"kind": "fit-raw", "task": "bit-xor"}]}).cells
    assert cells[0].task_params == {} and cells[1].task_params == {"n_train": 64}


def test_a_cell_gives_lr_or_lr_sweep_not_both():
    cell = {"kind": "train", "task": "bit-xor", "lr_sweep": "1e-3:1e-2:2", "lr": [1e-5]}
    assert "cells[0]: expected lr or lr_sweep, not both (the sweep chooses the rate)" in error_of({"cells": [cell]})
    assert "expected lr or lr_sweep" in error_of({"defaults": {"lr_sweep": "1e-3:1e-2:2"},
                                                 "cells": [{"kind": "train", "task": "bit-xor", "lr": 1e-3}]})
    make({"defaults": {"lr": 1e-4}, "cells": [{"kind": "train", "task": "bit-xor", "lr_sweep": "1e-3:1e-2:2"}]})
    assert "expects LOW:HIGH:N" in error_of({"cells": [{"kind": "train", "task": "bit-xor",
                                                         "lr_sweep": "1e-3:1e-2:2_0"}]})


def test_every_shipped_recipe_validates():
    listed = dict(list_recipes())
    assert {"quickstart", "cpu-listops-depth", "cpu-images", "cpu-bit-xor", "paper-table1", "paper-table2",
            "paper-table3", "paper-table6", "paper-table10", "paper-table11", "paper-table12", "paper-tables15-21",
            "paper-rothermel"} <= set(listed)
    for name, description in listed.items():
        assert not description.startswith("(invalid"), description
        recipe = load_recipe(name)
        assert recipe.name == name and recipe.runs()


def test_bad_kind_missing_task_and_bad_values():
    assert "unknown kind 'fit' in cells[0]; expected one of: fit-linear, train, fit-raw, bench" in error_of(
        {"cells": [{"kind": "fit", "task": "bit-xor"}]})
    assert "cells[0] needs a task" in error_of({"cells": [{"kind": "fit-raw"}]})
    assert "cells[0] needs a kind" in error_of({"cells": [{"task": "bit-xor"}]})
    assert "unknown init 'trained'" in error_of({"cells": [{**BASE["cells"][0], "init": "trained"}]})
    assert "lr in cells[0] must be a number" in error_of({"cells": [{"kind": "train", "task": "x", "lr": "fast"}]})
    assert "store depth" in error_of({"cells": [{"kind": "fit-linear", "task": "x"}]})
    assert "--lr-sweep expects" in error_of({"cells": [{"kind": "train", "task": "x", "lr_sweep": "1e-3"}]})
    assert "expected a non-empty list under 'cells'" in error_of({"name": "x"})
    assert "readout in cells[0]: expected each value once, found 'logistic' twice" in error_of(
        {"cells": [{"kind": "fit-raw", "task": "digits", "readout": ["logistic", "logistic"]}]})
    assert "fit_layers in cells[0]: expected each value once, found 1 twice" in error_of(
        {"cells": [{"kind": "fit-linear", "task": "bit-xor", "layers": 2, "fit_layers": [1, 1]}]})
    assert "layers in cells[0] must be one depth of at least 1 for bench" in error_of(
        {"cells": [{"kind": "bench", "task": "bit-xor", "layers": 0}]})


@pytest.mark.parametrize("params, expected", [
    ({"n_train": "abc"}, "task 'bit-xor': n_train must be an integer >= 1; found 'abc'"),
    ({"n_train": -5}, "task 'bit-xor': n_train must be an integer >= 1; found -5"),
    ({"n_train": 1.5}, "task 'bit-xor': n_train must be an integer >= 1; found 1.5"),
    ({"n_bits": 0}, "task 'bit-xor': n_bits must be an integer in [1, 256]; found 0"),
    ({"n_train": 10**12}, "task 'bit-xor': n_train must be at most 100,000,000"),
])
def test_task_parameters_are_checked_when_the_recipe_is_loaded(tmp_path, params, expected):
    """Before any run: a bad value in the second cell is refused before the first cell's run writes anything."""
    cells = [{"kind": "fit-raw", "task": "digits"}, {"kind": "fit-raw", "task": "bit-xor", "task_params": params}]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"cells": cells}))
    for args in (("--dry-run",), ()):
        r = invoke("recipe", "run", tmp_path / "r.yaml", "--out", tmp_path / "out", *args)
        assert r.exit_code == 2 and f"task_params in cells[1]: {expected}" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_every_task_checks_its_parameters_as_its_builder_does():
    """Each registered task's check takes its defaults, and refuses what its builder refuses, with the same line."""
    from reservoir.tasks import TASKS, get_task
    from reservoir.tasks.base import check_params

    bad = {"bit-xor": {"n_test": 0}, "bit-memory": {"n_bits": 7, "bits_per_token": 2},
           "listops": {"min_length": 5, "max_length": 5}, "mnist": {"patch": 3}, "fashion-mnist": {"size": 0},
           "digits": {"test_fraction": 1.0}, "cifar10": {"patch": 5}, "cifar10-lra": {"n_test": 0},
           "remote-homology": {"format": "csv"}}
    for name, spec in TASKS.items():
        if name == "data":  # a file's path and column names: text, checked as such
            continue
        assert spec.check is not None, name
        check_params(name, {})
        with pytest.raises(ReservoirError) as checked:
            check_params(name, bad[name])
        with pytest.raises(ReservoirError) as built:
            get_task(name, **bad[name])
        assert str(checked.value) == str(built.value)


def test_a_key_written_twice_is_refused_and_a_merge_key_is_not(tmp_path):
    """PyYAML keeps the last of two equal keys: a second top-level ``cells`` dropped the whole first block; of two
    merge keys in one mapping it merges one."""
    cases = {"cells:\n  - {kind: train, task: bit-xor, steps: 20000, steps: 5}\n": "'steps' at line 2 and again at "
             "line 2", "cells:\n  - {kind: fit-raw, task: digits}\npaper: []\ncells:\n  - {kind: fit-raw, task: "
             "bit-xor}\n": "'cells' at line 1 and again at line 4",
             "cells:\n  - &a {kind: fit-raw, task: digits}\n  - {<<: *a, <<: {task: bit-xor}}\n": "'<<' at line 3 "
             "and again at line 3"}
    for text, where in cases.items():
        (tmp_path / "r.yaml").write_text(text)
        with pytest.raises(ReservoirError, match=f"recipe r.yaml: expected each key once in a mapping; found {where}"):
            load_recipe(tmp_path / "r.yaml")
    (tmp_path / "m.yaml").write_text("cells:\n  - &a {kind: fit-raw, task: digits}\n  - {<<: *a, task: bit-xor}\n"
                                     "  - {<<: [*a, {readout: ridge}], task: listops}\n")  # one key, a list merged
    assert [c.task for c in load_recipe(tmp_path / "m.yaml").cells] == [["digits"], ["bit-xor"], ["listops"]]
    assert all(load_recipe(name) for name, _ in list_recipes())  # every bundled recipe: each key once


def test_yaml_numbers_and_defaults():
    r = make({"defaults": {"backbone": "tiny-bert", "task_params": {"n_train": 10}, "seeds": [0, 1]},
              "cells": [{"kind": "train", "task": "bit-xor", "lr": ["1e-3", 1e-4], "steps": "1e2",
                         "task_params": {"n_test": 5}},
                        {"kind": "fit-raw", "task": "digits"}]})
    train, raw = r.cells
    assert train.lr == [1e-3, 1e-4] and train.steps == 100 and train.backbone == ["tiny-bert"]
    assert train.task_params == {"n_train": 10, "n_test": 5}
    assert raw.seeds == [0, 1]  # backbone does not apply to fit-raw: dropped from its defaults


def test_expansion_ids():
    r = make({"defaults": {"backbone": "minilm"},
              "cells": [{"kind": "fit-linear", "task": "listops", "init": ["pretrained", "random"], "layers": 6},
                        {"kind": "train", "task": "bit-xor", "finetune": ["fpt", "layernorm,output"], "lr": 1e-3,
                         "layers": [1, 2], "seeds": [0, 1]},
                        {"kind": "train", "task": "mnist", "finetune": "all", "lr_sweep": "1e-6:1e-2:9",
                         "seeds": [0, 1, 2], "tag": "small"},
                        {"kind": "fit-raw", "task": "digits", "seeds": 3}]})
    ids = [run.id for run in r.runs()]
    assert ids[:2] == ["fit-linear__listops__minilm__pretrained__d6__seed0",
                       "fit-linear__listops__minilm__random__d6__seed0"]
    assert len(ids) == 2 + 2 * 2 * 2 + 1 + 1 and len(set(ids)) == len(ids)
    assert "train__bit-xor__minilm__pretrained__d1__layernorm+output__lr0.001__seed1" in ids
    assert "train__mnist__small__minilm__pretrained__dall__all__sweep1e-06-0.01x9__seeds0-2" in ids
    assert ids[-1] == "fit-raw__digits__seed3"


def test_colliding_runs_need_a_tag():
    cell = {"kind": "fit-raw", "task": "digits"}
    assert "give one a 'tag'" in error_of({"cells": [cell, {**cell, "task_params": {"patch": 4}}]})
    make({"cells": [cell, {**cell, "task_params": {"patch": 4}, "tag": "p4"}]})


def test_load_by_name_and_list(tmp_path, monkeypatch):
    assert "quickstart" in dict(list_recipes())
    assert load_recipe("quickstart").name == "quickstart"
    monkeypatch.setenv("RESERVOIR_RECIPES", str(tmp_path))
    (tmp_path / "mine.yaml").write_text(TINY)
    (tmp_path / "broken.yaml").write_text("cells: [\n")
    listed = dict(list_recipes())
    assert listed["mine"].startswith("tiny-gpt2") and listed["broken"].startswith("(invalid: recipe broken.yaml")
    assert load_recipe("mine").name == "tiny"
    with pytest.raises(ReservoirError, match="unknown recipe 'nope'; expected a .yaml path or one of: broken, mine"):
        load_recipe("nope")


# ------------------------------------------------------------------ running


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny recipe run once into a results folder (stores in a private cache)."""
    root = tmp_path_factory.mktemp("recipe")
    (root / "tiny.yaml").write_text(TINY)
    res = run_recipe(root / "tiny.yaml", out=root / "results", device="cpu", progress=False,
                     cache_dir=root / "cache")
    return root, res


def _forbid(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("recomputed")

    for mod, name in ((reservoir.extract, "run"), (reservoir.readouts.run, "fit_linear"),
                      (reservoir.readouts.raw, "fit_raw"), (reservoir.training, "run"), (reservoir.training, "sweep"),
                      (reservoir.bench, "speedup")):
        monkeypatch.setattr(mod, name, boom)


def test_tiny_recipe_end_to_end(tiny_run):
    root, res = tiny_run
    out = root / "results"
    assert len(res["ran"]) == 5 and res["skipped"] == []
    assert (out / "recipe.yaml").read_text() == TINY
    for init in ("pretrained", "random"):
        run = out / f"fit-linear__bit-xor__tiny-gpt2__{init}__d2__seed0"
        for k in range(3):
            r = json.loads((run / f"logistic-layer{k}.json").read_text())
            assert r["config"]["layer"] == k and r["metrics"]["n_test"] == 32
            assert r["recipe"]["label"]["init"] == init
    t = json.loads((out / "train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0" / "results.json")
                   .read_text())
    assert t["metrics"]["steps"] == 20 and len(t["curve"]) == 2
    raw = json.loads((out / "fit-raw__digits__seed0" / "logistic.json").read_text())
    assert raw["metrics"]["test_accuracy"] > 0.8
    assert len(list((root / "cache").glob("*.zarr"))) == 2  # bench stores are temporary
    b = json.loads((out / "bench__bit-xor__tiny-gpt2__pretrained__d2__seed0" / "speedup.json").read_text())
    assert b["kind"] == "bench" and b["depth"] == 2
    o = b["output_only"]
    assert o["speedup"] == pytest.approx(o["live_epoch_s"] / o["cached_epoch_s"]) and o["speedup"] > 1


def test_rerun_skips_every_run(tiny_run, monkeypatch):
    root, first = tiny_run
    _forbid(monkeypatch)
    def results():  # every run's files (the recipe's copy and recipe-source.json say what this run was given)
        return {p: p.stat().st_mtime_ns for p in (root / "results").glob("*/*.json")}

    mtimes = results()
    res = run_recipe(root / "tiny.yaml", out=root / "results", device="cpu", progress=False,
                     cache_dir=root / "cache")
    assert res["ran"] == [] and sorted(res["skipped"]) == sorted(first["ran"])
    assert len(mtimes) > 5 and mtimes == results()


def test_force_redoes_a_run(tiny_run, tmp_path):
    root, _ = tiny_run
    data = yaml.safe_load(TINY)
    data["cells"], data["paper"] = [data["cells"][2]], []  # fit-raw only: cheap
    out = tmp_path / "forced"
    run_recipe(make(data), out=out, progress=False, cache_dir=root / "cache")
    assert run_recipe(make(data), out=out, progress=False, cache_dir=root / "cache")["ran"] == []
    assert run_recipe(make(data), out=out, force=True, progress=False, cache_dir=root / "cache")["ran"] == [
        "fit-raw__digits__seed0"]


def test_matching_store_is_reused_from_another_recipe(tiny_run, tmp_path, monkeypatch):
    root, _ = tiny_run
    data = yaml.safe_load(TINY)
    data["name"] = "other"
    data["cells"] = [{**data["cells"][0], "fit_layers": [2], "init": "random"}]  # same extraction settings
    data["paper"] = []
    monkeypatch.setattr(reservoir.extract, "run", lambda *a, **k: pytest.fail("extract called"))
    res = run_recipe(make(data), out=tmp_path / "other", device="cpu", progress=False, cache_dir=root / "cache")
    assert res["ran"] == ["fit-linear__bit-xor__tiny-gpt2__random__d2__seed0"]
    assert (tmp_path / "other" / res["ran"][0] / "logistic-layer2.json").is_file()
    assert yaml.safe_load((tmp_path / "other" / "recipe.yaml").read_text())["name"] == "other"


def test_store_with_other_provenance_is_refused(tiny_run, tmp_path):
    root, _ = tiny_run
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    a, b = sorted(cache.glob("*.zarr"))
    shutil.rmtree(a)
    shutil.copytree(b, a)  # a's path now holds the other init's store
    data = yaml.safe_load(TINY)
    data["cells"], data["paper"] = [data["cells"][0]], data["paper"][:1]
    with pytest.raises(ReservoirError, match=r"was written with init="):
        run_recipe(make(data), out=tmp_path / "x", progress=False, cache_dir=cache)
    from reservoir.store.lock import StoreLock

    with StoreLock(a):  # another process writing that store: --force does not delete it under the writer
        with pytest.raises(ReservoirError, match=f"{a} is being written by pid {os.getpid()}"):
            run_recipe(make(data), out=tmp_path / "x", progress=False, cache_dir=cache, force=True)
        assert (a / "zarr.json").is_file()


def test_report_gives_the_step_from_which_validation_stays_within_a_point_of_its_best(tiny_run, tmp_path):
    """Computed from each run's curve (whichever version wrote the file): a curve that reaches its best, leaves it
    and comes back converges at its return; one that ends off its best is said not to have."""
    import shutil

    shutil.copytree(tiny_run[0] / "results", tmp_path / "results")
    path = tmp_path / "results" / "train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0" / "results.json"
    saved = json.loads(path.read_text())
    cases = {(0.5, 0.995, 0.9, 1.0, 0.995): "within 1 point of best from step 40 |",
             (0.5, 1.0, 0.98): "last validation more than 1 point below its best |"}
    for accuracies, said in cases.items():
        saved["curve"] = [{"step": 10 * (i + 1), "train_loss": 0.1, "val_accuracy": a}
                          for i, a in enumerate(accuracies)]
        saved["metrics"]["steps_to_converge"] = 20  # what the first step within a point of the best would say
        path.write_text(json.dumps(saved))
        (line,) = [ln for ln in report(tmp_path / "results").markdown.splitlines() if "train fpt, lr 0.001" in ln]
        assert f"| 1 | {said}" in line


def test_report_table_and_plots(tiny_run):
    root, _ = tiny_run
    rep = report(root / "results")
    md = rep.markdown
    assert md.startswith("# tiny\n")
    assert ("| task | backbone | init | layer | setting | test accuracy | seeds | also measured | paper | "
            "paper source |") in md
    (line,) = [ln for ln in md.splitlines() if "| pretrained | 2 | linear readout" in ln]
    assert "| 42.5% | Made-up Table 99 |" in line
    (line,) = [ln for ln in md.splitlines() if "| random | 2 | linear readout" in ln]
    assert line.endswith("| — |  |")
    assert "train fpt, lr 0.001" in md and "raw inputs, logistic" in md
    t = json.loads((root / "results" / "train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0" /
                    "results.json").read_text())["metrics"]
    (line,) = [ln for ln in md.splitlines() if "train fpt, lr 0.001" in ln]  # both paper metrics, in METRICS order
    lo, hi = t["test_interval"]
    assert (f"| {100 * t['test_accuracy']:.2f}% [{100 * lo:.2f}, {100 * hi:.2f}] | 1 | within 1 point of best from "
            f"step {t['steps_to_converge']} | 97% · 500 steps | Made-up Table 2; Made-up Table 6 |") in line
    b = json.loads((root / "results" / "bench__bit-xor__tiny-gpt2__pretrained__d2__seed0" / "speedup.json")
                   .read_text())
    (line,) = [ln for ln in md.splitlines() if ln.startswith("| bit-xor | tiny-gpt2 | pretrained | 2 | cached vs")]
    assert f"| — | 1 | {b['output_only']['speedup']:.0f}x faster cached (output only); " in line
    assert line.endswith("| 1000x | Made-up Table 10 |")
    names = [p.name for p in rep.files]
    assert names == ["report.md", "depth.png", "curves.png"]
    for p in rep.files[1:]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
    assert (root / "results" / "report.md").read_text() == md


def test_report_marks_paired_differences(tiny_run):
    """Pretrained vs random at each layer and each layer vs the one below: paired intervals on shared test rows."""
    from reservoir.readouts.intervals import decode_rows, paired_difference

    root, _ = tiny_run
    rep = report(root / "results", plots=False)
    whats = sorted(c.what for c in rep.comparisons)
    assert whats == sorted(["pretrained − random"] * 3 + ["layer 1 − layer 0", "layer 2 − layer 1"] * 2)
    assert "## Paired differences" in rep.markdown
    run = root / "results" / "fit-linear__bit-xor__tiny-gpt2__{}__d2__seed0" / "logistic-layer2.json"
    a, b = (decode_rows(json.loads(Path(str(run).format(i)).read_text())["rows"]["test"]) for i in ("pretrained",
                                                                                                    "random"))
    d = paired_difference(a[0], b[0], a[1])
    (c,) = [c for c in rep.comparisons if c.what == "pretrained − random" and c.a.label["layer"] == 2]
    assert (c.difference.diff, c.difference.low, c.difference.high) == pytest.approx((d.diff, d.low, d.high))
    assert c.difference.p_value == pytest.approx(d.p_value)
    mark, p = "yes" if d.resolved else "no", "<0.0001" if d.p_value < 1e-4 else f"{d.p_value:.3g}"
    assert f"| pretrained − random | {100 * d.diff:+.2f} pts | [{100 * d.low:+.2f}, {100 * d.high:+.2f}] | {p} | " \
           f"{mark} |" in rep.markdown


def test_report_mean_and_std_over_seeds(tmp_path):
    data = {"name": "seeds", "cells": [{"kind": "fit-raw", "task": "digits", "seeds": [0, 1],
                                        "task_params": {"seed": 3}}]}
    out = tmp_path / "r"
    run_recipe(make(data), out=out, progress=False)
    import numpy as np

    from reservoir.readouts.intervals import accuracy_interval, encode_rows

    for s, acc in ((0, 0.9), (1, 0.8)):  # known values (each file kept in agreement): the table shows mean and std
        p = out / f"fit-raw__digits__seed{s}" / "logistic.json"
        r = json.loads(p.read_text())
        n = r["rows"]["test"]["rows"]
        correct = (np.arange(n) < round(acc * n)).astype(np.int64)  # exactly acc of the rows right
        r["metrics"].update(test_accuracy=acc, test_interval=list(accuracy_interval(correct)))
        r["rows"]["test"] = encode_rows(correct, 1)
        p.write_text(json.dumps(r))
    rep = report(out, plots=False)
    (row,) = rep.rows
    lo, hi = row.interval()  # of the mean over the two seeds' test rows (the recorded per-row results, pooled)
    assert f"| 85.00 ± 5.00% [{100 * lo:.2f}, {100 * hi:.2f}] | 2 |" in rep.markdown


def test_report_without_recipe_is_one_line(tmp_path):
    with pytest.raises(ReservoirError, match="expected a results folder with recipe.yaml"):
        report(tmp_path)
    with pytest.raises(ReservoirError, match="nowhere: expected a results folder .* found no such folder"):
        report(tmp_path / "nowhere")
    with pytest.raises(ReservoirError, match="expected an output name of at most"):
        report(tmp_path / ("x" * 300))  # was an OSError traceback (file name too long)


def test_paired_differences_show_a_rows_text_as_written():
    """The paired-differences table wrote a row's task tag and backbone (a model folder's name) as they were."""
    import numpy as np

    from reservoir.pairs import Comparison, Scored, markdown_pairs
    from reservoir.readouts.intervals import paired_difference

    label = {"kind": "fit-linear", "task": "bit-xor", "tag": "t", "backbone": "./m<i>[x](y)", "init": "pretrained",
             "layer": 1, "readout": "logistic"}
    a = Scored(label, "f", np.ones(20), 1)
    b = Scored({**label, "init": "random"}, "f", np.zeros(20), 1)
    md = markdown_pairs([Comparison(a, b, "pretrained - random", paired_difference(a.correct, b.correct))])
    assert "./m&lt;i&gt;\\[x\\](y)" in md and "<i>" not in md and "[x](y)" not in md


def test_training_everything_is_compared_with_fpt_only_at_the_same_steps_and_rate():
    import numpy as np

    from reservoir.pairs import Scored, compare

    label = {"kind": "train", "task": "bit-xor", "tag": None, "backbone": "gpt2", "init": "pretrained", "layer": "all",
             "readout": None, "lr": 1e-3}
    settings = {"kind": "train", "init": "pretrained", "lr": 1e-3, "steps": 1000, "batch_size": 16}
    rng = np.random.default_rng(0)

    def row(finetune, **changed):
        return Scored({**label, "finetune": finetune}, "f", rng.integers(0, 2, 50), 1,
                      {**settings, "finetune": finetune, **changed}, (0, 1))

    unpaired: list[str] = []
    assert [c.what for c in compare([row("all"), row("fpt")], unpaired)] == ["unfrozen − frozen (all − fpt)"]
    assert unpaired == []
    assert compare([row("all", steps=50), row("fpt")], unpaired) == []
    assert unpaired == ["unfrozen − frozen (all − fpt) (bit-xor: other settings: steps 50 against 1000)"]


def test_a_report_shows_the_recipes_text_as_written_and_missing_seeds(tmp_path, monkeypatch):
    """A description holding a table, HTML or an image link, and a tag or a source holding markup, were rendered:
    a recipe could put numbers in the report that no results file holds. A row short of its seeds said only how
    many it had."""
    import reservoir.recipes.state

    fake = "| bit-xor | minilm | pretrained | 6 | linear | 99.90% [99.80, 100.00] | 3 |"
    data = {"name": "text", "description": f"{fake}\n<script>alert(1)</script> ![x](http://example.com/b.png)",
            "cells": [{"kind": "fit-raw", "task": "digits", "seeds": [0, 1, 2], "tag": "a_b",
                       "task_params": {"seed": 3}}],
            "paper": [{"match": {"kind": "fit-raw"}, "value": 50, "source": "[click](javascript:x) <b>T</b>"}]}
    out = tmp_path / "r"
    run_recipe(make(data), out=out, progress=False)
    shutil.rmtree(out / "fit-raw__digits__a_b__seed2")  # as a kill during the third seed leaves it

    def read_data(*a, **k):
        raise AssertionError("the report read the run's data")

    monkeypatch.setattr(reservoir.recipes.state, "data_fingerprint", read_data)
    md = report(out, plots=False).markdown
    assert "\\| bit-xor \\| minilm" in md and "\n| bit-xor |" not in md  # the fake row is text, not a row
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "![x](" not in md and "!\\[x\\](http://example.com/b.png)" in md
    assert "\\[click\\](javascript:x) &lt;b&gt;T&lt;/b&gt;" in md and "<b>" not in md
    assert "| digits (a_b) |" in md and " | 2 of 3 | " in md


# ------------------------------------------------------------------ CLI


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_recipe_list_run_report(tiny_run, tmp_path):
    root, _ = tiny_run
    r = invoke("recipe", "list")
    assert r.exit_code == 0 and "quickstart" in r.output
    data = yaml.safe_load(TINY)
    data["cells"] = [{**data["cells"][0], "fit_layers": [0, 2], "init": "pretrained"}, data["cells"][2]]
    data["paper"] = data["paper"][:1]
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(data))
    r = invoke("recipe", "run", path, "--out", tmp_path / "out", "--cache", root / "cache", "--device", "cpu",
               "--quiet")
    assert r.exit_code == 0, r.output
    assert "2 run(s) done, 0 skipped" in r.output
    r = invoke("report", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "| 42.5% | Made-up Table 99 |" in r.output and "wrote " in r.output
    assert (tmp_path / "out" / "depth.png").is_file()


def test_cli_unknown_recipe_is_one_line_exit_2():
    r = invoke("recipe", "run", "no-such-recipe")
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: unknown recipe 'no-such-recipe'")
    assert "Traceback" not in r.output


def test_lr_sweep_cell_and_its_plot(tmp_path):
    data = {"name": "sweep", "defaults": {"backbone": "tiny-gpt2", "task_params": {"n_train": 48, "n_test": 16}},
            "cells": [{"kind": "train", "task": "bit-xor", "lr_sweep": "1e-3:1e-2:2", "seeds": [0], "steps": 6,
                       "eval_every": 3, "batch_size": 8}],
            "paper": [{"match": {"kind": "train", "lr": "sweep"}, "value": 99, "source": "Rothermel"}]}
    out = tmp_path / "sweep"
    res = run_recipe(make(data), out=out, device="cpu", progress=False)
    (rid,) = res["ran"]
    assert rid == "train__bit-xor__tiny-gpt2__pretrained__dall__fpt__sweep0.001-0.01x2__seeds0-0"
    sweep = json.loads((out / rid / "sweep.json").read_text())
    assert sweep["lrs"] == pytest.approx([1e-3, 1e-2]) and sweep["recipe"]["run"] == rid
    rep = report(out)
    assert "train fpt, lr sweep, best" in rep.markdown and "| 99% | Rothermel |" in rep.markdown
    assert [p.name for p in rep.files] == ["report.md", "lr_sweep.png"]
    lo, hi = sweep["metrics"]["test_interval"]  # the sweep's interval of its seeds' mean, shown beside the mean
    assert f"% [{100 * lo:.2f}, {100 * hi:.2f}] |" in rep.markdown


def test_lr_sweeps_of_two_inits_are_compared_on_their_chosen_runs_test_rows(tmp_path):
    data = {"name": "sweeps", "defaults": {"backbone": "tiny-gpt2", "task_params": {"n_train": 48, "n_test": 16}},
            "cells": [{"kind": "train", "task": "bit-xor", "lr_sweep": "1e-3:1e-2:2", "seeds": [0, 1], "steps": 4,
                       "eval_every": 2, "batch_size": 8, "init": ["pretrained", "random"],
                       "finetune": ["fpt", "all"]}]}
    out = tmp_path / "sweeps"
    run_recipe(make(data), out=out, device="cpu", progress=False)
    rep = report(out)
    for setting in ("fpt", "all"):
        assert f"| bit-xor | tiny-gpt2 | {setting}, lr sweep | all | pretrained − random |" in rep.markdown
    for init in ("pretrained", "random"):  # Rothermel et al.'s comparison: everything trained against FPT
        assert f"| bit-xor | tiny-gpt2 | {init}, lr sweep | all | unfrozen − frozen (all − fpt) |" in rep.markdown
    intervals = [json.loads((run / "sweep.json").read_text())["metrics"]["test_interval"]
                 for run in out.glob("train__*")]
    for lo, hi in intervals:  # each row's interval: its sweep's own, pooled over the seeds' test rows
        assert f"% [{100 * lo:.2f}, {100 * hi:.2f}] |" in rep.markdown
    for seed_run in out.glob("train__*/lr*-seed1"):  # without a seed's run the row keeps the sweep's interval
        shutil.rmtree(seed_run)
    rep = report(out)
    assert "pretrained − random" not in rep.markdown and "unfrozen − frozen" not in rep.markdown
    for lo, hi in intervals:
        assert f"% [{100 * lo:.2f}, {100 * hi:.2f}] |" in rep.markdown


def _tamper(path, field: str, value) -> dict:
    """Set the dotted ``field`` of the JSON file at ``path`` to ``value``; the edited object."""
    saved = json.loads(path.read_text())
    *parents, last = field.split(".")
    node = saved
    for key in parents:
        node = node[key]
    node[last] = value
    path.write_text(json.dumps(saved))
    return saved


@pytest.mark.parametrize("field, value, expected", [
    ("metrics.test_accuracies", [0.5, 0.5, 0.5], "expected metrics.test_accuracies to hold one accuracy per seed (2); "
                                                 "found 3"),
    ("metrics.test_accuracies", [], "expected metrics.test_accuracies to hold one accuracy per seed (2); found 0"),
    ("mean_val_by_lr", {"0.001": -0.5, "0.01": 0.5}, "expected mean_val_by_lr to map learning rates > 0 to "
                                                     "accuracies in [0, 1]; found"),
    ("mean_val_by_lr", {"0.001": 10 ** 400, "0.01": 0.5}, "expected mean_val_by_lr to hold finite numbers"),
    ("best_lr", 0.5, "expected best_lr to be one of the swept rates (0.001, 0.01); found 0.5"),
    ("best_lr", 10 ** 400, "expected best_lr to be a number in [0, 1e15]; found 1000000000000000000000000"),
    ("metrics.test_interval", [float("nan"), float("nan")], None),  # no interval, as results files may say
])
def test_a_sweeps_numbers_that_do_not_fit_together_are_one_line_in_the_report(tmp_path, field, value, expected):
    data = {"name": "sweep", "defaults": {"backbone": "tiny-gpt2", "task_params": {"n_train": 40, "n_test": 16}},
            "cells": [{"kind": "train", "task": "bit-xor", "lr_sweep": "1e-3:1e-2:2", "seeds": [0, 1], "steps": 2,
                       "eval_every": 2, "batch_size": 8}]}
    out = tmp_path / "sweep"
    run_recipe(make(data), out=out, device="cpu", progress=False)
    (path,) = out.glob("train__*/sweep.json")
    saved = _tamper(path, field, value)
    r = invoke("report", out, "--no-plots")
    if expected is None:
        assert r.exit_code == 0, r.output
        mean = 100 * saved["metrics"]["test_accuracy_mean"]
        assert f"| {mean:.2f} ± " in (out / "report.md").read_text()
    else:
        assert r.exit_code == 2 and expected in r.output and "Traceback" not in r.output, r.output
        assert str(path) in r.output


def test_a_raw_baseline_a_late_cell_cannot_fit_is_refused_before_the_first_run(tmp_path):
    sizes = {"n_train": 64, "n_test": 32}
    data = {"name": "raw", "cells": [{"kind": "fit-raw", "task": "bit-xor", "task_params": sizes},
                                     {"kind": "fit-raw", "task": "bit-memory", "task_params": sizes}]}
    with pytest.raises(ReservoirError, match=r"^cells\[1\]: a raw-input baseline needs a continuous task with one "
                                             r"output token; found 'bit-memory'"):
        run_recipe(make(data), out=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # nothing written: the first cell did not run


def test_groups_that_train_nothing_on_a_built_in_backbone_are_refused_before_the_first_run(tmp_path):
    cell = {"kind": "train", "task": "bit-xor", "backbone": "tiny-bert", "steps": 2, "eval_every": 2,
            "task_params": {"n_train": 64, "n_test": 32}}
    data = {"name": "groups", "cells": [cell, {**cell, "finetune": ["output", "recurrent"]}]}
    with pytest.raises(ReservoirError, match=r"^cells\[1\]: --finetune recurrent: expected parameters to train in "
                                             r"backbone 'tiny-bert' \(bert\); found the group recurrent empty"):
        run_recipe(make(data), out=tmp_path / "out", progress=False, device="cpu")
    assert not (tmp_path / "out").exists()  # the first cell did not run


def test_unknown_task_and_task_parameter_are_caught_at_load():
    assert "unknown task 'bit-xxor' in cells[0]; expected one of: bit-memory, bit-xor" in error_of(
        {"cells": [{"kind": "fit-raw", "task": "bit-xxor"}]})
    msg = error_of({"cells": [{"kind": "fit-raw", "task": "digits", "task_params": {"n_train": 5}}]})
    assert msg == ("recipe t.yaml: task_params in cells[0]: task 'digits' has no parameter 'n_train'; "
                   "expected one of: patch, seed, test_fraction")


def test_unfinished_store_is_resumed_not_reused(tiny_run, tmp_path, monkeypatch):
    import zarr

    root, _ = tiny_run
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    for p in cache.glob("*.zarr"):
        g = zarr.open_group(str(p), mode="r+")
        g.attrs["complete"] = False
        g["train/done"][0] = False
    calls = []
    real = reservoir.extract.run
    monkeypatch.setattr(reservoir.extract, "run", lambda cfg, **k: calls.append(cfg.out) or real(cfg, **k))
    data = yaml.safe_load(TINY)
    data["cells"], data["paper"] = [{**data["cells"][0], "fit_layers": [1]}], []
    res = run_recipe(make(data), out=tmp_path / "resumed", device="cpu", progress=False, cache_dir=cache)
    assert len(res["ran"]) == 2 and sorted(calls) == sorted(str(p) for p in cache.glob("*.zarr"))
    assert json.loads((tmp_path / "resumed" / res["ran"][0] / "logistic-layer1.json").read_text())["metrics"] == \
        json.loads((root / "results" / res["ran"][0] / "logistic-layer1.json").read_text())["metrics"]


def test_dry_run_lists_work_and_runs_nothing(tiny_run, tmp_path, monkeypatch):
    root, first = tiny_run
    _forbid(monkeypatch)
    r = invoke("recipe", "run", root / "tiny.yaml", "--out", root / "results", "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.output.count("done  ") == len(first["ran"]) and "0 to do: 0 optimizer steps" in r.output
    r = invoke("recipe", "run", root / "tiny.yaml", "--out", tmp_path / "fresh", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "todo  train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0  [20 steps, 160 sequences]" in r.output
    assert "5 run(s), 5 to do: 20 optimizer steps (160 training sequences), 3 extraction(s)" in r.output
    assert not (tmp_path / "fresh").exists()  # nothing written
    shutil.copytree(root / "results", tmp_path / "cut")
    result = next((tmp_path / "cut").glob("fit-linear__*/logistic-layer*.json"))
    result.write_text(result.read_text()[:100])  # a truncated results file: the run is to do, as run_recipe sees it
    r = invoke("recipe", "run", root / "tiny.yaml", "--out", tmp_path / "cut", "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"todo  {result.parent.name}" in r.output and r.output.count("done  ") == len(first["ran"]) - 1


def test_plan_counts_sweep_trainings():
    r = make({"cells": [{"kind": "train", "task": "bit-xor", "lr_sweep": "1e-4:1e-2:3", "seeds": [0, 1],
                         "steps": 10, "batch_size": 4}]})
    (row,) = plan(r, "/nonexistent")
    assert row["trainings"] == 6 and row["steps"] == 60 and row["sequences"] == 240 and not row["done"]


def test_cells_without_a_batch_size_take_each_commands_own_batching(tmp_path, monkeypatch):
    """A cell that names no batch size leaves it to the command: extraction the device's batching (a token budget
    on CUDA), training TrainConfig's default; a cell that names one passes it on."""
    import reservoir.extract as ex
    import reservoir.training as tr
    from reservoir.training import TrainConfig

    seen = []

    def stop(config, *args, **kwargs):
        seen.append(config)
        raise ReservoirError("stopped here")

    monkeypatch.setattr(ex, "run", stop)
    monkeypatch.setattr(tr, "run", stop)
    params = {"n_train": 20, "n_test": 10}
    for cell in ({"kind": "fit-linear", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 1},
                 {"kind": "train", "task": "bit-xor", "backbone": "tiny-gpt2", "steps": 2},
                 {"kind": "fit-linear", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 1, "batch_size": 8},
                 {"kind": "train", "task": "bit-xor", "backbone": "tiny-gpt2", "steps": 2, "batch_size": 8}):
        with pytest.raises(ReservoirError, match="stopped here"):
            run_recipe(make({"cells": [{**cell, "task_params": params}]}), tmp_path / f"out{len(seen)}",
                       cache_dir=tmp_path / "cache")
    assert [c.batch_size for c in seen] == [None, TrainConfig.batch_size, 8, 8]
    assert seen[1].lr == 1e-3  # the cell's default learning rate


@pytest.mark.parametrize("cell, expected", [
    ({"seeds": ["1_0"]}, "seeds in cells[0] must be a number, found '1_0'"),
    ({"seeds": ["4294967295.0000001"]}, "seeds in cells[0] must be an integer, found '4294967295.0000001'"),
    ({"steps": "nan"}, "steps in cells[0] must be a number, found 'nan'"),
    ({"finetune": ["input,output", "output,input"]},
     "finetune in cells[0]: expected each set of groups once; found 'output,input', which trains what 'input,output' "
     "does"),
    ({"finetune": "output,output"}, "finetune in cells[0]: --finetune: expected each group once; found 'output' twice"),
])
def test_numbers_and_groups_are_read_as_written(cell, expected):
    """A number in a string is read only as a number is written (not ``1_0``, not rounded to an integer); two
    spellings of one set of trained groups would run (and report) one training twice."""
    assert expected in error_of({"cells": [{"kind": "train", "task": "bit-xor", **cell}]})
    assert make({"cells": [{"kind": "train", "task": "bit-xor", "seeds": ["3"], "lr": "1e-3", "steps": "1e4"}]})


# ---------------------------------------------------------------- packaging
def test_shipped_recipes_are_found_from_any_working_directory(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RESERVOIR_RECIPES"}
    out = subprocess.run([sys.executable, "-m", "reservoir.cli", "recipe", "list"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout
    shipped = sorted(p.stem for p in (Path(__file__).parents[1] / "recipes").glob("*.yaml"))
    assert [line.split()[0] for line in out.splitlines()[:-1]] == shipped
    assert out.splitlines()[-1] == f"(from {(Path(__file__).parents[1] / 'recipes').resolve()})"


def test_wheel_carries_every_recipe(tmp_path):
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    root = Path(__file__).parents[1]
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the working tree
    shutil.copytree(root, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "cache", "results", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("reservoir-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    bundled = sorted(Path(n).name for n in names if n.startswith("reservoir/recipes/bundled/"))
    assert bundled == sorted(p.name for p in (root / "recipes").glob("*.yaml"))


# -- reruns of an edited recipe, copies, and values that gave tracebacks --------------------------------------------

RAW = {"name": "raw", "cells": [{"kind": "fit-raw", "task": "digits", "task_params": {"test_fraction": 0.2}}]}
RAW_ID = "fit-raw__digits__seed0"


def test_one_lr_sweep_written_two_ways_is_not_redone(tmp_path, monkeypatch):
    data = {"name": "sweep", "defaults": {"backbone": "tiny-gpt2", "task_params": {"n_train": 48, "n_test": 16}},
            "cells": [{"kind": "train", "task": "bit-xor", "lr_sweep": "1e-3:1e-2:2", "seeds": [0], "steps": 2,
                       "eval_every": 2, "batch_size": 8}]}
    out = tmp_path / "out"
    (rid,) = run_recipe(make(data), out=out, device="cpu", progress=False)["ran"]
    rewritten = {**data, "cells": [{**data["cells"][0], "lr_sweep": "0.001:0.01:2"}]}
    _forbid(monkeypatch)
    assert run_recipe(make(rewritten), out=out, device="cpu", progress=False)["skipped"] == [rid]
    other = {**data, "cells": [{**data["cells"][0], "lr_sweep": "1e-3:1e-2:3"}]}  # another sweep: another run
    assert [r.id for r in make(other).runs()] != [rid]


def test_an_edited_recipe_redoes_the_runs_whose_settings_changed(tmp_path, monkeypatch):
    """A run counts as done only when its results record this run with these settings: an edited task parameter
    redoes it (the dry run says why), an unchanged recipe skips it."""
    out = tmp_path / "out"
    assert run_recipe(make(RAW), out=out, progress=False)["ran"] == [RAW_ID]
    edited = {**RAW, "cells": [{**RAW["cells"][0], "task_params": {"test_fraction": 0.5}}]}
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(edited))
    r = invoke("recipe", "run", tmp_path / "raw.yaml", "--out", out, "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"redo  {RAW_ID}  [readout on raw inputs] (computed with task_params.test_fraction=0.2, this run has " \
           "0.5)" in r.output
    assert run_recipe(make(edited), out=out, progress=False)["ran"] == [RAW_ID]
    result = json.loads((out / RAW_ID / "logistic.json").read_text())
    assert result["config"]["task_params"]["test_fraction"] == 0.5
    assert result["recipe"]["settings"]["task_params"] == {"test_fraction": 0.5}
    _forbid(monkeypatch)
    assert run_recipe(make(edited), out=out, progress=False)["skipped"] == [RAW_ID]


def test_another_runs_results_are_redone_and_older_results_of_this_run_are_kept(tmp_path, monkeypatch):
    out = tmp_path / "out"
    run_recipe(make(RAW), out=out, progress=False)
    path = out / RAW_ID / "logistic.json"
    result = json.loads(path.read_text())
    del result["recipe"]["settings"]  # as an earlier version wrote it: the run id alone identifies it
    path.write_text(json.dumps(result))
    with monkeypatch.context() as m:
        _forbid(m)
        assert run_recipe(make(RAW), out=out, progress=False)["skipped"] == [RAW_ID]
    result["recipe"]["run"] = "fit-raw__digits__other__seed0"  # a file of another run in this run's place
    path.write_text(json.dumps(result))
    assert plan(make(RAW), out)[0]["state"] == "foreign"
    assert run_recipe(make(RAW), out=out, progress=False)["ran"] == [RAW_ID]
    assert json.loads(path.read_text())["recipe"]["run"] == RAW_ID


@pytest.mark.parametrize("text", ["---\ncells:\n  - {kind: fit-raw, task: digits}\n",
                                  "{cells: [{kind: fit-raw, task: digits}]}\n",
                                  "%YAML 1.1\n---\ncells: [{kind: fit-raw, task: digits}]\n"])
def test_the_copy_of_an_unnamed_recipe_is_a_valid_recipe(tmp_path, text):
    (tmp_path / "plain.yaml").write_text(text)
    out = tmp_path / "out"
    run_recipe(tmp_path / "plain.yaml", out=out, progress=False)
    copy = load_recipe(out / "recipe.yaml")
    assert copy.name == "plain" and [r.id for r in copy.runs()] == ["fit-raw__digits__seed0"]
    assert invoke("report", out, "--no-plots").exit_code == 0


def test_force_with_a_device_that_is_not_there_removes_nothing(tmp_path):
    out = tmp_path / "out"
    run_recipe(make(RAW), out=out, progress=False)
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(RAW))
    r = invoke("recipe", "run", tmp_path / "raw.yaml", "--out", out, "--force", "--device", "foo")
    assert r.exit_code == 2 and "unknown device 'foo'" in r.output
    assert (out / RAW_ID / "logistic.json").is_file()


def test_force_replaces_a_linked_run_folder_by_the_run_not_what_it_links_to(tmp_path):
    out = tmp_path / "out"
    run_recipe(make(RAW), out=out, progress=False)
    kept = out / "kept"
    (out / RAW_ID).rename(kept)
    (out / RAW_ID).symlink_to(kept)
    assert run_recipe(make(RAW), out=out, force=True, progress=False)["ran"] == [RAW_ID]
    assert not (out / RAW_ID).is_symlink() and (kept / "logistic.json").is_file()


def test_a_results_folder_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(RAW))
    (tmp_path / "afile").write_text("x")
    for extra in ([], ["--dry-run"]):
        r = invoke("recipe", "run", tmp_path / "raw.yaml", "--out", tmp_path / "afile", *extra)
        assert r.exit_code == 2 and "expected a results folder, found a file" in r.output, r.output


def test_dry_run_with_force_redoes_finished_runs(tmp_path):
    out = tmp_path / "out"
    run_recipe(make(RAW), out=out, progress=False)
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(RAW))
    r = invoke("recipe", "run", tmp_path / "raw.yaml", "--out", out, "--dry-run", "--force")
    assert r.exit_code == 0 and f"redo  {RAW_ID}" in r.output and "1 to do" in r.output, r.output


TRAIN = {"kind": "train", "task": "bit-xor", "backbone": "tiny-gpt2"}


@pytest.mark.parametrize("data, message", [
    ({"cells": [{**TRAIN, "seeds": 10**400}]}, "seeds in cells[0] must be an integer in 0..4294967295, found 1000"),
    ({"cells": [{**TRAIN, "lr": 10**400}]}, "lr in cells[0] must be a finite number, found an integer of 401 digits"),
    ({"cells": [{**TRAIN, "layers": 10**400}]}, "layers in cells[0] must be a depth of at most 1,000, found a number "
                                                "of 401 digits"),
    ({"cells": [{"kind": "fit-linear", "task": "bit-xor", "layers": 10**8}]},
     "layers in cells[0] must be a depth of at most 1,000, found 100000000"),
    ({"cells": [{**TRAIN, "backbone": None}]}, "backbone in cells[0]: expected a value, found null"),
    ({"cells": [TRAIN], "paper": 5}, "paper must be a list of entries, found 5"),
    ({"defaults": {"task_params": {"n_train": 8}}, "cells": [{**TRAIN, "task": {"a": 1}}]},
     "task in cells[0]: expected a task name or a list of them, found {'a': 1}"),
    ({"cells": [{"kind": "bench", "task": "bit-xor", "layers": 2, "max_live_rows": None}]},
     "max_live_rows in cells[0] must be a number, found null"),
    ({"cells": [{**TRAIN, "eval_every": None}]}, "eval_every in cells[0] must be a number, found null"),
    ({"cells": [{**TRAIN, "dropout": None}]}, "dropout in cells[0] must be a number, found null"),
    ({"cells": [{"kind": "fit-linear", "task": "bit-xor", "layers": 2, "fit_layers": []}]},
     "fit_layers in cells[0]: expected 'all' or at least one layer, found []"),
    ({"cells": [{**TRAIN, "steps": 5, "epochs": 2}]}, "cells[0]: expected steps or epochs, found both"),
    ({"defaults": {"steps": 5, "epochs": 2}, "cells": [TRAIN]},
     "cells[0] (with defaults): expected steps or epochs, found both"),
    ({"cells": [{**TRAIN, "seeds": list(range(100)), "lr": [10.0 ** -k for k in range(1, 11)], "backbone": "gpt2",
                 "layers": list(range(11))}]}, "expected at most 10,000 runs, found a grid of 11,000"),
    ({"cells": [{**TRAIN, "tag": "t" * 300}]}, "tag in cells[0]: expected at most 64 characters"),
    ({"name": "n" * 65, "cells": [TRAIN]}, "name: expected at most 64 characters"),
    ({"cells": [{"kind": "fit-raw", "task": "data", "task_params": {"path": 5}}]},
     "task_params in cells[0]: task 'data': expected path as non-empty text, found 5 (int)"),
    ({"cells": [{"kind": "fit-raw", "task": "mnist", "task_params": {"data_dir": 123}}]},
     "task_params in cells[0]: task 'mnist': expected data_dir as non-empty text, found 123 (int)"),
    ({"cells": [{"kind": "fit-raw", "task": "mnist", "task_params": {"download": True, "data_dir": "/anywhere"}}]},
     "task_params in cells[0]: expected download only into the data cache (leave data_dir out)"),
    ({"cells": [{**TRAIN, "seeds": [0, 0]}]}, "two of its values give one id (a value listed twice"),
    ({"cells": [{**TRAIN, "lr": [0.001, 0.0010000001]}]}, "or lrs equal to 6 digits)"),
])
def test_values_that_gave_tracebacks_are_one_line(data, message):
    assert message in error_of(data)


@pytest.mark.parametrize("data, message", [
    # YAML 1.1 reads these as false, 8, 31 and 750: two tags (no, off) named one folder "False"
    ({"cells": [{**TRAIN, "tag": False}]}, "tag in cells[0]: expected text; found False, which YAML read as a bool "
                                           "(quote it to keep it as written)"),
    ({"cells": [{**TRAIN, "tag": 8}]}, "tag in cells[0]: expected text; found 8, which YAML read as a int"),
    ({"name": 31, "cells": [TRAIN]}, "name: expected text; found 31"),
    ({"name": False, "cells": [TRAIN]}, "name: expected text; found False"),
    # a misspelled default was dropped, and every run made with the task's default sizes
    ({"defaults": {"task_params": {"n_trian": 64}}, "cells": [{"kind": "fit-raw", "task": "bit-xor"}]},
     "task_params in defaults: no task has a parameter 'n_trian'; expected one of:"),
    # refused only when its cell ran, after the cells before it
    ({"cells": [{**TRAIN, "backbone": "lstm-3x8"}]}, "init in cells[0]: backbone 'lstm-3x8' has no pretrained weights; "
                                                     "expected init: random"),
    ({"cells": [{**TRAIN, "backbone": "lstm-3.5x8", "init": "random"}]},
     "backbone in cells[0]: bad LSTM backbone name"),
    ({"cells": [{"kind": "fit-linear", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 9}]},
     "layers in cells[0] must be within 1..2 for backbone 'tiny-gpt2' (2 blocks), found 9"),
    ({"cells": [{**TRAIN, "backbone": ["gpt2", "minilm"], "layers": [4, 7]}]},
     "layers in cells[0] must be within 1..6 for backbone 'minilm' (6 blocks), found 7"),
    ({"cells": [{"kind": "bench", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 2, "split_layer": 2}]},
     "split_layer in cells[0] must be within 0..1 (below the depth 2), found 2"),
    # a few kilobytes asking for millions of results files took minutes and gigabytes to check
    ({"cells": [{"kind": "fit-linear", "task": "bit-xor", "backbone": "gpt2", "layers": 1000,
                 "readout": ["logistic", "ridge"], "seeds": list(range(100))}]},
     "expected at most 100,000 results files (runs x readouts x fitted layers), found a grid of 200,200"),
])
def test_recipes_that_failed_late_or_silently_are_refused_when_read(data, message):
    assert message in error_of(data)
    for ok in ({"cells": [{**TRAIN, "tag": "no"}]}, {"name": "0x1F", "cells": [TRAIN]},
               {"cells": [{**TRAIN, "backbone": "lstm-3x8", "init": "random", "layers": 3}]},
               {"defaults": {"task_params": {"n_train": 64}}, "cells": [{"kind": "fit-raw", "task": "digits"}]}):
        make(ok)  # quoted, in range, or a default some task takes


def test_a_cells_own_length_replaces_the_defaults(tmp_path):
    recipe = make({"defaults": {"steps": 1000}, "cells": [{**TRAIN, "epochs": 3}, {**TRAIN, "tag": "b"}]})
    first, second = (r.cell for r in recipe.runs())
    assert (first.steps, first.epochs) == (None, 3.0) and (second.steps, second.epochs) == (1000, None)


def test_unreadable_yaml_numbers_and_user_paths_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "big.yaml").write_text(f"cells: [{{kind: train, task: bit-xor, seeds: {'9' * 5000}}}]\n")
    with pytest.raises(ReservoirError, match="expected YAML values Python reads"):
        load_recipe(tmp_path / "big.yaml")
    monkeypatch.setenv("RESERVOIR_RECIPES", str(tmp_path))
    assert dict(list_recipes())["big"].startswith("(invalid: recipe big.yaml: expected YAML values")
    recipe = make({"cells": [{**TRAIN, "backbone": "~nosuchuser-here/x"},
                             {"kind": "fit-raw", "task": "data", "task_params": {"path": "~nosuchuser-here/x.npz"}}]})
    assert [r.id.split("__")[2] for r in recipe.runs()][0] == "x"
    assert "longer than a folder name may be" in error_of({"cells": [{**TRAIN, "backbone": "b" * 300}]})


def test_report_shows_results_of_other_settings_as_not_run(tmp_path):
    """An edited recipe's copy describes the new settings before the rerun computes them: until then its old results
    are not shown as the new recipe's."""
    out = tmp_path / "out"
    run_recipe(make(RAW), out=out, progress=False)
    assert "not run" not in report(out, plots=False).markdown
    edited = {**RAW, "cells": [{**RAW["cells"][0], "task_params": {"test_fraction": 0.5}}]}
    (out / "recipe.yaml").write_text(yaml.safe_dump(edited))
    md = report(out, plots=False).markdown
    assert "| digits | — | — | — | raw inputs, logistic | not run |" in md
    assert ("**Not current:** 1 results file(s) hold another run's results, or this recipe's with other settings"
            in md and "First: fit-raw__digits__seed0/logistic.json (computed with task_params.test_fraction=0.2, "
            "this run has 0.5)." in md)


@pytest.mark.parametrize("cells, differs", [
    ([{"kind": "fit-linear", "task": "bit-xor", "layers": 2}, {"kind": "fit-linear", "task": "bit-xor", "layers": 1}],
     "layers=2, this run has 1"),
    ([{**TRAIN, "lr_sweep": "1e-3:1e-2:2"}, {**TRAIN, "lr_sweep": "1e-5:1e-4:2", "seeds": [1]}],
     "lr_sweep='1e-3:1e-2:2', this run has '1e-5:1e-4:2'"),
    ([{"kind": "fit-linear", "task": "bit-xor", "layers": 2},
      {"kind": "fit-linear", "task": "bit-xor", "layers": 2, "fit_layers": [1], "dtype": "float32", "seeds": [1]}],
     "dtype='float16', this run has 'float32'"),
])
def test_runs_of_other_settings_may_not_feed_one_report_row(cells, differs):
    """Two runs that differ in more than their seed would be averaged in one row as if they were seeds."""
    message = error_of({"cells": cells})
    assert "cells[0] and cells[1] feed one report row" in message and differs in message
    assert message.endswith("give one a 'tag'")
    assert make({"cells": [cells[0], {**cells[1], "tag": "other"}]})  # a tag keeps them apart
    assert make({"cells": [{**cells[0], "seeds": [0]}, {**cells[0], "seeds": [1]}]})  # seeds of one row: fine


def test_head_step_time_with_a_batch_larger_than_its_rows():
    from reservoir.bench.speedup import head_step_ms

    assert head_step_ms(n_dim=8, n_classes=2, batch_size=64, n_rows=16) > 0


def test_a_data_file_beside_the_recipe_is_recorded_as_written(tmp_path):
    """A data file's path is resolved from the recipe's folder to run, and recorded as the recipe wrote it: the
    report (which reads the results folder's copy) and a moved project both see the runs as current."""
    import numpy as np

    project = tmp_path / "project"
    project.mkdir()
    rng = np.random.default_rng(0)
    np.savez(project / "toy.npz", train_inputs=rng.normal(size=(40, 3, 2)).astype(np.float32),
             train_labels=np.arange(40) % 2, test_inputs=rng.normal(size=(20, 3, 2)).astype(np.float32),
             test_labels=np.arange(20) % 2)
    (project / "toy.yaml").write_text("cells: [{kind: fit-raw, task: data, task_params: {path: toy.npz}}]\n")
    run_recipe(project / "toy.yaml", out=project / "out", progress=False)
    md = report(project / "out", plots=False).markdown
    assert "not run" not in md and "Not current" not in md
    shutil.copytree(project, tmp_path / "moved")
    rows = plan(tmp_path / "moved" / "toy.yaml", tmp_path / "moved" / "out")
    assert [r["state"] for r in rows] == ["done"]


def test_fitting_other_layers_of_a_store_keeps_each_layers_results(tmp_path):
    cell = {"kind": "fit-linear", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 1,
            "task_params": {"n_train": 32, "n_test": 16}}
    out = tmp_path / "out"
    run_recipe(make({"cells": [cell]}), out=out, progress=False, cache_dir=tmp_path / "c")
    assert [r["state"] for r in plan(make({"cells": [{**cell, "fit_layers": [1]}]}), out)] == ["done"]
    assert make({"cells": [cell, {**cell, "fit_layers": [1], "seeds": [1, 2]}]})  # one row: seeds 0, 1, 2


def test_the_copy_of_a_recipe_whose_name_is_null_is_named(tmp_path):
    (tmp_path / "myrec.yaml").write_text("name:\ncells: [{kind: fit-raw, task: digits}]\n")
    run_recipe(tmp_path / "myrec.yaml", out=tmp_path / "out", progress=False)
    assert load_recipe(tmp_path / "out" / "recipe.yaml").name == "myrec"
    recipe = make({"name": "py", "cells": [{"kind": "fit-raw", "task": "digits"}], "description": Path("x")})
    run_recipe(recipe, out=tmp_path / "py", progress=False)  # built in Python, with a Path in it
    assert load_recipe(tmp_path / "py" / "recipe.yaml").description == "x"


def test_dry_run_with_force_shows_runs_never_run_as_todo(tmp_path):
    (tmp_path / "raw.yaml").write_text(yaml.safe_dump(RAW))
    r = invoke("recipe", "run", tmp_path / "raw.yaml", "--out", tmp_path / "fresh", "--dry-run", "--force")
    assert r.exit_code == 0 and f"todo  {RAW_ID}" in r.output, r.output


def test_pairs_of_other_seed_counts_are_named_and_figures_of_rows_gone_are_removed(tmp_path):
    cell = {"kind": "fit-linear", "task": "bit-xor", "backbone": "tiny-gpt2", "layers": 1, "fit_layers": [1],
            "task_params": {"n_train": 32, "n_test": 16}}
    out = tmp_path / "out"
    run_recipe(make({"cells": [{**cell, "seeds": [0, 1]}, {**cell, "init": "random"}]}), out=out, progress=False,
               cache_dir=tmp_path / "c")
    md = report(out).markdown
    assert "## Paired differences" not in md
    assert "**Not compared:** 1 pair(s) or row(s)" in md
    assert "- pretrained − random (bit-xor: other seeds: 0,1 against 0)" in md
    seed1 = out / "fit-linear__bit-xor__tiny-gpt2__pretrained__d1__seed1" / "logistic-layer1.json"
    kept = json.loads(seed1.read_text())
    del kept["rows"]  # as a results file written before per-row results were kept
    seed1.write_text(json.dumps(kept))
    md = report(out).markdown
    assert "- fit-linear bit-xor tiny-gpt2 pretrained layer 1 logistic (1 of its 2 seeds kept which test rows they " \
           "got right)" in md and "| 2 |" in md  # the row itself is shown, with both seeds
    for name in ("curves.png", "depth.png"):  # figures of an earlier render: no train rows now, one layer fitted
        (out / name).write_bytes(b"an earlier render's figure")
    assert report(out).files == [out / "report.md"]
    assert not (out / "curves.png").exists() and not (out / "depth.png").exists()


def test_rows_are_paired_only_when_their_runs_agree_in_every_setting_and_seed(tmp_path):
    """Labels say task, backbone, init, layer and readout; runs also differ in their store's depth and dtype, and
    their seeds. A pair differing in any of those besides what it compares is named, not compared."""
    cell = {"kind": "fit-linear", "task": "bit-xor", "backbone": "tiny-gpt2", "task_params": {"n_train": 32,
                                                                                            "n_test": 16}}
    cells = [{**cell, "layers": 2, "fit_layers": [1, 2]},  # layers 1 and 2 from a depth-2 store
             {**cell, "layers": 1, "fit_layers": [0]},  # layer 0 from a depth-1 store: no step up to layer 1
             {**cell, "layers": 2, "fit_layers": [1, 2], "init": "random", "dtype": "float32"},  # other dtype
             {**cell, "layers": 1, "fit_layers": [0], "init": "random", "seeds": [1]}]  # other seed
    out = tmp_path / "out"
    run_recipe(make({"cells": cells}), out=out, progress=False, cache_dir=tmp_path / "c")
    md = report(out).markdown
    table = md.split("## Paired differences")[1].split("**Not compared:**")[0]
    assert "| pretrained, logistic | — | layer 2 − layer 1 |" in table  # the one store's own step
    assert "| random, logistic | — | layer 2 − layer 1 |" in table
    assert "layer 1 − layer 0" not in table and "pretrained − random" not in table
    assert "**Not compared:** 3 pair(s) or row(s)" in md
    for line in ("- pretrained − random (bit-xor: other settings: dtype 'float16' against 'float32')",
                 "- pretrained − random (bit-xor: other seeds: 0 against 1)"):
        assert line in md
    assert md.count("- pretrained − random (bit-xor: other settings: dtype") == 2  # layers 1 and 2
    lines = {legend: [r.label["layer"] for r in rs]
             for legend, rs in depth_lines(report(out).rows, "bit-xor").items()}  # depth.png: a line per store
    assert lines == {"tiny-gpt2 pretrained, store depth 2, dtype float16": [1, 2],
                     "tiny-gpt2 pretrained, store depth 1, dtype float16": [0],
                     "tiny-gpt2 random, store depth 2, dtype float32": [1, 2],
                     "tiny-gpt2 random, store depth 1, dtype float16": [0]}


def _interrupted_at_the_second_validation(monkeypatch, run) -> None:
    """``run()`` stopped (as by Ctrl-C) when its training reaches its second validation, after one checkpoint."""
    import reservoir.training.loop as loop

    evaluate, calls = loop.evaluate, []

    def stopped_at_the_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return evaluate(*a, **kw)

    monkeypatch.setattr(loop, "evaluate", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(loop, "evaluate", evaluate)


def test_an_interrupted_run_of_a_cell_edited_since_is_begun_again_not_resumed(tmp_path, monkeypatch):
    """A train run stopped before its results, then its cell edited (steps): the folder's checkpoint is of the old
    settings, which training refuses to resume; the run is redone in a cleared folder. The same settings resume."""
    cell = {"kind": "train", "task": "bit-xor", "backbone": "tiny-gpt2", "finetune": "fpt", "steps": 6,
            "eval_every": 2, "task_params": {"n_train": 40, "n_test": 20, "n_bits": 2}}
    out = tmp_path / "out"
    _interrupted_at_the_second_validation(monkeypatch, lambda: run_recipe(make({"cells": [cell]}), out=out,
                                                                          progress=False, device="cpu"))
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    assert (folder / "last.pt").is_file() and not (folder / "results.json").exists()
    assert [(r["state"], r["why"]) for r in plan(make({"cells": [cell]}), out)] == [("todo", "")]  # resumable
    edited = make({"cells": [{**cell, "steps": 4}]})
    ((state, why),) = [(r["state"], r["why"]) for r in plan(edited, out)]
    assert state == "stale" and why.startswith("an interrupted run with steps")
    assert run_recipe(edited, out=out, progress=False, device="cpu")["ran"] == [folder.name]
    assert json.loads((folder / "results.json").read_text())["metrics"]["steps"] == 4


@pytest.mark.parametrize("name, field, value, expected", [
    ("train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0/results.json", "metrics.test_interval", [0.9],
     "expected an interval [low, high] of accuracies in [0, 1], found metrics.test_interval = [0.9]"),
    ("train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0/results.json", "metrics.test_interval", "x",
     "expected an interval [low, high] of accuracies in [0, 1], found metrics.test_interval = 'x'"),
    ("train__bit-xor__tiny-gpt2__pretrained__dall__fpt__lr0.001__seed0/results.json", "metrics.test_interval",
     [0.9, 0.1], "expected an interval [low, high] of accuracies in [0, 1], found metrics.test_interval = [0.9, 0.1]"),
    ("bench__bit-xor__tiny-gpt2__pretrained__d2__seed0/speedup.json", "output_only.speedup", -7,
     "expected output_only.speedup to be a number in [0, 1e15]; found -7"),
])
def test_a_tampered_results_file_is_one_line_in_the_report_and_redone_by_the_run(tiny_run, tmp_path, name, field,
                                                                                  value, expected):
    shutil.copytree(tiny_run[0] / "results", tmp_path / "results")
    path = tmp_path / "results" / name
    _tamper(path, field, value)
    r = invoke("report", tmp_path / "results", "--no-plots")
    assert r.exit_code == 2 and expected in r.output and "Traceback" not in r.output, r.output
    if "interval" in field:  # what the run reads as not done: computed again
        assert [p["state"] for p in plan(tmp_path / "results" / "recipe.yaml", tmp_path / "results")
                if p["id"] == name.split("/")[0]] == ["todo"]


def test_paper_values_and_descriptions_that_no_report_can_print_are_refused():
    train = {"cells": [{"kind": "train", "task": "bit-xor"}]}
    percent = "expected a percentage in [0, 100] for test_accuracy, found"
    for value, metric, expected in ((".nan", "test_accuracy", f"{percent} nan"),
                                    (-40, "test_accuracy", f"{percent} -40"),
                                    (-5, "steps_to_converge", "expected a number of steps in [0, 1e12]")):
        entry = {"match": {"kind": "train"}, "value": float("nan") if value == ".nan" else value, "metric": metric}
        assert f"paper[0].value: {expected}" in error_of({**train, "paper": [entry]})
    entry = {"match": {"kind": "train"}, "value": 50, "source": "Table 1\n| x | y |"}
    assert "paper[0].source: expected one line of text, found control characters" in error_of(
        {**train, "paper": [entry]})
    assert "description: expected text, found control characters" in error_of(
        {**train, "description": "owned \x1b]0;title\x07"})
    assert make({**train, "description": "two\nlines\tand a tab"}).description == "two\nlines\tand a tab"


def test_an_interrupted_run_of_a_moved_project_is_begun_again(tmp_path, monkeypatch):
    """A train checkpoint names its data file's absolute path; after the project moves, the interrupted run cannot
    resume there (the checkpoint would refuse), so it is begun again rather than refused."""
    import numpy as np

    project = tmp_path / "p"
    project.mkdir()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3, 2)).astype(np.float32)
    np.savez(project / "d.npz", train_inputs=x[:40], train_labels=(x[:40, 0, 0] > 0).astype(np.int64),
             test_inputs=x[40:], test_labels=(x[40:, 0, 0] > 0).astype(np.int64))
    (project / "r.yaml").write_text("cells: [{kind: train, task: data, task_params: {path: d.npz}, backbone: "
                                    "tiny-gpt2, steps: 4, eval_every: 2}]\n")
    _interrupted_at_the_second_validation(monkeypatch, lambda: run_recipe(project / "r.yaml", out=project / "out",
                                                                          progress=False, device="cpu"))
    shutil.move(project, tmp_path / "moved")
    ((state, why),) = [(r["state"], r["why"]) for r in plan(tmp_path / "moved" / "r.yaml", tmp_path / "moved" / "out")]
    assert (state, why) == ("stale", "an interrupted run begun with its data at another path")
    assert len(run_recipe(tmp_path / "moved" / "r.yaml", out=tmp_path / "moved" / "out", progress=False,
                          device="cpu")["ran"]) == 1


def test_a_recipe_run_whose_folder_lock_file_is_removed_stops_before_its_next_run(tmp_path, monkeypatch):
    from reservoir.store.lock import lock_path

    out = tmp_path / "out"
    cells = [{"kind": "fit-raw", "task": "digits", "seeds": [0, 1]}]  # two runs
    runner = reservoir.readouts.raw
    fit_raw, calls = runner.fit_raw, []

    def then_removed(*a, **k):  # the lock file removed by hand while the first run computes
        calls.append(1)
        if len(calls) == 1:
            lock_path(out).unlink()
        return fit_raw(*a, **k)

    monkeypatch.setattr(runner, "fit_raw", then_removed)
    with pytest.raises(ReservoirError, match=r"expected this writer's lock file .*out\.lock in place; found it "
                                             "removed or replaced while writing"):
        run_recipe(make({"cells": cells}), out=out, progress=False)
    assert len(calls) == 1  # the second run never started
    monkeypatch.setattr(runner, "fit_raw", fit_raw)
    assert len(run_recipe(make({"cells": cells}), out=out, progress=False)["skipped"]) == 1  # the first one's results


def test_a_model_folder_saved_over_is_not_read_from_its_old_store(tmp_path):
    """The store cache is keyed by the backbone's name: after a model folder was saved over, its old store was
    reused, even with --force. Its weights' hash is compared: the store is refused in one line, and --force
    extracts it again."""
    import torch
    from transformers import GPT2Config, GPT2Model

    def save(seed):
        torch.manual_seed(seed)
        GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64, vocab_size=8)).save_pretrained(
            tmp_path / "model")

    save(1)
    data = {"name": "folder", "cells": [{"kind": "fit-linear", "task": "bit-xor", "backbone": str(tmp_path / "model"),
                                          "layers": 1, "task_params": {"n_train": 64, "n_test": 32}}]}
    run_recipe(make(data), out=tmp_path / "r", device="cpu", progress=False, cache_dir=tmp_path / "cache")
    (store,) = (tmp_path / "cache").glob("*.zarr")
    before = FeatureStore.open(store).attrs["backbone"]["weights_sha256"]
    save(2)
    with pytest.raises(ReservoirError, match=r"was written with backbone.weights_sha256='[0-9a-f]{64}', this run has "):
        store_for(make(data).runs()[0], tmp_path / "cache", "cpu")  # (the finished run is skipped without --force)
    run_recipe(make(data), out=tmp_path / "r", device="cpu", progress=False, cache_dir=tmp_path / "cache", force=True)
    assert FeatureStore.open(store).attrs["backbone"]["weights_sha256"] != before


def test_paths_a_recipe_run_cannot_use_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    """An empty --out wrote into the working folder; a --cache inside a store (or a file) was refused only after
    the results folder was written (and --force had removed results); a model folder that is not there failed
    only when its cell ran, after the cells before it."""
    import zarr

    monkeypatch.chdir(tmp_path)
    linear = {"kind": "fit-linear", "task": "bit-xor", "backbone": "./no-model", "layers": 1}
    data = {"name": "paths", "cells": [{"kind": "fit-raw", "task": "digits"}, linear]}
    with pytest.raises(ReservoirError, match="expected a results folder \\(--out\\); found an empty path"):
        run_recipe(make(data), out="", progress=False)
    with pytest.raises(ReservoirError, match="backbone './no-model' in cells\\[1\\]: expected a model folder "
                                             "\\(config.json and weights\\), found no such folder"):
        run_recipe(make(data), out="r", progress=False)
    with pytest.raises(ReservoirError, match="backbone './no-model' in cells\\[1\\]"):
        plan(make(data), out="r")  # the dry run says so too
    data["cells"][1]["backbone"] = "tiny-gpt2"
    zarr.open_group("s.zarr", mode="w")
    (tmp_path / "file.txt").write_text("")
    for cache, why in (("s.zarr/cache", "expected a store cache \\(--cache\\) outside any feature store; found it "
                                        "inside the store .*s.zarr"),
                       ("file.txt", "file.txt: expected a store cache folder \\(--cache\\); found a file")):
        with pytest.raises(ReservoirError, match=why):
            run_recipe(make(data), out="r", progress=False, cache_dir=cache)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "s.zarr"]
