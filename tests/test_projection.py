"""The input map's init: orthogonal (scaled by the gain) or normal (N(0, 1) entries, an embedding table's), chosen
with --projection in extraction, training and recipes, recorded in the store and held by every reader of it."""

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from reservoir.backbones import input_projection, load_backbone
from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig
from reservoir.extract import run as run_extract
from reservoir.store import FeatureStore
from reservoir.training import TrainConfig, build, build_from_store, config_for_store

PARAMS = {"n_train": 40, "n_test": 20, "max_length": 40}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_normal_draws_a_seeded_standard_normal_table_and_records_no_gain():
    table = input_projection("normal", 15, 768, seed=3)
    assert torch.equal(table.weight, input_projection("normal", 15, 768, seed=3).weight)
    assert not torch.equal(table.weight, input_projection("normal", 15, 768, seed=4).weight)
    w = table.weight.detach().double()
    assert abs(float(w.mean())) < 0.03 and abs(float(w.std()) - 1.0) < 0.03 and not table.bias.any()
    # a token's vector has the norm of an N(0, 1) row of 768 entries (about 27.7), not the orthogonal map's gain
    assert 24 < float(w[:, 0].norm()) < 31
    assert abs(float(input_projection("orthogonal", 15, 768).weight.detach()[:, 0].norm()) - 1.41) < 1e-4
    bb = load_backbone("tiny-gpt2", d_in=15, projection="normal", seed=5)
    assert bb.projection_info == {"kind": "normal", "gain": None, "seed": 5, "d_in": 15}
    assert torch.equal(bb.input.weight, input_projection("normal", 15, bb.n_dim, seed=5).weight)


@pytest.mark.parametrize("call, expected", [
    (lambda: load_backbone("tiny-gpt2", d_in=15, projection="normal", projection_gain=2.0),
     "--gain applies to the orthogonal projection; --projection normal draws N(0, 1) entries and takes none: "
     "expected the default gain, found 2.0"),
    (lambda: ExtractConfig(task="listops", projection="embedding"),
     "--projection must be orthogonal or normal, found 'embedding'"),
    (lambda: TrainConfig(task="listops", projection="normal", projection_gain=1.0),
     "--gain applies to the orthogonal projection"),
    (lambda: input_projection("uniform", 3, 4), "unknown projection 'uniform'; expected one of: orthogonal, normal"),
])
def test_a_bad_projection_is_one_line(call, expected):
    with pytest.raises(ReservoirError) as err:
        call()
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_extract_stores_the_normal_table_and_keeps_it_apart_from_the_orthogonal_store(tmp_path):
    out = tmp_path / "n.zarr"
    args = ["extract", "--task", "listops", *[a for k, v in PARAMS.items() for a in ("-p", f"{k}={v}")],
            "--backbone", "tiny-gpt2", "--layers", 1, "--quiet", "--out", out]
    r = invoke(*args, "--projection", "normal")
    assert r.exit_code == 0, r.output
    bb = load_backbone("tiny-gpt2", d_in=15, projection="normal", depth=1)
    with FeatureStore.open(out) as st:
        assert st.attrs["projection"]["kind"] == "normal" and st.attrs["projection"]["gain"] is None
        np.testing.assert_array_equal(st.projection_weight(), bb.input.weight.detach().numpy().T)
    info = invoke("info", out)
    assert "projection normal d_in=15 gain=None seed=0" in info.output, info.output
    again = invoke(*args)  # the same store asked for with the orthogonal map: other features, refused
    assert again.exit_code == 2 and "projection.kind='normal', this run has 'orthogonal'" in again.output, again.output
    bad = invoke(*args[:-1], tmp_path / "g.zarr", "--projection", "normal", "--gain", 2)
    assert bad.exit_code == 2 and "--gain applies to the orthogonal projection" in bad.output
    assert not (tmp_path / "g.zarr").exists()


def test_training_builds_the_map_it_names_and_a_store_run_the_stores(tmp_path):
    config = TrainConfig(task="listops", backbone="tiny-gpt2", task_params=PARAMS, projection="normal", layers=2)
    _, model, _ = build(config)
    assert model.backbone.projection_info["kind"] == "normal"
    assert torch.equal(model.backbone.input.weight, input_projection("normal", 15, 32, seed=0).weight)
    assert config.key()["projection"] == "normal"
    assert "projection" not in TrainConfig(task="listops").key()  # as every run recorded before the choice
    split = run_extract(ExtractConfig(task="listops", backbone="tiny-gpt2", layers=2, full_seq_layer=1,
                                      projection="normal", task_params=PARAMS, out=str(tmp_path / "s.zarr")),
                        progress=False)
    from_store = config_for_store(split, backbone="tiny-gpt2", finetune="output")
    assert from_store.projection == "normal"
    model, data = build_from_store(from_store)
    with data, FeatureStore.open(split) as st:
        np.testing.assert_array_equal(model.backbone.input.weight.detach().numpy().T, st.projection_weight())
    with pytest.raises(ReservoirError, match=r"--projection with --from-store .*: expected the store's 'normal'"):
        config_for_store(split, backbone="tiny-gpt2", finetune="output", projection="orthogonal")


def test_a_recipe_cell_names_its_projection_and_its_store_and_settings_keep_it(tmp_path):
    from reservoir.recipes import Recipe
    from reservoir.recipes.runner import store_for

    cells = [{"kind": "fit-linear", "task": "listops", "task_params": PARAMS, "backbone": "tiny-gpt2", "layers": 1,
              **extra} for extra in ({}, {"projection": "normal", "tag": "normal"})]
    runs = Recipe.from_dict({"cells": cells}, "p.yaml").runs()
    assert "projection" not in runs[0].settings() and runs[1].settings()["projection"] == "normal"
    stores = [store_for(run, tmp_path, "cpu") for run in runs]
    assert stores[0] != stores[1]
    kinds = []
    for path in stores:
        with FeatureStore.open(path) as st:
            kinds.append(st.attrs["projection"]["kind"])
    assert kinds == ["orthogonal", "normal"]
    assert store_for(runs[1], tmp_path, "cpu") == stores[1]  # found again and reused
    with pytest.raises(ReservoirError, match=r"unknown projection .uniform. in cells\[0\]; expected one of: "
                                             r"orthogonal, normal"):
        Recipe.from_dict({"cells": [{**cells[0], "projection": "uniform"}]}, "p.yaml")
