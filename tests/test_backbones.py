"""Backbones: equality with Hugging Face's own forward, padding invariance, early exit, inits."""

import re
from pathlib import Path

import pytest
import torch

from reservoir.backbones import ARCHS, last_token_index, load_backbone, orthogonal_projection
from reservoir.backbones.load import _load_hf, weights_sha256
from reservoir.backbones.names import TINY_CONFIGS
from reservoir.errors import ReservoirError

TINY = ["tiny-gpt2", "tiny-bert"]


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_features_equal_hf_output_hidden_states(name, attn):
    """Layer k at the last real token == HF's own forward with output_hidden_states."""
    bb = load_backbone(name, d_in=3, attn_implementation=attn)
    hf, _, _ = _load_hf(name, "pretrained", 0, None, attn)
    hf.eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 11, 3, generator=g)
    lengths = torch.tensor([11, 6, 1, 9])
    with torch.no_grad():
        feats = bb.features(x, lengths, [0, 1, 2])  # (4, 3, 1, 32)
        mask = (torch.arange(11)[None] < lengths[:, None]).long()
        ref = hf(inputs_embeds=bb.project(x), attention_mask=mask, output_hidden_states=True).hidden_states
    rows = torch.arange(4)
    for k in range(3):
        ours = feats[:, k, 0]
        if k == 2 and bb.final_norm is not None:  # HF's last entry comes after ln_f
            ours = bb.final_norm(ours)
        torch.testing.assert_close(ours, ref[k][rows, lengths - 1], atol=1e-5, rtol=1e-5)


def test_minilm_matches_hf():
    bb = load_backbone("minilm", d_in=15, depth=6)
    hf, _, _ = _load_hf("minilm", "pretrained", 0, None, "sdpa")
    hf.eval()
    ids = torch.randint(0, 15, (2, 20), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([20, 13])
    with torch.no_grad():
        feats = bb.features(ids, lengths, list(range(7)))
        mask = (torch.arange(20)[None] < lengths[:, None]).long()
        ref = hf(inputs_embeds=bb.project(ids), attention_mask=mask, output_hidden_states=True).hidden_states
    for k in range(7):
        torch.testing.assert_close(feats[:, k, 0], ref[k][torch.arange(2), lengths - 1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_padding_does_not_move_features(name):
    """The same sequence padded to different lengths gives the same features."""
    bb = load_backbone(name, d_in=15)
    seq = torch.randint(0, 15, (1, 7), generator=torch.Generator().manual_seed(2))
    outs = []
    for pad in (0, 3, 25):
        x = torch.cat([seq, torch.randint(0, 15, (1, pad))], dim=1)
        other = torch.randint(0, 15, (1, 7 + pad))  # a second row so batches differ too
        with torch.no_grad():
            f = bb.features(torch.cat([x, other]), torch.tensor([7, 7 + pad]), [0, 1, 2], n_out_tokens=3)
        outs.append(f[0])
    for f in outs[1:]:
        torch.testing.assert_close(f, outs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_early_exit_never_runs_upper_blocks(name, monkeypatch):
    """depth=1 keeps one block; features for layer 0 only run no block at all."""
    calls = []
    bb = load_backbone(name, d_in=1, depth=1)
    assert len(bb.blocks) == 1
    hf, _, _ = _load_hf(name, "pretrained", 0, None, "sdpa")
    full = load_backbone(name, d_in=1)
    for i, block in enumerate(full.blocks):
        block.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
    x, lengths = torch.zeros(2, 5, 1), torch.tensor([5, 3])
    with torch.no_grad():
        full.features(x, lengths, [0, 1])
    assert calls == [0]
    calls.clear()
    with torch.no_grad():
        full.features(x, lengths, [0])
    assert calls == []
    # the truncated model gives the same layer-1 features as the full one
    with torch.no_grad():
        torch.testing.assert_close(bb.features(x, lengths, [1]), full.features(x, lengths, [1]))


def test_inits_differ_and_are_seeded():
    pre = load_backbone("tiny-gpt2", d_in=1)
    rnd = load_backbone("tiny-gpt2", d_in=1, init="random", seed=5)
    rnd2 = load_backbone("tiny-gpt2", d_in=1, init="random", seed=5)
    st = load_backbone("tiny-gpt2", d_in=1, init="stats", seed=5)
    assert rnd.info.weights_sha256 == rnd2.info.weights_sha256
    assert len({pre.info.weights_sha256, rnd.info.weights_sha256, st.info.weights_sha256}) == 3
    # stats init keeps each tensor's mean and std (up to sampling noise)
    p_pre = dict(pre.blocks.named_parameters())["0.mlp.c_fc.weight"]
    p_st = dict(st.blocks.named_parameters())["0.mlp.c_fc.weight"]
    assert abs(p_st.mean() - p_pre.mean()) < 0.01
    assert abs(p_st.std() / p_pre.std() - 1) < 0.05
    assert not torch.equal(p_st, p_pre)


def test_backbone_is_frozen_and_in_eval():
    bb = load_backbone("tiny-bert", d_in=4)
    assert not bb.training
    assert not any(p.requires_grad for p in bb.parameters())


def test_orthogonal_projection():
    proj = orthogonal_projection(15, 32, gain=1.41, seed=3)
    W = proj.weight.detach()  # (32, 15)
    torch.testing.assert_close(W.t() @ W, 1.41**2 * torch.eye(15), atol=1e-4, rtol=1e-4)
    assert torch.equal(W, orthogonal_projection(15, 32, gain=1.41, seed=3).weight)
    assert not torch.equal(W, orthogonal_projection(15, 32, gain=1.41, seed=4).weight)
    assert torch.count_nonzero(proj.bias) == 0


def test_one_hot_tokens_equal_dense_one_hot():
    bb = load_backbone("tiny-gpt2", d_in=15)
    ids = torch.randint(0, 15, (3, 8))
    dense = torch.nn.functional.one_hot(ids, 15).float()
    torch.testing.assert_close(bb.project(ids), bb.project(dense))


def test_bad_names_are_one_line_errors(tmp_path):
    with pytest.raises(ReservoirError, match="unknown init"):
        load_backbone("tiny-gpt2", d_in=1, init="warm")
    with pytest.raises(ReservoirError, match="depth 3 is beyond"):
        load_backbone("tiny-gpt2", d_in=1, depth=3)
    with pytest.raises(ReservoirError) as err:
        load_backbone(str(tmp_path / "no-model"), d_in=1)
    assert "\n" not in str(err.value)


def test_a_model_folder_under_home_loads_by_tilde(tmp_path, monkeypatch):
    """``~/model`` names the folder under the home directory (a recipe or a quoted flag keeps the ``~``)."""
    hf, _, _ = _load_hf("tiny-gpt2", "pretrained", 0, None, "sdpa")
    hf.save_pretrained(tmp_path / "model")
    monkeypatch.setenv("HOME", str(tmp_path))
    bb = load_backbone("~/model", d_in=3)
    assert bb.info.weights_sha256 == load_backbone(str(tmp_path / "model"), d_in=3).info.weights_sha256
    with pytest.raises(ReservoirError, match="no such folder"):
        load_backbone("~/absent", d_in=3)


def test_unknown_architecture_names_supported(tmp_path):
    from transformers import T5Config

    T5Config(num_layers=1, d_model=8, num_heads=1, d_kv=8, d_ff=8).save_pretrained(tmp_path)
    with pytest.raises(ReservoirError, match="unsupported architecture 't5'.*bert.*gpt2"):
        load_backbone(str(tmp_path), d_in=1, init="random")


@pytest.mark.parametrize("name", sorted(n for n in TINY_CONFIGS))
def test_arch_table_paths_exist(name):
    from reservoir.backbones.arch import get_module

    hf, _, _ = _load_hf(name, "pretrained", 0, None, "sdpa")
    facts = ARCHS[hf.config.model_type]
    for path in facts.kept:
        assert get_module(hf, path) is not None
    block = get_module(hf, facts.blocks)[0]
    for sub in facts.attention + facts.feedforward:
        assert isinstance(get_module(block, sub), torch.nn.Module)
    assert 1 <= facts.max_positions(hf.config) < 10**7


def test_last_token_index_reads_the_last_real_positions():
    h = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(0))  # (B, L, D)
    lengths = torch.tensor([6, 2, 4])
    rows, idx = last_token_index(lengths)
    assert rows.shape == (3, 1) and idx.tolist() == [[5], [1], [3]]
    torch.testing.assert_close(h[rows, idx][:, 0], torch.stack([h[0, 5], h[1, 1], h[2, 3]]))
    rows, idx = last_token_index(lengths, 2)
    assert idx.tolist() == [[4, 5], [0, 1], [2, 3]]  # in order, ending at the last real token
    assert h[rows, idx].shape == (3, 2, 4)


@pytest.mark.parametrize("name,init,n_layer", [("tiny-gpt2", "pretrained", 2), ("tiny-bert", "stats", 2),
                                               ("lstm-3x16", "random", 3)])  # fmt: skip
def test_every_backbone_is_finished_the_same_way(name, init, n_layer):
    """HF models and the LSTM: depth kept, all frozen in eval, seeded frozen projection, provenance recorded."""
    bb = load_backbone(name, init=init, depth=1, d_in=5, seed=7, projection_gain=2.0, projection_seed=9)
    assert bb.depth == 1 and len(bb.blocks) == 1 and bb.info.depth == 1 and bb.info.n_layer == n_layer
    assert not bb.training and not any(m.training for m in bb.modules())
    assert not any(p.requires_grad for p in bb.parameters())
    assert torch.equal(bb.input.weight, orthogonal_projection(5, bb.n_dim, 2.0, 9).weight)
    assert (bb.info.init, bb.info.seed) == (init, 7)
    full = load_backbone(name, init=init, d_in=5, seed=7)
    assert full.depth == n_layer and torch.equal(full.input.weight, orthogonal_projection(5, bb.n_dim, 1.41, 7).weight)
    # the hash covers every block, kept or not: the same weights give the same hash at any depth
    assert full.info.weights_sha256 == bb.info.weights_sha256
    assert len(bb.info.weights_sha256) == 64
    with pytest.raises(ReservoirError) as err:
        load_backbone(name, init=init, depth=n_layer + 1, d_in=5)
    assert str(err.value) == (f"depth {n_layer + 1} is beyond backbone {name!r}: expected 0..{n_layer} layers, "
                              f"found {n_layer + 1}")


def test_weights_hash_is_of_the_loaded_weights():
    hf, _, _ = _load_hf("tiny-gpt2", "pretrained", 0, None, "sdpa")
    assert load_backbone("tiny-gpt2", d_in=1).info.weights_sha256 == weights_sha256(hf)


def _saved(tmp_path, name="model", base="tiny-gpt2", **config_changes):
    """A tiny model's pretrained draw (GPT-2 unless ``base`` names another) saved as a model folder (safetensors),
    its config.json edited."""
    import json

    hf, _, _ = _load_hf(base, "pretrained", 0, None, "sdpa")
    folder = tmp_path / name
    hf.save_pretrained(folder)
    if config_changes:
        config = json.loads((folder / "config.json").read_text())
        config.update(config_changes)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_folder_saved_in_half_precision_loads_in_float32(tmp_path, dtype):
    """Most hub checkpoints name bf16 or fp16 in config.json; transformers would load them so (and a float32 forward
    then failed): weights are float32 whatever the config says, equal to the same folder without the entry."""
    import json

    plain = _saved(tmp_path, "plain")
    half = _saved(tmp_path, "half", dtype=dtype)
    config = json.loads((half / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype")  # the older key as well
    (tmp_path / "older").mkdir()
    for f in plain.iterdir():
        (tmp_path / "older" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "older" / "config.json").write_text(json.dumps(config))
    want = load_backbone(str(plain), d_in=3)
    for folder in (half, tmp_path / "older"):
        for init in ("pretrained", "random"):
            bb = load_backbone(str(folder), d_in=3, init=init)
            assert {p.dtype for p in bb.parameters()} == {torch.float32}
        bb = load_backbone(str(folder), d_in=3)
        assert bb.info.weights_sha256 == want.info.weights_sha256
        x = torch.randn(2, 5, 3)
        torch.testing.assert_close(bb.embed(x), want.embed(x), rtol=0, atol=0)


def test_model_folders_that_would_read_outside_or_unpickle_are_refused(tmp_path):
    import json
    import shutil

    good = _saved(tmp_path, "good")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(good / "model.safetensors", outside / "w.safetensors")

    def variant(name):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        return folder

    linked = variant("linked")  # weights linked from outside the folder
    (linked / "model.safetensors").unlink()
    (linked / "model.safetensors").symlink_to(outside / "w.safetensors")
    config_linked = variant("config_linked")
    shutil.copy(good / "config.json", outside / "config.json")
    (config_linked / "config.json").unlink()
    (config_linked / "config.json").symlink_to(outside / "config.json")
    cases = {linked: "expected its weights inside the model folder", config_linked: "expected config.json inside"}
    for shard, name in (("../outside/w.safetensors", "dotdot"), (str(outside / "w.safetensors"), "absolute")):
        folder = variant(name)
        (folder / "model.safetensors").unlink()
        keys = json.loads((good / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
            (good / "model.safetensors").read_bytes()[:8], "little")])
        index = {"metadata": {}, "weight_map": {k: shard for k in keys if k != "__metadata__"}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        cases[folder] = "expected the weights index to name files inside the model folder"
    pickled = variant("pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    cases[pickled] = "expected weights in safetensors files (model.safetensors); found only pickled weights"
    for folder, message in cases.items():
        with pytest.raises(ReservoirError, match=re.escape(message)):
            load_backbone(str(folder), d_in=3)
    # a Hugging Face cache snapshot links into its repository's blobs: that is its layout, and loads
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for f in good.iterdir():
        shutil.copy(f, repo / "blobs" / f.name)
        (snapshot / f.name).symlink_to(Path("../../blobs") / f.name)
    same = load_backbone(str(good), d_in=3).info.weights_sha256
    assert load_backbone(str(snapshot), d_in=3).info.weights_sha256 == same
    (tmp_path / "snapshot_link").symlink_to(snapshot)  # a link to the snapshot folder: the same layout
    assert load_backbone(str(tmp_path / "snapshot_link"), d_in=3).info.weights_sha256 == same


def test_sizes_and_values_no_model_can_have_are_refused_before_anything_is_built(tmp_path):
    import time

    from safetensors.torch import load_file, save_file

    t0 = time.perf_counter()
    with pytest.raises(ReservoirError, match=r"expected 1\.\.1,024 layers \(num_hidden_layers\); found 10000000"):
        load_backbone(str(_saved(tmp_path, "deep", n_layer=10**7)), d_in=3)
    with pytest.raises(ReservoirError, match=r"expected 1\.\.1,024 layers \(num_hidden_layers\); found 100000000"):
        load_backbone("lstm-100000000x4", d_in=3, init="random")
    assert time.perf_counter() - t0 < 60  # (building 10^7 blocks on the meta device grew without bound)
    inf = _saved(tmp_path, "inf")
    weights = load_file(inf / "model.safetensors")
    weights["ln_f.weight"] = torch.full_like(weights["ln_f.weight"], float("inf"))
    save_file(weights, inf / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ReservoirError, match="expected finite weights; found NaN or infinite values in ln_f.weight"):
        load_backbone(str(inf), d_in=3)
    for name in ("", "  "):
        with pytest.raises(ReservoirError, match="expected a backbone: a built-in name, a model folder or a hub id"):
            load_backbone(name, d_in=3)


@pytest.mark.parametrize("choice", ["flex_attention", "kernels-community/flash-attn", "flash_attention_2"])
def test_a_folder_cannot_choose_its_attention_code(tmp_path, choice):
    """config.json's ``_attn_implementation`` won over the one asked: flex attention crashed the process on
    reservoir's masks, and a hub kernel name has transformers fetch compiled code. The asked one is built."""
    plain = load_backbone(str(_saved(tmp_path, "plain")), d_in=3)
    for attn in ("sdpa", "eager"):
        bb = load_backbone(str(_saved(tmp_path, "chosen", _attn_implementation=choice)), d_in=3,
                           attn_implementation=attn)
        assert bb.attn_implementation == attn and bb.config._attn_implementation == attn  # before any forward
        x, lengths = torch.randn(2, 5, 3), torch.tensor([5, 3])
        torch.testing.assert_close(bb.features(x, lengths, [2]), plain.features(x, lengths, [2]), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("base, changes, why", [
    ("tiny-gpt2", {"n_head": -2}, r"expected a positive number of attention heads \(num_attention_heads\); found -2"),
    ("tiny-llama", {"num_key_value_heads": 3}, r"expected a number of key/value heads \(num_key_value_heads\) "
                                               r"dividing the 2 attention heads; found 3"),
    ("tiny-llama", {"num_key_value_heads": -1}, r"dividing the 2 attention heads; found -1"),
    ("tiny-mistral", {"sliding_window": 0}, r"expected a sliding_window of at least 1 position \(or null: none\); "
                                            r"found 0"),
    ("tiny-mistral", {"sliding_window": -1}, r"found -1"),
    ("tiny-bert", {"is_decoder": True}, r"\(bert\): expected an encoder config \(is_decoder false\); found "
                                        r"is_decoder true"),
    ("tiny-roberta", {"is_decoder": True}, r"\(roberta\): expected an encoder config"),
])
def test_configs_hugging_face_builds_but_cannot_run_as_asked_are_refused(tmp_path, base, changes, why):
    """A negative head count built and failed at the first forward with a traceback; a window of 0 ran full
    attention and one of -1 hid every key (stores marked complete); a BERT with is_decoder runs causally in
    Hugging Face, so bidirectional features from it were another model's. Each is one line at load."""
    folder = _saved(tmp_path, base=base, **changes)
    for init in ("pretrained", "random"):
        with pytest.raises(ReservoirError, match=why):
            load_backbone(str(folder), d_in=3, init=init)
    assert load_backbone(str(_saved(tmp_path, "plain", base=base)), d_in=3).depth == 2


def test_only_weights_the_reservoir_runs_need_be_finite(tmp_path):
    """The token embedding (replaced by the projection) and blocks above the depth never run: a NaN there is no
    reason to refuse the folder; one in a kept block is."""
    from safetensors.torch import load_file, save_file

    folder = _saved(tmp_path)
    weights = load_file(folder / "model.safetensors")
    weights["wte.weight"][0, 0] = float("inf")
    weights["h.1.mlp.c_fc.weight"][0, 0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    bb = load_backbone(str(folder), d_in=3, depth=1)
    assert bool(torch.isfinite(bb.features(torch.randn(2, 4, 3), torch.tensor([4, 2]), [1])).all())
    with pytest.raises(ReservoirError, match="expected finite weights; found NaN or infinite values in "
                                             "h.1.mlp.c_fc.weight"):
        load_backbone(str(folder), d_in=3)


def test_float32_is_asked_for_by_the_keyword_the_installed_transformers_reads(monkeypatch):
    """``dtype`` from transformers 4.56 (``torch_dtype`` is deprecated there); before it, ``dtype`` reached the
    model's constructor as an unknown argument, so ``torch_dtype``."""
    import transformers

    from reservoir.backbones.load import _float32

    for version, key in (("4.50.3", "torch_dtype"), ("4.56.0", "dtype"), ("5.24.0", "dtype"), ("4.56.0.dev0", "dtype")):
        monkeypatch.setattr(transformers, "__version__", version)
        assert _float32() == {key: torch.float32}
