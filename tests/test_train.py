"""Live training: freeze schemes, a run that learns, training on objects, results, resume, split-point stores."""

import json
import os
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from reservoir.backbones import load_backbone
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig
from reservoir.extract import run as run_extract
from reservoir.training import (
    Feeder,
    ReservoirClassifier,
    TrainConfig,
    TrainData,
    TrainResult,
    build,
    config_for_store,
    load_run,
    parse_lr_sweep,
    run,
    steps_to_converge,
    train,
)
from reservoir.training.data import carve_val
from reservoir.training.freeze import GROUPS, apply_freeze, parse_groups

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


@pytest.mark.parametrize("name, spec, family", [("tiny-gpt2", "recurrent", "gpt2"),
                                                ("tiny-llama", "positions", "llama")])
def test_groups_that_train_nothing_are_refused(name, spec, family, caplog):
    """No optimizer over an empty parameter list: one line naming the groups and the backbone's family."""
    bb = load_backbone(name, d_in=4)
    model = ReservoirClassifier(bb, 1, 1, 10)
    with caplog.at_level("WARNING", logger="reservoir"), pytest.raises(
            ReservoirError, match=rf"--finetune {spec}: expected parameters to train in backbone '{name}' "
                                  rf"\({family}\); found the group {spec} empty \(groups with parameters here: input"):
        apply_freeze(bb, model.head, parse_groups(spec))
    assert not caplog.text  # the refusal says it all
    assert apply_freeze(bb, model.head, parse_groups(f"{spec},output"))["trainable"] == 32 * 10 + 10
    with pytest.raises(ReservoirError, match="found the groups attention, feedforward empty above layer 2"):
        apply_freeze(bb, model.head, ("attention", "feedforward"), first_block=2)


def test_live_split_layer_refusal_names_no_store(tmp_path):
    with pytest.raises(ReservoirError) as err:
        run(TrainConfig(task="bit-xor", backbone="tiny-gpt2", split_layer=1, finetune="fpt", steps=1, device="cpu",
                        task_params=XOR, out=str(tmp_path / "r")), progress=False)
    assert str(err.value) == ("--finetune group 'input' lies below the split layer 1, where nothing is trained: "
                              "expected groups of the blocks above it or the head (layernorm, attention, feedforward, "
                              "recurrent, output), found 'input'")
    assert "store" not in str(err.value)


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


@pytest.mark.parametrize("lrs, seed, seeds, message", [
    ("1:1e4:2", 0, 1, "--lr must be at most 1,000, found 10000.0"),
    ("1e-3:1e-2:2", 4294967295, 2, "--seed 4294967295 with --seeds 2: expected seeds up to 4294967295; found them "
                                   "up to 4294967296"),
    ("1e-3:1e-2:2", 0, 10**6, "--seeds must be an integer in 1..1000, found 1000000"),
])  # fmt: skip
def test_a_sweep_checks_every_runs_settings_before_the_first_trains(tmp_path, lrs, seed, seeds, message, monkeypatch):
    import reservoir.training.sweeps as sweeps

    monkeypatch.setattr(sweeps, "run", lambda *a, **k: pytest.fail("a run started"))
    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=2, task_params=XOR, seed=seed,
                      out=str(tmp_path / "sweep"))
    with pytest.raises(ReservoirError, match=re.escape(message)):
        sweeps.sweep(cfg, parse_lr_sweep(lrs), seeds, progress=False)
    assert not (tmp_path / "sweep").exists()


def test_sweep_run_folders_never_share_a_name(tmp_path):
    from reservoir.training import sweep
    from reservoir.training.sweeps import lr_label

    lrs = parse_lr_sweep("1e-3:1.002e-3:2")
    assert [lr_label(lr) for lr in lrs] == ["0.001", "0.001002"]
    assert [lr_label(lr) for lr in parse_lr_sweep("1e-6:1e-2:5")] == ["1e-06", "1e-05", "0.0001", "0.001", "0.01"]
    r = sweep(TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=2, eval_every=2, task_params=XOR, device="cpu",
                          out=str(tmp_path / "sw")), lrs, seeds=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["lr0.001-seed0", "lr0.001002-seed0", "sweep.json"]
    for lr in lrs:
        assert TrainResult.read(tmp_path / "sw" / f"lr{lr_label(lr)}-seed0" / "results.json").config["lr"] == lr
    assert len(r.runs) == 2


def test_steps_to_converge():
    curve = [{"step": s, "val_accuracy": a} for s, a in [(10, 0.5), (20, 0.91), (30, 0.915), (40, 0.92)]]
    assert steps_to_converge(curve) == 20
    assert steps_to_converge([]) is None


def test_training_learns_bit_xor_on_tiny_gpt2(tmp_path):
    r = run(TrainConfig(task="bit-xor", backbone="tiny-gpt2", finetune="all", steps=300, eval_every=100,
                        batch_size=32, lr=3e-3, task_params={**XOR, "n_bits": 2}, out=str(tmp_path / "run"),
                        device="cpu"), progress=False)
    m = r.metrics
    assert m["test_accuracy"] > 0.95  # chance is 0.5 per bit
    assert m["n_test"] == 200 and m["steps"] == 300
    assert [p["step"] for p in r.curve] == [100, 200, 300]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["metrics"]["test_accuracy"] == m["test_accuracy"]
    assert saved["parameters"]["trainable"] == saved["parameters"]["total"]


def test_train_on_objects_writes_nothing_and_equals_the_run_of_its_config(tmp_path, monkeypatch, capsys):
    """`train(model, data, settings)` without `out`: no file anywhere, and the same run as `run(config)` with files."""
    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", finetune="layernorm,output", steps=30, eval_every=10,
                      task_params=XOR, device="cpu")
    monkeypatch.chdir(tmp_path)
    _, model, data = build(cfg)
    assert all(p.requires_grad for p in model.head.parameters())  # built unfrozen: train freezes
    r = train(model, data, cfg, progress=False)
    assert os.listdir(tmp_path) == []
    assert "trainable params: " in capsys.readouterr().out
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == r.parameters["trainable"] == r.parameters["layernorm"] + r.parameters["output"]
    ref = run(replace(cfg, out=str(tmp_path / "run")), progress=False)
    assert r.metrics == ref.metrics and r.curve == ref.curve and r.parameters == ref.parameters
    assert r.task == ref.task and r.task["name"] == "bit-xor" and r.backbone == ref.backbone
    assert sorted(os.listdir(tmp_path / "run")) == ["best.pt", "last.pt", "results.json"]


def test_train_on_arrays_reaches_full_accuracy_on_separable_data():
    """Feeders built from arrays (no registered task): one real token of four, labelled by its parity."""
    rng = np.random.default_rng(0)

    def feeder(n):
        ids = rng.integers(0, 4, (n, 3))  # positions after the first are padding
        return Feeder(ids, np.ones(n, np.int64), ids[:, 0] % 2)

    data = TrainData(feeder(256), feeder(64), feeder(128))
    model = ReservoirClassifier(load_backbone("tiny-gpt2", d_in=4), n_out_tokens=1, n_heads=1, n_classes=2)
    r = train(model, data, TrainConfig(task="parity", finetune="output", steps=150, eval_every=50, lr=3e-2),
              progress=False)
    assert r.metrics["test_accuracy"] == 1.0 and r.metrics["n_test"] == 128
    assert r.metrics["best_val_accuracy"] == 1.0 and r.curve[0]["train_loss"] > r.curve[-1]["train_loss"]
    assert r.parameters["trainable"] == r.parameters["output"] == 32 * 2 + 2
    assert r.task is None and "task" not in r.to_dict() and r.backbone["id"] == "tiny-gpt2"


def test_train_data_feeds_every_split_from_one_layer():
    a = Feeder(np.zeros((2, 3, 4), np.float32), np.array([3, 2]), np.array([0, 1]))
    b = replace(a, start=1)
    assert TrainData(b, b, b).start == 1
    with pytest.raises(ReservoirError, match="fed from one layer, found inputs, layer 1, inputs"):
        TrainData(a, b, a)


# A results.json written by the version before TrainResult existed (timings and numbers as it wrote them).
OLD_RESULTS = {
    "kind": "train",
    "config": {"task": "bit-xor", "backbone": "tiny-gpt2", "init": "pretrained", "layers": None, "finetune": "fpt",
               "task_params": {"n_train": 40, "n_test": 20, "n_bits": 2}, "lr": 0.001, "steps": 4, "epochs": None,
               "batch_size": 16, "eval_every": 2, "seed": 0, "dropout": 0.0, "grad_clip": 1.0, "val_fraction": 0.1,
               "projection_gain": 1.41, "split_layer": 0, "from_store": None, "device": "cpu", "amp": "auto",
               "out": "/tmp/oldrun"},
    "backbone": {"id": "tiny-gpt2", "family": "gpt2", "init": "pretrained", "seed": 0, "n_layer": 2, "n_dim": 32,
                 "depth": 2, "max_positions": 1024, "weights_sha256": "88d36cdf1f83a467253459b0cf6a8205",
                 "revision": None, "final_norm_eps": 1e-05},
    "task": {"name": "bit-xor", "params": {"n_bits": 2, "n_train": 40, "n_test": 20, "seed": 0},
             "fingerprint": "e2297ee10f75426089f095d1b9e9ef8a"},
    "parameters": {"trainable": 33284, "total": 58436, "input": 64, "positions": 32768, "layernorm": 320,
                   "attention": 8448, "feedforward": 16704, "recurrent": 0, "output": 132},
    "metrics": {"test_accuracy": 0.375, "best_val_accuracy": 0.875, "best_step": 4, "final_val_accuracy": 0.875,
                "steps": 4, "steps_to_converge": 2, "n_test": 20},
    "curve": [{"step": 2, "train_loss": 0.7468183040618896, "val_accuracy": 0.875},
              {"step": 4, "train_loss": 0.7626761496067047, "val_accuracy": 0.875}],
    "timings": {"train_s": 0.42737453500012634, "test_eval_s": 0.0012720049999188632},
    "recipe": {"name": "old", "run": "train__bit-xor", "seed": 0},
    "environment": {"reservoir_version": "0.1.0.dev0", "python": "3.11.7", "torch": "2.13.0+cpu"},
    "written": "2026-11-26T06:35:22+00:00",
}


def test_train_result_reads_an_existing_results_json_and_round_trips(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(OLD_RESULTS, indent=2))
    r = TrainResult.read(path)
    assert r.metrics["test_accuracy"] == 0.375 and r.config["lr"] == 0.001 and r.curve[1]["step"] == 4
    assert r.parameters["trainable"] == 33284 and r.store is None and r.cached is None
    assert list(r.extra) == ["recipe", "environment", "written"]
    assert r.to_dict() == OLD_RESULTS and list(r.to_dict()) == list(OLD_RESULTS)  # same keys, same order
    assert TrainResult.from_dict(r.to_dict()) == r
    r.write(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    assert list(again) == list(OLD_RESULTS) and again["written"] != OLD_RESULTS["written"]
    assert {k: again[k] for k in OLD_RESULTS if k not in ("environment", "written")} == {
        k: v for k, v in OLD_RESULTS.items() if k not in ("environment", "written")}
    with pytest.raises(ReservoirError, match="expected a TrainResult with config, parameters, metrics, curve, timings, "
                                             "found one without curve"):
        TrainResult.from_dict({k: v for k, v in OLD_RESULTS.items() if k != "curve"})


def test_results_json_holds_the_returned_result(tmp_path):
    r = run(TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=4, eval_every=2, device="cpu",
                        task_params={"n_train": 40, "n_test": 20, "n_bits": 2}, out=str(tmp_path / "run")),
            progress=False, extra={"note": "kept"})
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert list(saved) == [*OLD_RESULTS][:8] + ["rows", "step_mode", "note", "environment", "written"]
    assert saved["step_mode"] == "eager"  # on the CPU
    assert saved["metrics"]["test_interval"][0] <= saved["metrics"]["test_accuracy"] <= saved["metrics"]["test_interval"][1]
    assert TrainResult.read(tmp_path / "run" / "results.json").to_dict() == saved
    assert {k: v for k, v in saved.items() if k not in ("environment", "written")} == json.loads(
        json.dumps(r.to_dict()))


def test_resume_reaches_the_same_weights(tmp_path, monkeypatch):
    cfg = dict(task="bit-xor", backbone="tiny-bert", finetune="layernorm,output", steps=60, eval_every=20,
               task_params=XOR, device="cpu")
    run(TrainConfig(**cfg, out=str(tmp_path / "a")), progress=False)
    # interrupt the second run after its second evaluation (step 40), then resume it
    import reservoir.training.loop as tr

    calls = {"n": 0}
    original = tr.evaluate

    def stop_after_two(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*a, **kw)

    monkeypatch.setattr(tr, "evaluate", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        run(TrainConfig(**cfg, out=str(tmp_path / "b")), progress=False)
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state"]["step"] == 40
    monkeypatch.setattr(tr, "evaluate", original)
    rb = run(TrainConfig(**cfg, out=str(tmp_path / "b")), progress=False)
    wa = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["trainable"]
    wb = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["trainable"]
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0)
    assert [p["step"] for p in rb.curve] == [20, 40, 60]
    with pytest.raises(ReservoirError, match="holds a run with lr=0.001"):
        run(TrainConfig(**{**cfg, "out": str(tmp_path / "b")}, lr=0.01), progress=False)


def test_a_run_computed_again_never_leaves_its_checkpoints_beside_the_old_results(tmp_path, monkeypatch):
    """A finished run's folder without last.pt (removed to save space) is trained again from step 0: stopped after
    its first validation, it must not leave new checkpoints under the old results.json, read as finished."""
    import reservoir.training.loop as tr
    from reservoir.training.builders import finished_or_run

    out = tmp_path / "run"
    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=4, eval_every=2, task_params=XOR, device="cpu",
                      out=str(out))
    accuracies = iter([0.5, 0.9])  # step 4 is the best
    monkeypatch.setattr(tr, "evaluate", lambda *a, **kw: next(accuracies))
    assert run(cfg, progress=False).metrics["best_step"] == 4
    (out / "last.pt").unlink()

    def stopped_at_the_second_validation(accuracies=iter([0.7])):
        def evaluate(*a, **kw):
            for accuracy in accuracies:
                return accuracy
            raise KeyboardInterrupt
        return evaluate

    monkeypatch.setattr(tr, "evaluate", stopped_at_the_second_validation())
    with pytest.raises(KeyboardInterrupt):
        run(cfg, progress=False)
    assert torch.load(out / "best.pt", weights_only=True)["step"] == 2
    assert not (out / "results.json").exists()  # not finished: the next call resumes it from last.pt
    accuracies = iter([0.9])
    monkeypatch.setattr(tr, "evaluate", lambda *a, **kw: next(accuracies))
    folder, result = finished_or_run(cfg, progress=False)
    assert result is not None and result.metrics["best_step"] == 4  # resumed at step 2, trained to the end


def test_load_run_refuses_a_best_checkpoint_of_another_step_than_its_results(tmp_path):
    out = tmp_path / "run"
    run(TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=4, eval_every=2, task_params=XOR, device="cpu",
                    out=str(out)), progress=False)
    results = json.loads((out / "results.json").read_text())
    results["metrics"]["best_step"] = {2: 4, 4: 2}[results["metrics"]["best_step"]]
    (out / "results.json").write_text(json.dumps(results))
    with pytest.raises(ReservoirError, match=r"best.pt: expected the best step of the run in results.json \(\d\); "
                                             r"found step \d"):
        load_run(out)


def test_a_sweep_and_a_single_run_never_share_a_folder(tmp_path, monkeypatch):
    from reservoir.training import sweep

    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=2, eval_every=2, task_params=XOR, device="cpu")
    r = sweep(cfg, [1e-3, 1e-2], seeds=1, progress=False)
    folder = next((tmp_path / "results" / "train").iterdir())
    assert folder.name.endswith("-sweep0.001-0.01x2-seeds0-0") and (folder / "sweep.json").is_file()
    assert r.best_lr in (1e-3, 1e-2)
    run(cfg, progress=False)  # the default single run: a folder of its own
    single = tmp_path / cfg.default_out()
    assert single.name.endswith("-lr0.001-seed0") and (single / "results.json").is_file()
    assert sorted((tmp_path / "results" / "train").iterdir()) == sorted([single, folder])
    with pytest.raises(ReservoirError, match="holds an lr sweep"):
        run(replace(cfg, out=str(folder)), progress=False)
    with pytest.raises(ReservoirError, match="holds a single run"):
        sweep(replace(cfg, out=str(single)), [1e-3, 1e-2], seeds=1, progress=False)


def test_a_run_stopped_between_its_two_checkpoints_resumes_with_its_best_step(tmp_path, monkeypatch):
    """last.pt is written first; a run killed before the best.pt of the same (best) step gets that best.pt from
    last.pt when it resumes, so the tested tensors are those of the best step the results name."""
    import reservoir.training.checkpoint as checkpoint
    import reservoir.training.loop as tr

    cfg = dict(task="bit-xor", backbone="tiny-gpt2", steps=6, eval_every=2, task_params=XOR, device="cpu")
    for name in ("a", "b"):
        accuracies = iter([0.5, 0.9, 0.1])  # step 4 is the best
        monkeypatch.setattr(tr, "evaluate", lambda *a, **kw: next(accuracies))
        if name == "b":
            save, saves = checkpoint.save, []

            def killed_before_best(path, payload):
                saves.append(path.name)
                if saves.count("best.pt") == 2:  # step 4's best.pt, after its last.pt
                    raise KeyboardInterrupt
                save(path, payload)

            monkeypatch.setattr(checkpoint, "save", killed_before_best)
            with pytest.raises(KeyboardInterrupt):
                run(TrainConfig(**cfg, out=str(tmp_path / name)), progress=False)
            assert torch.load(tmp_path / name / "best.pt", weights_only=True)["step"] == 2
            monkeypatch.setattr(checkpoint, "save", save)
        result = run(TrainConfig(**cfg, out=str(tmp_path / name)), progress=False)
        assert result.metrics["best_step"] == 4
    best = {name: torch.load(tmp_path / name / "best.pt", weights_only=True) for name in "ab"}
    assert best["a"]["step"] == best["b"]["step"] == 4
    assert all(torch.equal(best["a"]["trainable"][k], best["b"]["trainable"][k]) for k in best["a"]["trainable"])


def test_a_run_whose_folder_lock_file_is_removed_stops_before_its_next_checkpoint(tmp_path, monkeypatch):
    import reservoir.training.loop as tr
    from reservoir.store.lock import lock_path

    cfg = dict(task="bit-xor", backbone="tiny-gpt2", steps=6, eval_every=2, task_params=XOR, device="cpu",
               out=str(tmp_path / "run"))
    evaluate, calls = tr.evaluate, []

    def lock_removed_after_the_first(*a, **kw):  # by hand, while the run trains: a second run could now start
        calls.append(1)
        if len(calls) == 2:
            lock_path(tmp_path / "run").unlink()
        return evaluate(*a, **kw)

    monkeypatch.setattr(tr, "evaluate", lock_removed_after_the_first)
    with pytest.raises(ReservoirError, match=r"expected this writer's lock file .*run\.lock in place; found it "
                                             "removed or replaced while writing"):
        run(TrainConfig(**cfg), progress=False)
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["state"]["step"] == 2
    monkeypatch.setattr(tr, "evaluate", evaluate)
    assert run(TrainConfig(**cfg), progress=False).metrics["steps"] == 6  # resumed from step 2


def test_cpu_checkpoints_hold_no_cuda_generator_and_resume_from_one_that_does(tmp_path):
    cfg = dict(task="bit-xor", backbone="tiny-gpt2", steps=4, eval_every=2, task_params=XOR, device="cpu")
    run(TrainConfig(**cfg, out=str(tmp_path / "a")), progress=False)
    last = torch.load(tmp_path / "a" / "last.pt", weights_only=True)
    assert sorted(last) == sorted(["config", "data", "course", "trainable", "optimizer", "rng", "state"])  # no cuda_rng
    assert "grad_scaler" not in last["state"]  # no fp16 on the CPU
    last["state"]["step"], last["state"]["curve"] = 2, last["state"]["curve"][:1]
    last["state"]["best_step"], last["state"]["best_val"] = 2, last["state"]["curve"][0]["val_accuracy"]
    last["cuda_rng"] = [torch.zeros(16, dtype=torch.uint8)]  # a CUDA run's checkpoint, resumed on the CPU
    torch.save(last, tmp_path / "a" / "last.pt")
    (tmp_path / "a" / "results.json").unlink()
    (tmp_path / "a" / "best.pt").unlink()  # step 4's: written again from last.pt (its best step is its last)
    r = run(TrainConfig(**cfg, out=str(tmp_path / "a")), progress=False)
    assert [p["step"] for p in r.curve] == [2, 4]


def test_train_puts_back_the_frozen_weights_it_cast_for_the_run():
    """bf16 frozen matmuls are the run's business: the caller's model comes back in float32 with its very weights,
    and runs in float32 without autocast."""
    from reservoir.training.loop import evaluate

    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", finetune="layernorm,output", steps=4, eval_every=2,
                      task_params=XOR, device="cpu", amp="bf16")
    _, model, data = build(cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, data, cfg, progress=False)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(dict(model.named_parameters())[n], before[n]) for n in frozen)
    assert 0 <= evaluate(model, data.test, torch.device("cpu"), amp="none") <= 1


def _save_tiny_gpt2(folder, seed):
    """A 2-layer GPT-2 of seeded random weights saved in ``folder`` (saved again: the folder replaced since a run)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    GPT2Model(GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=64, vocab_size=8)).save_pretrained(folder)


def test_a_run_loaded_again_needs_the_backbone_weights_it_was_trained_with(tmp_path):
    folder = tmp_path / "gpt2"

    _save_tiny_gpt2(folder, 0)
    cfg = TrainConfig(task="bit-xor", backbone=str(folder), steps=2, eval_every=2, task_params=XOR, device="cpu",
                      out=str(tmp_path / "run"))
    run(cfg, progress=False)
    load_run(tmp_path / "run")
    _save_tiny_gpt2(folder, 1)  # the folder replaced (or a hub revision moved) since the run
    with pytest.raises(ReservoirError, match="expected the backbone weights the run was trained with"):
        load_run(tmp_path / "run")


def test_a_run_resumed_or_retested_needs_the_backbone_weights_it_was_trained_with(tmp_path, monkeypatch):
    """A model folder overwritten between two invocations of one run: the resume (and the retest of a finished
    run) is refused, not trained on and reported as the run."""
    from test_recipes import _interrupted_at_the_second_validation

    folder = tmp_path / "gpt2"

    _save_tiny_gpt2(folder, 0)
    cfg = TrainConfig(task="bit-xor", backbone=str(folder), steps=4, eval_every=2, task_params=XOR, device="cpu",
                      out=str(tmp_path / "run"))
    _interrupted_at_the_second_validation(monkeypatch, lambda: run(cfg, progress=False))
    _save_tiny_gpt2(folder, 1)
    with pytest.raises(ReservoirError, match=r"holds a run trained on another backbone's weights \(backbone="):
        run(cfg, progress=False)
    _save_tiny_gpt2(folder, 0)
    run(cfg, progress=False)  # the same weights again: resumed and finished
    (tmp_path / "run" / "results.json").unlink()
    _save_tiny_gpt2(folder, 1)
    with pytest.raises(ReservoirError, match="another backbone's weights"):
        run(cfg, progress=False)  # a finished run is not tested again with another model


def test_a_run_that_diverges_stops_in_one_line_without_results(tmp_path, monkeypatch):
    """NaN or infinite losses (or weights) are a diverged run, not a finished one with argmax-of-NaN accuracies."""
    import reservoir.training.loop as tr

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4, 3)).astype(np.float32) * np.float32(1e30)  # finite, and beyond any forward
    y = (x[:, 0, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "huge.npz", train_inputs=x[:200], train_labels=y[:200], test_inputs=x[200:],
             test_labels=y[200:])
    cfg = TrainConfig(task="data", task_params={"path": str(tmp_path / "huge.npz")}, backbone="tiny-gpt2", steps=4,
                      eval_every=2, device="cpu", out=str(tmp_path / "huge"))
    with pytest.raises(ReservoirError, match=r"training diverged by step 2: expected finite losses and weights; "
                                             r"found its mean loss nan( and trained weights)? not finite: train "
                                             r"with a lower --lr"):
        run(cfg, progress=False)
    assert not (tmp_path / "huge").exists()  # nothing written: the folder the run made is gone again

    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=4, eval_every=2, task_params=XOR, device="cpu",
                      out=str(tmp_path / "xor"))
    evaluate, calls = tr.evaluate, []

    def weights_gone_at_the_second(model, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            with torch.no_grad():
                model.head.weight.fill_(float("inf"))  # (the next step's check sees it)
        return evaluate(model, *a, **k)

    monkeypatch.setattr(tr, "evaluate", weights_gone_at_the_second)
    with pytest.raises(ReservoirError, match="training diverged by step 4: .* and trained weights not finite"):
        run(cfg, progress=False)
    assert torch.load(tmp_path / "xor" / "last.pt", weights_only=True)["state"]["step"] == 2  # step 4 not written


def test_a_run_folder_holding_another_run_without_its_last_checkpoint_is_refused(tmp_path):
    """A finished run's last.pt removed to save space: another run with the same --out would have replaced its
    results and best tensors without a word."""
    cfg = dict(task="bit-xor", backbone="tiny-gpt2", steps=2, eval_every=2, task_params=XOR, device="cpu",
               out=str(tmp_path / "run"))
    run(TrainConfig(**cfg), progress=False)
    (tmp_path / "run" / "last.pt").unlink()
    before = (tmp_path / "run" / "results.json").read_bytes()
    with pytest.raises(ReservoirError, match=r"run holds a run with lr=0.001 \(results.json\); pass another --out"):
        run(TrainConfig(**{**cfg, "lr": 0.05}), progress=False)
    (tmp_path / "run" / "results.json").unlink()
    with pytest.raises(ReservoirError, match=r"run holds a run with lr=0.001, this run has 0.05; pass another --out"):
        run(TrainConfig(**{**cfg, "lr": 0.05}), progress=False)  # best.pt alone says so too
    run(TrainConfig(**cfg), progress=False)  # the same run: computed again in place
    assert json.loads((tmp_path / "run" / "results.json").read_bytes())["config"] == json.loads(before)["config"]


@pytest.mark.parametrize("edit, found", [
    ({"step": "x"}, "step 'x'"), ({"step": -5}, "step -5"), ({"step": 10**6}, "step 1000000 (expected an integer in "
                                                                            "0..4)"),
    ({"curve": "abc"}, "a curve that is not a list"), ({"curve": []}, "a curve of 0 validation(s) for step 4"),
    ({"best_val": "hi"}, "best step 4 (val 'hi')"), ({"best_step": 3}, "best step 3"),
])  # fmt: skip
def test_a_garbled_loop_state_in_last_pt_is_one_line(tmp_path, edit, found):
    cfg = TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=4, eval_every=2, task_params=XOR, device="cpu",
                      out=str(tmp_path / "run"))
    run(cfg, progress=False)
    (tmp_path / "run" / "results.json").unlink()
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    last["state"].update(edit)
    torch.save(last, tmp_path / "run" / "last.pt")
    with pytest.raises(ReservoirError) as e:
        run(cfg, progress=False)
    assert str(e.value).startswith(f"{tmp_path / 'run' / 'last.pt'}: expected the loop state of this run; found "
                                   f"{found}") and "\n" not in str(e.value)


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_split_point_store_equals_live_training(tmp_path, suffix):
    params = {"n_train": 120, "n_test": 40, "max_length": 40}
    store = run_extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, full_seq_layer=1, dtype="float32",
                                  amp="none", task_params=params, out=str(tmp_path / f"s{suffix}")), progress=False)
    common = dict(backbone="tiny-bert", layers=2, finetune="layernorm,output", steps=30, eval_every=10, device="cpu",
                  amp="none")  # float32 on both sides
    live = run(TrainConfig(task="listops", task_params=params, split_layer=1, out=str(tmp_path / "live"), **common),
               progress=False)
    config = config_for_store(store, out=str(tmp_path / "cached"), **common)
    assert (config.task, config.split_layer, config.init, config.seed) == ("listops", 1, "pretrained", 0)
    cached = run(config, progress=False)
    assert [p["val_accuracy"] for p in live.curve] == [p["val_accuracy"] for p in cached.curve]
    np.testing.assert_allclose([p["train_loss"] for p in live.curve], [p["train_loss"] for p in cached.curve],
                               rtol=1e-5)
    wa = torch.load(tmp_path / "live" / "last.pt", weights_only=True)["trainable"]
    wb = torch.load(tmp_path / "cached" / "last.pt", weights_only=True)["trainable"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-5)
    assert live.metrics["test_accuracy"] == cached.metrics["test_accuracy"]
    assert live.parameters == cached.parameters and cached.store["reservoir_version"]


def test_a_split_point_store_at_layer_0_trains_from_its_states_as_live_training_does(tmp_path):
    """Layer-0 states are the embedding's output: fed as they are (never embedded again, which failed on their
    width), the blocks above train as a live run whose split layer is 0 (GPT-2: no embedding norm to differ)."""
    params = {"n_train": 120, "n_test": 40, "max_length": 40}
    store = run_extract(ExtractConfig(task="listops", backbone="tiny-gpt2", layers=2, full_seq_layer=0, dtype="float32",
                                      amp="none", task_params=params, out=str(tmp_path / "s.zarr")), progress=False)
    common = dict(backbone="tiny-gpt2", layers=2, finetune="layernorm,output", steps=20, eval_every=10, device="cpu",
                  amp="none")
    live = run(TrainConfig(task="listops", task_params=params, split_layer=0, out=str(tmp_path / "live"), **common),
               progress=False)
    cached = run(config_for_store(store, out=str(tmp_path / "cached"), **common), progress=False)
    assert [p["val_accuracy"] for p in live.curve] == [p["val_accuracy"] for p in cached.curve]
    np.testing.assert_allclose([p["train_loss"] for p in live.curve], [p["train_loss"] for p in cached.curve],
                               rtol=1e-5)
    assert live.parameters["trainable"] == cached.parameters["trainable"]
    assert cached.parameters["input"] == cached.parameters["positions"] == 0  # below the states: never in the graph
    with pytest.raises(ReservoirError, match="--finetune group 'input' lies below the split layer 0"):
        run(config_for_store(store, out=str(tmp_path / "c2"), **{**common, "finetune": "input,output"}),
            progress=False)


def test_split_point_store_seeds_head_and_carve_with_the_run_seed(tmp_path):
    """The store fixes the backbone and projection (its seed); the head and the validation rows follow the run's
    seed, so seeds of a sweep from one store start apart, each as a live run with that seed does."""
    from reservoir.training import build_from_store

    params = {"n_train": 60, "n_test": 20, "n_bits": 3}
    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", full_seq_layer=1, task_params=params,
                                      seed=2, out=str(tmp_path / "s.zarr")), progress=False)
    common = dict(backbone="tiny-gpt2", finetune="layernorm,output", device="cpu")
    assert config_for_store(store, **common).seed == 2  # the store's seed unless one is given
    built = {}
    for seed in (0, 1):
        config = config_for_store(store, seed=seed, **common)
        assert config.seed == seed and config.init == "pretrained"
        built[seed] = build_from_store(config)
        _, live, live_data = build(TrainConfig(task="bit-xor", task_params=params, seed=seed, **common))
        model, data = built[seed]
        assert torch.equal(model.head.weight, live.head.weight)
        assert np.array_equal(data.val.labels, live_data.val.labels)
        assert np.array_equal(data.val.index, carve_val(60, 0.1, seed)[1])
    (m0, d0), (m1, d1) = built[0], built[1]
    assert not torch.equal(m0.head.weight, m1.head.weight) and not np.array_equal(d0.val.index, d1.val.index)
    torch.testing.assert_close(m0.backbone.input.weight, m1.backbone.input.weight, rtol=0, atol=0)  # the store's


def test_build_from_store_closes_its_store_on_refusal_and_with_its_data(tmp_path, monkeypatch):
    """The store build_from_store opens is closed when a check refuses it, and by the data it returns."""
    from reservoir.store import FeatureStore
    from reservoir.training import build_from_store

    params = {"n_train": 40, "n_test": 20, "n_bits": 3}
    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", full_seq_layer=1, layers=2,
                                      task_params=params, out=str(tmp_path / "s.zarr")), progress=False)
    opened = []
    real_open = FeatureStore.open.__func__

    def recording_open(cls, *args, **kwargs):
        opened.append(real_open(cls, *args, **kwargs))
        return opened[-1]

    shallow, whole = (config_for_store(store, backbone="tiny-gpt2", finetune="output", **depth)
                      for depth in ({"layers": 1}, {}))
    monkeypatch.setattr(FeatureStore, "open", classmethod(recording_open))
    with pytest.raises(ReservoirError, match="training needs depth K > 1, found K=1"):
        build_from_store(shallow)
    assert len(opened) == 1 and opened[0].closed
    model, data = build_from_store(whole)
    assert len(opened) == 2 and not opened[1].closed and data.train.start == 1
    with data:
        pass
    assert opened[1].closed
    data.close()  # again: nothing


def test_from_store_refuses_settings_the_store_fixes(tmp_path):
    params = {"n_train": 60, "n_test": 20, "n_bits": 3}
    split = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", full_seq_layer=1, task_params=params,
                                      out=str(tmp_path / "s.zarr")), progress=False)
    last = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", task_params=params,
                                     out=str(tmp_path / "l.zarr")), progress=False)
    ok = config_for_store(split, backbone="tiny-gpt2", task="bit-xor", init="pretrained", split_layer=1,
                          task_params={"n_bits": 3})  # the store's own values pass
    assert (ok.task, ok.task_params, ok.split_layer) == ("bit-xor", {}, 1)
    for given, expected in [
        ({"task": "listops"}, "--task with --from-store .*: expected the store's 'bit-xor' \\(or no --task\\), "
                              "found 'listops'"),
        ({"init": "random"}, "--init with --from-store .*: expected the store's 'pretrained'"),
        ({"task_params": {"n_bits": 4}}, "--param with --from-store .*: expected the store's .*'n_bits': 3"),
        ({"split_layer": 0}, "--split-layer with --from-store .*: expected the store's 1"),
    ]:
        with pytest.raises(ReservoirError, match=expected):
            config_for_store(split, backbone="tiny-gpt2", **given)
    with pytest.raises(ReservoirError, match="--backbone with --from-store .*: expected the store's 'tiny-gpt2'"):
        config_for_store(last, backbone="tiny-bert")
    # settings not asked for (the command line's defaults) take the store's values
    config = config_for_store(last, given=(), backbone="minilm", init="random", seed=7)
    assert (config.backbone, config.init, config.seed) == ("tiny-gpt2", "pretrained", 0)


def test_head_trained_from_a_last_token_store_prints_and_keeps_its_counts(tmp_path, capsys, monkeypatch):
    params = {"n_train": 60, "n_test": 20, "n_bits": 3}
    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", task_params=params,
                                      out=str(tmp_path / "l.zarr")), progress=False)
    capsys.readouterr()
    r = run(config_for_store(store, finetune="output", steps=4, eval_every=2, device="cpu", out=str(tmp_path / "r")),
            progress=False)
    n = 32 * 2 * 3 + 2 * 3  # the head: 3 bits x 2 classes from 32 features
    assert r.cached is True and r.parameters == {"output": n, "trainable": n, "total": n}
    assert f"trainable params: {n:,} || all params: {n:,} || trainable%: 100.0000" in capsys.readouterr().out
    assert TrainResult.read(tmp_path / "r" / "results.json").parameters["total"] == n
    import reservoir.backbones.names as bn

    monkeypatch.setitem(bn.SHORT_NAMES, "tg", "tiny-gpt2")  # a backbone with a short name: its run named by it
    config = config_for_store(store, finetune="output")
    assert config.backbone == "tg" and "-tg-" in config.default_out()
    with pytest.raises(ReservoirError, match="--amp bf16 with --from-store .*: expected --amp auto or --amp none"):
        run(replace(config, amp="bf16"), progress=False)  # the Python API refuses what the CLI refuses


def test_a_run_of_another_projection_is_never_taken_up_and_one_of_the_same_groups_is(tmp_path):
    """A key leaves the default projection out: a finished ``--projection normal`` run was taken up by the same run
    of the default projection (its head tested under another input map, its results relabelled). ``fpt`` and its
    groups written out are one run, not a refusal."""
    base = dict(task="bit-xor", backbone="tiny-gpt2", task_params={"n_train": 40, "n_test": 20, "n_bits": 2},
                steps=2, eval_every=2, device="cpu")
    run(TrainConfig(**base, finetune="output", projection="normal", out=str(tmp_path / "p")), progress=False)
    with pytest.raises(ReservoirError, match="holds a run with projection='normal', this run has 'orthogonal'"):
        run(TrainConfig(**base, finetune="output", out=str(tmp_path / "p")), progress=False)
    first = run(TrainConfig(**base, finetune="fpt", out=str(tmp_path / "f")), progress=False)
    again = run(TrainConfig(**base, finetune="output,layernorm,input,positions", out=str(tmp_path / "f")),
                progress=False)
    assert again.metrics["test_accuracy"] == first.metrics["test_accuracy"]


def test_a_head_trained_from_a_store_reads_its_last_token_features_whatever_it_pools_first(tmp_path):
    def store(name, pooling):
        return run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", task_params=XOR, pooling=pooling,
                                         out=str(tmp_path / name)), progress=False)

    def train(path, out):
        return run(config_for_store(path, finetune="output", steps=4, eval_every=2, device="cpu",
                                    out=str(tmp_path / out)), progress=False)

    last = train(store("last.zarr", ["last"]), "a")
    both = train(store("both.zarr", ["mean", "last"]), "b")  # the store's first pooling is the mean
    assert both.metrics["test_accuracy"] == last.metrics["test_accuracy"]
    assert both.curve == last.curve
    with pytest.raises(ReservoirError, match="expected a store with last-token features .*; found mean pooling only"):
        train(store("mean.zarr", ["mean"]), "c")
    assert not (tmp_path / "c").exists()


def test_a_head_trained_on_stored_features_that_diverges_stops_in_one_line(tmp_path, monkeypatch):
    import reservoir.training.cached as cached

    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", task_params=XOR,
                                      out=str(tmp_path / "l.zarr")), progress=False)
    monkeypatch.setattr(cached.CachedHead, "mean_loss", lambda self: float("inf"))
    with pytest.raises(ReservoirError, match="training diverged by step 2: expected finite losses and weights; found "
                                             "its mean loss inf not finite"):
        run(config_for_store(store, finetune="output", steps=4, eval_every=2, device="cpu", out=str(tmp_path / "r")),
            progress=False)
    assert not (tmp_path / "r").exists()  # nothing written: the folder the run made is gone again


def test_split_point_store_errors(tmp_path):
    params = {"n_train": 40, "n_test": 20, "max_length": 30}
    with pytest.raises(ReservoirError, match="--full-seq-layer must be within 0..1, below the depth 2"):
        run_extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, full_seq_layer=2, task_params=params,
                              out=str(tmp_path / "bad.zarr")), progress=False)
    plain = run_extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, task_params=params,
                                  out=str(tmp_path / "plain.zarr")), progress=False)
    with pytest.raises(ReservoirError, match="expected a split-point store"):
        run(TrainConfig(task="listops", from_store=str(plain), backbone="tiny-bert", steps=1, out=str(tmp_path / "r")),
            progress=False)
    sp = run_extract(ExtractConfig(task="listops", backbone="tiny-bert", layers=2, full_seq_layer=1, task_params=params,
                               out=str(tmp_path / "sp.zarr")), progress=False)
    with pytest.raises(ReservoirError, match="training needs depth K > 1, found K=1"):
        run(TrainConfig(task="listops", from_store=str(sp), backbone="tiny-bert", layers=1, steps=1,
                        out=str(tmp_path / "r2")), progress=False)
    with pytest.raises(ReservoirError, match="below the split layer"):
        run(TrainConfig(task="listops", from_store=str(sp), backbone="tiny-bert", finetune="fpt", steps=1,
                        out=str(tmp_path / "r3")), progress=False)


def test_bench_speedup_reports_consistent_ratios(monkeypatch):
    import importlib

    from reservoir.bench import format_speedup, speedup

    bench = importlib.import_module("reservoir.bench.speedup")  # the module (the package exports its function)

    batches = {"live": [], "cached": []}  # the batch size each timed epoch ran at, by side
    timed = {"live": [], "cached": []}  # what each timed call returned
    time_steps, time_cached = bench._time_steps, bench._time_cached

    feeds = []  # where each live-step epoch's rows came from: the split's array, or the split-point store's

    def live(model, feeder, batch_size, *args, **kwargs):
        batches["live"].append(batch_size)
        feeds.append("memory" if isinstance(feeder.inputs, np.ndarray) else "store")
        timed["live"].append(time_steps(model, feeder, batch_size, *args, **kwargs))
        return timed["live"][-1]

    def cached(head, X, Y, n_classes, batch_size, *args, **kwargs):
        batches["cached"].append(batch_size)
        timed["cached"].append(time_cached(head, X, Y, n_classes, batch_size, *args, **kwargs))
        return timed["cached"][-1]

    monkeypatch.setattr(bench, "_time_steps", live)
    monkeypatch.setattr(bench, "_time_cached", cached)
    r = speedup("bit-xor", {"n_train": 100, "n_test": 16}, backbone="tiny-gpt2", batch_size=16, max_live_rows=48,
                device="cpu")
    a, b = r["output_only"], r["layernorm_top"]
    assert a["live_rows_timed"] == 48 and r["n_train"] == 100
    assert a["speedup"] == pytest.approx(a["live_epoch_s"] / a["cached_epoch_s"])
    # both sides' epoch is the 100 // 16 = 6 whole batches a cached epoch runs (96 rows): the speedup is the live
    # step's time over the cached step's (it was scaled to 100 rows live, 96 cached: 4% too high)
    (live_s, live_rows, _), cached_s = timed["live"][0], timed["cached"][0]
    assert live_rows == 48 and a["live_epoch_s"] == pytest.approx(live_s / 3 * 6)
    assert a["speedup"] == pytest.approx((live_s / 3) / (cached_s / 6))
    assert a["cached_step_ms"] == pytest.approx(1e3 * cached_s / 6)
    assert b["blocks_trained"] == [2] and r["split_layer"] == 1
    assert b["speedup"] == pytest.approx(b["live_epoch_s"] / b["split_store_epoch_s"])
    assert r["extract_overhead"] == pytest.approx(r["pass_s"] / r["bare_forward_s"])
    assert all(v > 0 for v in (a["live_epoch_s"], a["cached_epoch_s"], b["live_epoch_s"], b["split_store_epoch_s"]))
    # break-even counts what only caching pays once (pass + store read), not the setup a live run pays too
    assert r["setup_s"] == pytest.approx(r["task_s"] + r["model_s"]) and "extract_s" not in r
    assert a["cached_extra_s"] == pytest.approx(r["pass_s"] + a["store_read_s"])
    for part, cached in ((a, "cached_epoch_s"), (b, "split_store_epoch_s")):  # what an epoch saves: none, never
        saved = part["live_epoch_s"] - part[cached]  # (a busy machine can make caching save nothing)
        assert part["break_even_epochs"] == (pytest.approx(part["cached_extra_s"] / saved) if saved > 0 else None)
    # (b) trains from the split-point store's own array, read every step as `train --from-store` reads it (not
    # from a copy in memory); only its pass is paid once, scaled from the 48 timed rows to all 116 rows
    assert feeds == ["memory", "memory", "memory", "store"]
    assert b["cached_extra_s"] == b["split_pass_s"] and "split_read_s" not in b
    # the large batch: one size for both sides, bounded by the 48 rows a live epoch is timed on
    assert r["large_batch"] == 48
    assert batches["live"][:2] == batches["cached"][:2] == [16, 48]
    text = format_speedup(r)
    assert "(a) output layer only" in text and "(b) layernorm, blocks 2..2" in text
    assert "    at batch 48 " in text and "at batch 1024" not in text
    assert f"task {r['task_s']:.2f} s + model {r['model_s']:.2f} s = {r['setup_s']:.2f} s" in text
    assert f"pass {r['pass_s']:.2f} s + store read {a['store_read_s']:.2f} s = {a['cached_extra_s']:.2f} s" in text
    with pytest.raises(ReservoirError, match="--split-layer must be within 0..1"):
        speedup("bit-xor", {"n_train": 32, "n_test": 16}, backbone="tiny-gpt2", split_layer=2, device="cpu")


def test_break_even_is_never_when_caching_saves_nothing_per_epoch():
    from reservoir.bench.speedup import _break_even, _epochs

    assert _break_even(3.0, 1.5) == 2.0 and _epochs(_break_even(3.0, 1.5)) == "2.00"
    for saved in (0.0, -0.2):  # a cached epoch no faster than a live one: no number of epochs repays the pass
        assert _break_even(3.0, saved) is None and _epochs(None) == "never"


def test_a_live_run_loads_the_hub_revision_it_names_and_a_store_run_the_stores(tmp_path, monkeypatch):
    """--revision pins the backbone of a live run as extract's does; from a store, the store's revision is the run's
    and another is refused."""
    import reservoir.backbones

    asked = []
    real = reservoir.backbones.load_backbone

    def recording(*args, **kwargs):
        asked.append(kwargs.get("revision"))
        return real(*args, **{**kwargs, "revision": None})  # (a tiny model has no revisions)

    monkeypatch.setattr(reservoir.backbones, "load_backbone", recording)
    params = {"n_train": 40, "n_test": 20, "n_bits": 3}
    build(TrainConfig(task="bit-xor", backbone="tiny-gpt2", task_params=params, revision="v1.0"))
    assert asked == ["v1.0"] and TrainConfig(task="bit-xor", revision="v1.0").key()["revision"] == "v1.0"
    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", full_seq_layer=1, layers=2,
                                      task_params=params, out=str(tmp_path / "s.zarr")), progress=False)
    config = config_for_store(store, backbone="tiny-gpt2", finetune="output")
    assert config.revision is None
    with pytest.raises(ReservoirError, match=r"--revision with --from-store .*: expected the store's None \(or no "
                                             r"--revision\), found 'v2'"):
        config_for_store(store, backbone="tiny-gpt2", finetune="output", revision="v2")
