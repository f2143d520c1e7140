"""The LSTM baseline backbone (Lu et al. Table 1/3): features, padding, early exit, freeze groups,
extraction + linear readout, live training, split-point stores, errors."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from reservoir.backbones import backbone_names, load_backbone
from reservoir.backbones.lstm import LSTMBackbone
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig
from reservoir.extract import run as run_extract
from reservoir.training import ReservoirClassifier, TrainConfig, run
from reservoir.training.freeze import GROUPS, PRESETS, apply_freeze, parse_groups


def _manual_lstm(lstm: torch.nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """One sequence ``(L, D)`` through a one-layer LSTM by its cell equations, zero initial state."""
    W_ih, W_hh = lstm.weight_ih_l0, lstm.weight_hh_l0
    b = lstm.bias_ih_l0 + lstm.bias_hh_l0
    h = c = torch.zeros(lstm.hidden_size)
    out = []
    for t in range(x.shape[0]):
        i, f, g, o = (W_ih @ x[t] + W_hh @ h + b).chunk(4)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        out.append(h)
    return torch.stack(out)  # (L, D)


def test_load_shapes_info_frozen_and_seeded():
    bb = load_backbone("lstm-2x16", init="random", d_in=3)
    assert isinstance(bb, LSTMBackbone) and bb.arch is None
    assert (bb.depth, bb.n_dim, len(bb.blocks)) == (2, 16, 2)
    assert bb.positions is None and bb.embed_norm is None
    assert isinstance(bb.final_norm, torch.nn.LayerNorm)
    i = bb.info
    assert (i.id, i.family, i.init, i.n_layer, i.n_dim, i.depth) == ("lstm-2x16", "lstm", "random", 2, 16, 2)
    assert i.max_positions >= 1_000_000 and i.final_norm_eps == 1e-5
    assert not bb.training and not any(p.requires_grad for p in bb.parameters())
    assert not any(isinstance(m, torch.nn.Dropout) for m in bb.modules())
    W = bb.input.weight.detach()  # (16, 3), orthogonal columns scaled by the gain
    torch.testing.assert_close(W.t() @ W, 1.41**2 * torch.eye(3), atol=1e-4, rtol=1e-4)
    # seeded: same seed, same weights; the hash covers the whole stack, whatever the depth
    assert load_backbone("lstm-2x16", init="random", d_in=3).info.weights_sha256 == i.weights_sha256
    assert load_backbone("lstm-2x16", init="random", d_in=3, depth=1).info.weights_sha256 == i.weights_sha256
    assert load_backbone("lstm-2x16", init="random", d_in=3, seed=1).info.weights_sha256 != i.weights_sha256
    assert "lstm-3x768" in backbone_names()
    x, lengths = torch.randn(4, 9, 3), torch.tensor([9, 5, 1, 7])
    with torch.no_grad():
        assert bb.features(x, lengths, [0, 1, 2], n_out_tokens=1).shape == (4, 3, 1, 16)
        feats, full = bb.features(x, lengths, [2], full_seq_layer=1)
    assert feats.shape == (4, 1, 1, 16) and full.shape == (4, 9, 16)
    ids = torch.randint(0, 3, (2, 6))
    torch.testing.assert_close(bb.project(ids), bb.project(F.one_hot(ids, 3).float()))


def test_features_equal_manual_computation():
    """Layer k at the last real token == projection, then h + LSTM(LayerNorm(h)) per block, by hand."""
    bb = load_backbone("lstm-2x16", init="random", d_in=3, seed=4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 3, generator=g)
    lengths = torch.tensor([8, 5, 2])
    with torch.no_grad():
        feats = bb.features(x, lengths, [0, 1, 2], n_out_tokens=2)  # (3, 3, 2, 16)
        for b in range(3):
            n = int(lengths[b])
            h = x[b, :n] @ bb.input.weight.t() + bb.input.bias  # (n, 16)
            ref = [h]
            for block in bb.blocks:
                ln = F.layer_norm(h, (16,), block.norm.weight, block.norm.bias, 1e-5)
                h = h + _manual_lstm(block.lstm, ln)
                ref.append(h)
            for k in range(3):
                torch.testing.assert_close(feats[b, k], ref[k][n - 2 : n], atol=1e-5, rtol=1e-5)


def test_padding_does_not_move_features():
    bb = load_backbone("lstm-2x16", init="random", d_in=15)
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


def test_early_exit_never_runs_upper_blocks():
    calls = []
    full = load_backbone("lstm-3x8", init="random", d_in=1)
    for i, block in enumerate(full.blocks):
        block.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
        block.lstm.register_forward_hook(lambda m, a, o, i=i: calls.append(f"lstm{i}"))
    x, lengths = torch.randn(2, 5, 1), torch.tensor([5, 3])
    with torch.no_grad():
        full.features(x, lengths, [0, 1])
    assert calls == ["lstm0", 0]
    calls.clear()
    with torch.no_grad():
        full.features(x, lengths, [0])
    assert calls == []
    short = load_backbone("lstm-3x8", init="random", d_in=1, depth=1)
    assert len(short.blocks) == 1
    with torch.no_grad():
        torch.testing.assert_close(short.features(x, lengths, [1]), full.features(x, lengths, [1]))


def test_freeze_groups_counted_by_hand():
    D, L, d_in, C = 16, 2, 4, 10
    lstm = 4 * (D * D + D * D + D + D)  # weight_ih, weight_hh, bias_ih, bias_hh of one layer
    bb = load_backbone("lstm-2x16", init="random", d_in=d_in)
    model = ReservoirClassifier(bb, 1, 1, C)
    c = apply_freeze(bb, model.head, parse_groups("input,layernorm,output"))  # Table 3's scheme
    assert c["input"] == d_in * D + D
    assert c["layernorm"] == L * 2 * D + 2 * D  # one norm per block + the final norm
    assert c["recurrent"] == L * lstm == sum(p.numel() for b in bb.blocks for p in b.lstm.parameters())
    assert c["positions"] == c["attention"] == c["feedforward"] == 0
    assert c["output"] == D * C + C
    assert c["trainable"] == c["input"] + c["layernorm"] + c["output"]
    assert c["total"] == sum(c[g] for g in GROUPS) == sum(p.numel() for p in model.parameters())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"backbone.input.weight", "backbone.input.bias", "head.weight", "head.bias",
                         "backbone.final_norm.weight", "backbone.final_norm.bias",
                         *(f"backbone.blocks.{k}.norm.{w}" for k in range(L) for w in ("weight", "bias"))}
    assert "recurrent" in PRESETS["all"]
    c = apply_freeze(bb, model.head, parse_groups("all"))
    assert c["trainable"] == c["total"] and all(p.requires_grad for p in model.parameters())
    c = apply_freeze(bb, model.head, parse_groups("recurrent"))
    assert c["trainable"] == L * lstm
    # split point at layer 1: only block 2's norm + LSTM and the final norm are the backbone's to train
    c = apply_freeze(bb, model.head, ("layernorm", "recurrent", "output"), first_block=1)
    assert c["input"] == 0 and c["layernorm"] == 2 * D + 2 * D and c["recurrent"] == lstm
    assert c["trainable"] == 2 * D + 2 * D + lstm + D * C + C
    assert not any(p.requires_grad for p in bb.blocks[0].parameters())
    with pytest.raises(ReservoirError, match="below the split layer"):
        apply_freeze(bb, model.head, ("input", "output"), first_block=1)
    # transformers have an empty recurrent group
    gpt = load_backbone("tiny-gpt2", d_in=4)
    c = apply_freeze(gpt, ReservoirClassifier(gpt, 1, 1, C).head, parse_groups("all"))
    assert c["recurrent"] == 0 and c["trainable"] == c["total"]


def test_extract_then_fit_linear(tmp_path):
    from reservoir.readouts.run import fit_linear
    from reservoir.store import FeatureStore

    store = run_extract(ExtractConfig(task="bit-xor", backbone="lstm-2x16", init="random", layers=2,
                                  task_params={"n_train": 200, "n_test": 100, "n_bits": 2},
                                  out=str(tmp_path / "xor.zarr"), device="cpu"), progress=False)
    with FeatureStore.open(store) as s:
        assert s.complete
        assert s.attrs["backbone"]["family"] == "lstm" and s.attrs["layers"] == [0, 1, 2]
        assert s.final_norm() is not None
    rows = fit_linear(store, layers="all", results_dir=str(tmp_path / "fits"))
    assert [r.config["layer"] for r in rows] == [0, 1, 2]
    acc = [r.metrics["test_accuracy"] for r in rows]
    assert acc[0] < 0.6  # layer 0 holds the last input alone: each output bit is the XOR of two inputs
    assert acc[1] >= 0.95 and acc[2] >= 0.95  # the recurrence has seen both inputs of every bit


def test_training_all_learns_bit_xor(tmp_path):
    r = run(TrainConfig(task="bit-xor", backbone="lstm-1x32", init="random", finetune="all", steps=200,
                        eval_every=100, batch_size=32, lr=3e-3,
                        task_params={"n_train": 400, "n_test": 200, "n_bits": 2}, out=str(tmp_path / "run"),
                        device="cpu"), progress=False)
    assert r.metrics["test_accuracy"] > 0.95  # chance is 0.5 per bit
    assert r.parameters["trainable"] == r.parameters["total"] > 0
    assert r.parameters["recurrent"] == 4 * (2 * 32 * 32 + 2 * 32)
    assert r.backbone["family"] == "lstm"


@pytest.mark.parametrize("finetune", ["layernorm,output", "layernorm,recurrent,output"])
def test_split_point_store_equals_live_training(tmp_path, finetune):
    params = {"n_train": 120, "n_test": 40, "max_length": 40}  # variable lengths: padding is exercised
    store = run_extract(ExtractConfig(task="listops", backbone="lstm-2x16", init="random", layers=2, full_seq_layer=1,
                                  dtype="float32", task_params=params, out=str(tmp_path / "s.zarr"), device="cpu"),
                    progress=False)
    common = {"backbone": "lstm-2x16", "init": "random", "layers": 2, "finetune": finetune, "steps": 30,
              "eval_every": 10, "device": "cpu"}
    live = run(TrainConfig(task="listops", task_params=params, split_layer=1, out=str(tmp_path / "live"), **common),
               progress=False)
    cached = run(TrainConfig(task="listops", from_store=str(store), out=str(tmp_path / "cached"), **common),
                 progress=False)
    assert [p["val_accuracy"] for p in live.curve] == [p["val_accuracy"] for p in cached.curve]
    np.testing.assert_allclose([p["train_loss"] for p in live.curve], [p["train_loss"] for p in cached.curve],
                               rtol=1e-5)
    wa = torch.load(tmp_path / "live" / "last.pt", weights_only=True)["trainable"]
    wb = torch.load(tmp_path / "cached" / "last.pt", weights_only=True)["trainable"]
    assert wa.keys() == wb.keys() and any("lstm" in k for k in wa) == ("recurrent" in finetune)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-5)
    assert live.metrics["test_accuracy"] == cached.metrics["test_accuracy"]
    assert live.parameters == cached.parameters


@pytest.mark.parametrize("init", ["pretrained", "stats"])
def test_no_pretrained_weights(init):
    with pytest.raises(ReservoirError) as err:
        load_backbone("lstm-3x768", init=init, d_in=1)
    assert str(err.value) == (f"backbone 'lstm-3x768' has no pretrained weights; expected --init random, "
                              f"found {init!r}")


@pytest.mark.parametrize("name", ["lstm-0x16", "lstm-3xabc", "lstm-3x0", "lstm-3x", "lstm-x16", "lstm-2x16x3"])
def test_bad_lstm_names_are_one_line_errors(name):
    with pytest.raises(ReservoirError, match="expected lstm-<layers>x<dim>") as err:
        load_backbone(name, init="random", d_in=1)
    assert "\n" not in str(err.value) and repr(name) in str(err.value)


def test_depth_beyond_layers():
    with pytest.raises(ReservoirError, match=r"depth 4 is beyond backbone 'lstm-3x8': expected 0..3 layers"):
        load_backbone("lstm-3x8", init="random", d_in=1, depth=4)
    assert load_backbone("lstm-3x8", init="random", d_in=1, depth=0).features(
        torch.ones(1, 2, 1), torch.tensor([2]), [0]).shape == (1, 1, 1, 8)
