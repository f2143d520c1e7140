"""Live training: freeze schemes, a run that learns, resume, split-point stores, lr sweeps."""

import json

import numpy as np
import pytest
import torch

from reservoir.backbones import load_backbone
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig, extract
from reservoir.freeze import GROUPS, apply_freeze, parse_groups
from reservoir.train import ReservoirClassifier, TrainConfig, parse_lr_sweep, steps_to_converge, train

XOR = {"n_train": 400, "n_test": 200, "n_bits": 3}


def _counts(name, groups, depth=None):
    bb = load_backbone(name, d_in=4, depth=depth)
    model = ReservoirClassifier(bb, 1, 1, 10)
    return bb, model, apply_freeze(bb, model.head, parse_groups(groups))


def test_group_sizes_gpt2():
    """Counted by hand from the tiny GPT-2 config: 2 blocks, 32 dim, 1024 positions, MLP 4x."""
    d, L, P = 32, 2, 1024
    _, _, c = _counts("tiny-gpt2", "fpt")
    assert c["input"] == 4 * d + d
    assert c["positions"] == P * d
    assert c["layernorm"] == L * 2 * 2 * d + 2 * d  # ln_1, ln_2 per block + ln_f
    assert c["attention"] == L * (d * 3 * d + 3 * d + d * d + d)
    assert c["feedforward"] == L * (d * 4 * d + 4 * d + 4 * d * d + d)
    assert c["output"] == d * 10 + 10
    assert c["trainable"] == c["input"] + c["positions"] + c["layernorm"] + c["output"]
    assert c["total"] == sum(c[g] for g in GROUPS)


def test_group_sizes_bert():
    """BERT: embedding LayerNorm, two LayerNorms per block inside attention.output and output."""
    d, L, P, ff = 32, 2, 1024, 64
    _, _, c = _counts("tiny-bert", "layernorm,attention")
    assert c["positions"] == P * d
    assert c["layernorm"] == 2 * d + L * 2 * 2 * d  # embeddings.LayerNorm + 2 per block; no final norm
    assert c["attention"] == L * (3 * (d * d + d) + d * d + d)  # q, k, v, output.dense
    assert c["feedforward"] == L * (d * ff + ff + ff * d + d)  # intermediate.dense, output.dense
    assert c["trainable"] == c["layernorm"] + c["attention"]


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-bert"])
@pytest.mark.parametrize("spec", ["output", "fpt", "all", "attention,feedforward"])
def test_exactly_the_named_groups_train(name, spec):
    bb, model, c = _counts(name, spec)
    groups = parse_groups(spec)
    expected = sum(c[g] for g in groups)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected == c["trainable"]


def test_split_layer_limits_groups_to_upper_blocks():
    bb = load_backbone("tiny-gpt2", d_in=4)
    model = ReservoirClassifier(bb, 1, 1, 10)
    c = apply_freeze(bb, model.head, ("layernorm", "output"), first_block=1)
    d = 32
    assert c["trainable"] == 2 * 2 * d + 2 * d + d * 10 + 10  # block 2's two norms + ln_f + head
    assert not any(p.requires_grad for p in bb.blocks[0].parameters())
    with pytest.raises(ReservoirError, match="below the split layer"):
        apply_freeze(bb, model.head, ("input", "output"), first_block=1)


def test_bad_groups_and_sweeps():
    with pytest.raises(ReservoirError, match="unknown finetune group 'norms'"):
        parse_groups("norms,output")
    with pytest.raises(ReservoirError, match="names no group"):
        parse_groups(",")
    assert parse_lr_sweep("1e-6:1e-2:5") == [1e-6, 1e-5, 1e-4, 1e-3, 1e-2]  # exact: the values as a user writes them
    assert parse_lr_sweep("1e-4:1e-2:3") == [1e-4, 1e-3, 1e-2]
    assert parse_lr_sweep("1e-5:1e-3:4") == pytest.approx([1e-5, 10 ** -4.333333, 10 ** -3.666667, 1e-3])
    for bad in ("1e-2:1e-6:3", "1e-6:1e-2", "a:b:c", "0:1:3", "1e-6:1e-2:1"):
        with pytest.raises(ReservoirError, match="--lr-sweep"):
            parse_lr_sweep(bad)


def test_steps_to_converge():
    curve = [{"step": s, "val_accuracy": a} for s, a in [(10, 0.5), (20, 0.91), (30, 0.915), (40, 0.92)]]
    assert steps_to_converge(curve) == 20
    assert steps_to_converge([]) is None


def test_training_learns_bit_xor_on_tiny_gpt2(tmp_path):
    r = train(TrainConfig(task="bit-xor", backbone="tiny-gpt2", finetune="all", steps=300, eval_every=100,
                          batch_size=32, lr=3e-3, task_params={**XOR, "n_bits": 2}, out=str(tmp_path / "run"),
                          device="cpu"), progress=False)
    m = r["metrics"]
    assert m["test_accuracy"] > 0.95  # chance is 0.5 per bit
    assert m["n_test"] == 200 and m["steps"] == 300
    assert [p["step"] for p in r["curve"]] == [100, 200, 300]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"]["test_accuracy"] == m["test_accuracy"]
    assert saved["parameters"]["trainable"] == saved["parameters"]["total"]


def test_resume_reaches_the_same_weights(tmp_path, monkeypatch):
    cfg = dict(task="bit-xor", backbone="tiny-bert", finetune="layernorm,output", steps=60, eval_every=20,
               task_params=XOR, device="cpu")
    train(TrainConfig(**cfg, out=str(tmp_path / "a")), progress=False)
    # interrupt the second run after its second evaluation (step 40), then resume it
    import reservoir.train as tr

    calls = {"n": 0}
    original = tr.evaluate

    def stop_after_two(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*a, **kw)

    monkeypatch.setattr(tr, "evaluate", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**cfg, out=str(tmp_path / "b")), progress=False)
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state"]["step"] == 40
    monkeypatch.setattr(tr, "evaluate", original)
    rb = train(TrainConfig(**cfg, out=str(tmp_path / "b")), progress=False)
    wa = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["trainable"]
    wb = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["trainable"]
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0)
    assert [p["step"] for p in rb["curve"]] == [20, 40, 60]
    with pytest.raises(ReservoirError, match="holds a run with lr=0.001"):
        train(TrainConfig(**{**cfg, "out": str(tmp_path / "b")}, lr=0.01), progress=False)


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_split_point_store_equals_live_training(tmp_path, suffix):
    params = {"n_train": 120, "n_test": 40, "max_length": 40}
    store = extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, full_seq_layer=1, dtype="float32",
                                  task_params=params, out=str(tmp_path / f"s{suffix}")), progress=False)
    common = dict(backbone="tiny-bert", layers=2, finetune="layernorm,output", steps=30, eval_every=10, device="cpu")
    live = train(TrainConfig(task="listops", task_params=params, split_layer=1, out=str(tmp_path / "live"), **common),
                 progress=False)
    cached = train(TrainConfig(task="listops", from_store=str(store), out=str(tmp_path / "cached"), **common),
                   progress=False)
    assert [p["val_accuracy"] for p in live["curve"]] == [p["val_accuracy"] for p in cached["curve"]]
    np.testing.assert_allclose([p["train_loss"] for p in live["curve"]], [p["train_loss"] for p in cached["curve"]],
                               rtol=1e-5)
    wa = torch.load(tmp_path / "live" / "last.pt", weights_only=True)["trainable"]
    wb = torch.load(tmp_path / "cached" / "last.pt", weights_only=True)["trainable"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-5)
    assert live["metrics"]["test_accuracy"] == cached["metrics"]["test_accuracy"]


def test_split_point_store_errors(tmp_path):
    params = {"n_train": 40, "n_test": 20, "max_length": 30}
    with pytest.raises(ReservoirError, match="--full-seq-layer must be below the depth 2"):
        extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, full_seq_layer=2, task_params=params,
                              out=str(tmp_path / "bad.zarr")), progress=False)
    plain = extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, task_params=params,
                                  out=str(tmp_path / "plain.zarr")), progress=False)
    with pytest.raises(ReservoirError, match="expected a split-point store"):
        train(TrainConfig(task="listops", from_store=str(plain), backbone="tiny-bert", steps=1, out=str(tmp_path / "r")),
              progress=False)
    sp = extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, full_seq_layer=1, task_params=params,
                               out=str(tmp_path / "sp.zarr")), progress=False)
    with pytest.raises(ReservoirError, match="training needs depth K > 1, found K=1"):
        train(TrainConfig(task="listops", from_store=str(sp), backbone="tiny-bert", layers=1, steps=1,
                          out=str(tmp_path / "r2")), progress=False)
    with pytest.raises(ReservoirError, match="below the split layer"):
        train(TrainConfig(task="listops", from_store=str(sp), backbone="tiny-bert", finetune="fpt", steps=1,
                          out=str(tmp_path / "r3")), progress=False)


def test_bench_speedup_reports_consistent_ratios():
    from reservoir.bench import format_speedup, speedup

    r = speedup("bit-xor", {"n_train": 96, "n_test": 16}, backbone="tiny-gpt2", batch_size=16, max_live_rows=48,
                device="cpu")
    a, b = r["output_only"], r["layernorm_top"]
    assert a["live_rows_timed"] == 48 and r["n_train"] == 96
    assert a["speedup"] == pytest.approx(a["live_epoch_s"] / a["cached_epoch_s"])
    assert b["blocks_trained"] == [2] and r["split_layer"] == 1
    assert b["speedup"] == pytest.approx(b["live_epoch_s"] / b["split_store_epoch_s"])
    assert r["extract_overhead"] == pytest.approx((r["extract_s"] - r["setup_s"]) / r["bare_forward_s"])
    assert all(v > 0 for v in (a["live_epoch_s"], a["cached_epoch_s"], b["live_epoch_s"], b["split_store_epoch_s"]))
    text = format_speedup(r)
    assert "(a) output layer only" in text and "(b) layernorm, blocks 2..2" in text
    with pytest.raises(ReservoirError, match="--split-layer must be within 0..1"):
        speedup("bit-xor", {"n_train": 32, "n_test": 16}, backbone="tiny-gpt2", split_layer=2, device="cpu")
