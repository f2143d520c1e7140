"""bf16 on the CPU: what ``--amp`` chooses, how far bf16-computed features are from float32 ones (bound stated), that
a store never mixes the two, and that casting the frozen weights once trains exactly what autocast trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reservoir.errors import ReservoirError
from reservoir.runtime import compute_dtype, native_bf16

from test_cli import assert_bad_input, invoke

CPU = torch.device("cpu")


def test_amp_on_the_cpu_follows_the_processor(monkeypatch):
    import reservoir.runtime as rt

    assert compute_dtype(CPU, "none") == torch.float32
    assert compute_dtype(CPU, "bf16") == torch.bfloat16  # forced: emulated where there is no native bf16
    with pytest.raises(ReservoirError, match="--amp fp16 is for CUDA; expected --amp auto, bf16 or none on the CPU"):
        compute_dtype(CPU, "fp16")
    for native, expected in (("avx512_bf16", torch.bfloat16), ("amx_bf16", torch.bfloat16), (None, torch.float32)):
        monkeypatch.setattr(rt, "native_bf16", lambda native=native: native)
        assert compute_dtype(CPU, "auto") == expected
        assert rt.compute_path(CPU, "auto").startswith(str(expected).removeprefix("torch."))


def test_native_bf16_reads_the_cpu_flags():
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    expected = "amx_bf16" if " amx_bf16" in flags else "avx512_bf16" if " avx512_bf16" in flags else None
    assert native_bf16() == expected


#: Features computed in bf16 against float32 ones, as fractions of the float32 features' scale (the root mean square
#: of every feature of the layer), at every layer: the largest difference, and the mean one. bf16 keeps 8 bits of
#: mantissa (a relative rounding of 2^-9 = 0.2% per product); on the CPU only the matrix products run in bf16, the
#: residual stream, norms and embeddings in float32. Measured on tiny GPT-2 and BERT (2 blocks): layer 0 exact,
#: blocks largest 0.02-0.12%, mean 0.003-0.02%.
MAX_BOUND, MEAN_BOUND = 0.01, 0.001


@pytest.mark.parametrize("backbone", ["tiny-gpt2", "tiny-bert"])
def test_bf16_features_are_within_the_stated_bound_of_float32_ones(tmp_path, backbone):
    from reservoir.store import FeatureStore

    args = ["extract", "--task", "bit-xor", "-p", "n_train=128", "-p", "n_test=64", "--backbone", backbone,
            "--layers", "all", "--dtype", "float32", "--quiet"]
    for amp in ("none", "bf16"):
        assert invoke(*args, "--amp", amp, "--out", tmp_path / f"{amp}.zarr").exit_code == 0
    with FeatureStore.open(tmp_path / "none.zarr") as a, FeatureStore.open(tmp_path / "bf16.zarr") as b:
        assert (a.attrs["compute_dtype"], b.attrs["compute_dtype"]) == ("float32", "bfloat16")
        for split in ("train", "test"):
            f32, bf = a.features(split)[...], b.features(split)[...]  # (N, layers, tokens, n_dim)
            for layer in range(f32.shape[1]):
                scale = np.sqrt(np.mean(f32[:, layer] ** 2))
                diff = np.abs(bf[:, layer] - f32[:, layer]) / scale
                assert diff.max() < MAX_BOUND and diff.mean() < MEAN_BOUND, (split, layer, diff.max(), diff.mean())
                if layer == 0:  # the input projection and embeddings stay float32 on the CPU: exact
                    assert diff.max() == 0, (split, diff.max())
                else:
                    assert diff.max() > 0  # bf16 really ran in the blocks: the features differ


def test_a_store_is_never_resumed_in_another_compute_dtype(tmp_path):
    args = ["extract", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--backbone", "tiny-gpt2",
            "--layers", 1, "--quiet", "--out", tmp_path / "x.zarr"]
    assert invoke(*args, "--amp", "none").exit_code == 0
    r = invoke(*args, "--amp", "bf16")
    assert_bad_input(r)
    assert "was written with compute_dtype='float32', this run has 'bfloat16'" in r.stderr
    assert "(computed in float32)" in invoke("info", tmp_path / "x.zarr").output


def test_extract_leaves_the_callers_backbone_in_float32(tmp_path):
    from reservoir import extract, get_task, load_backbone

    task = get_task("bit-xor", n_train=32, n_test=16)
    backbone = load_backbone("tiny-gpt2", d_in=task.d_in)
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    extract(task, backbone, tmp_path / "x.zarr", layers=[1], amp="bf16", progress=False).close()
    after = backbone.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("backbone,finetune", [("tiny-gpt2", "fpt"), ("tiny-bert", "output")])
def test_frozen_weights_cast_once_train_exactly_what_autocast_trains(backbone, finetune, monkeypatch):
    import reservoir.training.loop as loop
    from reservoir.training import TrainConfig, build
    from reservoir.training.step import Stepper

    def trained(cast: bool):
        if not cast:
            monkeypatch.setattr(loop, "cast_frozen_matmuls", lambda backbone, dtype: 0)
        else:
            monkeypatch.undo()
        config = TrainConfig(task="bit-xor", backbone=backbone, finetune=finetune, amp="bf16", device="cpu",
                             task_params={"n_train": 96, "n_test": 16}, batch_size=8)
        _, model, data = build(config, CPU)
        _, opt = loop.ready_to_train(model, data, config)
        cast = sum(p.dtype == torch.bfloat16 for p in model.parameters())
        stepper = Stepper(model, opt, data.train, CPU, config.batch_size, config.seed, amp="bf16", grad_clip=1.0)
        stepper.run(6)
        stepper.close()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, cast

    eager, n_eager = trained(cast=False)
    once, n_once = trained(cast=True)
    assert n_eager == 0 and n_once > 0  # the frozen linear weights really were cast
    assert eager.keys() == once.keys() and all(torch.equal(eager[k], once[k]) for k in eager)
    assert all(p.dtype == torch.float32 for p in once.values())  # trainable weights stay float32 masters


def test_compiled_steps_train_what_the_eager_steps_train():
    """``--compile``: the same batches from the same weights end at the same parameters (to float rounding: the
    compiler fuses and reorders operations) and the same losses; the mode says it ran compiled."""
    from reservoir.training import TrainConfig, build
    from reservoir.training.loop import ready_to_train
    from reservoir.training.step import Stepper

    def trained(compile: bool):
        config = TrainConfig(task="bit-xor", backbone="tiny-gpt2", finetune="fpt", amp="none", device="cpu",
                             task_params={"n_train": 96, "n_test": 16}, batch_size=8, compile=compile)
        _, model, data = build(config, CPU)
        _, opt = ready_to_train(model, data, config)
        stepper = Stepper(model, opt, data.train, CPU, config.batch_size, config.seed, amp=config.amp,
                          grad_clip=1.0, compile=config.compile)
        stepper.run(5)
        loss, mode = stepper.mean_loss(), stepper.mode
        stepper.close()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, loss, mode

    eager, eager_loss, eager_mode = trained(False)
    compiled, compiled_loss, compiled_mode = trained(True)
    assert (eager_mode, compiled_mode) == ("eager", "compiled")
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-5)
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
