"""The training step (reservoir.training.step) and `bench train`: what the plain loop trains, the project trains."""

import json

import numpy as np
import pytest
import torch

from reservoir.bench import PlainLoop
from reservoir.errors import ReservoirError
from reservoir.training import Feeder, TrainConfig, batch_rows, build
from reservoir.training.data import EpochOrder
from reservoir.training.loop import _freeze
from reservoir.training.step import Batches, Stepper, adam, restore_optimizer_flags
from test_cli import invoke

CPU = torch.device("cpu")


def test_epoch_order_is_batch_rows():
    order = EpochOrder(50, 16, seed=3)
    for step in range(10):
        assert np.array_equal(order.rows(step), batch_rows(50, 16, 3, step))
    assert len(EpochOrder(5, 16, 0).rows(0)) == 5  # fewer rows than a batch: all of them, every step


@pytest.mark.parametrize("name, task, params", [
    ("tiny-gpt2", "bit-xor", {"n_train": 300, "n_test": 40}),
    ("tiny-bert", "listops", {"n_train": 300, "n_test": 40, "max_length": 60}),  # padded batches, a mask
    ("tiny-llama", "listops", {"n_train": 300, "n_test": 40, "max_length": 60}),
    ("tiny-vit", "bit-xor", {"n_train": 300, "n_test": 40}),  # its patch positions, without the CLS token
])
def test_project_step_trains_what_the_plain_hf_loop_trains(name, task, params):
    """Same weights, groups, batches and settings: the project's steps and the plain Hugging Face loop end at the
    same parameters (so `bench train` times the same computation on both sides)."""
    config = TrainConfig(task=task, backbone=name, task_params=params, lr=3e-3, device="cpu", amp="none")  # float32
    task_obj, model, data = build(config, CPU)
    _freeze(model, data, config)
    opt = adam([p for p in model.parameters() if p.requires_grad], config.lr, CPU)
    stepper = Stepper(model, opt, data.train, CPU, config.batch_size, config.seed, amp=config.amp,
                      grad_clip=config.grad_clip)
    stepper.run(15)
    stepper.close()
    plain = PlainLoop(config, task_obj, data.train, CPU, model.backbone.info)
    plain.run(15)
    ours = {n: p for n, p in model.named_parameters() if p.requires_grad}
    theirs = {n: p for n, p in plain.model.named_parameters() if p.requires_grad}
    assert ours.keys() == theirs.keys() and len(ours) > 4
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], atol=2e-5, rtol=1e-4, msg=lambda m: f"{key}: {m}")
    _, fresh, _ = build(config, CPU)
    start = dict(fresh.named_parameters())
    assert all(not torch.allclose(ours[k], start[k]) for k in ("head.weight", "backbone.input.weight"))  # it trained
    assert stepper.mean_loss() == pytest.approx(float(np.mean(plain.losses)), rel=1e-4)


def test_stepper_reads_the_device_only_for_the_loss():
    """The running loss is a device tensor summed over steps; mean_loss reads it once and starts again."""
    config = TrainConfig(task="bit-xor", backbone="tiny-gpt2", task_params={"n_train": 100, "n_test": 20})
    _, model, data = build(config, CPU)
    _freeze(model, data, config)
    stepper = Stepper(model, adam([p for p in model.parameters() if p.requires_grad], 1e-3, CPU), data.train, CPU,
                      16, 0)
    stepper.run(3)
    assert stepper.loss_steps == 3 and isinstance(stepper.loss_sum, torch.Tensor)
    first = stepper.mean_loss()
    assert first > 0 and stepper.loss_steps == 0 and float(stepper.loss_sum) == 0
    assert stepper.mode == "eager" and "not CUDA" in stepper.why_eager
    stepper.close()


def test_background_reader_feeds_the_steps_in_order_and_passes_errors_on():
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3, 1)
    feeder = Feeder(x, np.full(40, 3), np.arange(40))
    batches = Batches(feeder, CPU, 8, seed=1, start=2)
    for step in (2, 3, 4, 5, 6, 7):
        b = batches.next()
        assert np.array_equal(b.y.numpy(), batch_rows(40, 8, 1, step))  # labels are the row numbers
        assert b.L == 3 and b.padded is False
    batches.close()

    class Broken:
        shape = (40, 3, 1)

        def __getitem__(self, key):
            raise OSError("disk gone")

    bad = Batches(Feeder(Broken(), np.full(40, 3), np.arange(40), index=np.arange(40)), CPU, 8, seed=1)
    with pytest.raises(OSError, match="disk gone"):
        bad.next()
    bad.close()


def test_resumed_optimizer_keeps_this_runs_flags():
    p = torch.nn.Parameter(torch.ones(3))
    old = torch.optim.Adam([p], lr=1e-3, foreach=False)
    p.grad = torch.ones(3)
    old.step()
    new = adam([p], 1e-3, CPU)
    flags = (new.param_groups[0]["fused"], new.param_groups[0]["capturable"])
    new.load_state_dict(old.state_dict())
    restore_optimizer_flags(new, *flags)
    assert (new.param_groups[0]["fused"], new.param_groups[0]["capturable"]) == flags
    assert float(new.state[p]["step"]) == 1.0
    new.step()  # the restored state steps
    assert float(new.state[p]["step"]) == 2.0


def test_cuda_graphs_setting_is_checked():
    with pytest.raises(ReservoirError, match="--cuda-graphs must be auto, on or off, found 'yes'"):
        TrainConfig(task="bit-xor", cuda_graphs="yes")
    config = TrainConfig(task="bit-xor", backbone="tiny-gpt2", task_params={"n_train": 60, "n_test": 20})
    _, model, data = build(config, CPU)
    _freeze(model, data, config)
    import threading

    readers = {t for t in threading.enumerate() if t.name == "reservoir-batches"}
    with pytest.raises(ReservoirError, match="--cuda-graphs on needs a CUDA device.*found the device is cpu"):
        Stepper(model, adam(list(model.head.parameters()), 1e-3, CPU), data.train, CPU, 16, 0, cuda_graphs="on")
    # the refused stepper's batch reader is stopped, not left waiting for room in its queue for ever
    assert {t for t in threading.enumerate() if t.name == "reservoir-batches" and t.is_alive()} <= readers


def test_loss_scaled_steps_train_what_plain_steps_train():
    """The fp16 path's GradScaler (CUDA only in runs), driven on the CPU: a power-of-two scale changes no weight, and
    steps whose scaled gradients overflow are skipped while the scale backs off."""
    config = TrainConfig(task="bit-xor", backbone="tiny-gpt2", task_params={"n_train": 100, "n_test": 20}, amp="none")
    weights, scales = {}, {}
    for name, init_scale in (("plain", None), ("scaled", 2.0**12), ("overflow", 3e38)):
        _, model, data = build(config, CPU)
        _freeze(model, data, config)
        start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        stepper = Stepper(model, adam([p for p in model.parameters() if p.requires_grad], 1e-3, CPU), data.train,
                          CPU, 16, 0, amp="none", grad_clip=1.0)
        assert stepper.scaler is None  # no fp16 on the CPU
        if init_scale is not None:
            stepper.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        stepper.run(4)
        stepper.close()
        weights[name] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        scales[name] = None if stepper.scaler is None else stepper.scaler.get_scale()
    for key in weights["plain"]:
        torch.testing.assert_close(weights["scaled"][key], weights["plain"][key], rtol=0, atol=0)
        torch.testing.assert_close(weights["overflow"][key], start[key], rtol=0, atol=0)  # every step skipped
    assert scales["scaled"] == 2.0**12 and scales["overflow"] == pytest.approx(3e38 / 2**4)


def test_train_cli_refuses_cuda_graphs_on_the_cpu(tmp_path):
    r = invoke("train", "--task", "bit-xor", "-p", "n_train=60", "-p", "n_test=20", "--backbone", "tiny-gpt2",
               "--steps", "2", "--device", "cpu", "--cuda-graphs", "on", "--out", tmp_path / "run", "--quiet")
    assert r.exit_code == 2
    assert "--cuda-graphs on needs a CUDA device" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()  # refused before the run folder is made (an empty one was left)


def test_bench_train_cli(tmp_path):
    args = ["bench", "train", "--task", "bit-xor", "-p", "n_train=200", "-p", "n_test=20", "--backbone", "tiny-gpt2",
            "--device", "cpu", "--steps", "6", "--warmup", "2"]
    r = invoke(*args, "--amp", "none", "--out", tmp_path / "b.json")
    assert r.exit_code == 0, r.output
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["kind"] == "bench-train" and b["steps"] == 6 and b["warmup"] == 2
    assert b["ratio"] == pytest.approx(b["project"]["step_ms"] / b["plain"]["step_ms"])
    assert b["project"]["mode"] == "eager" and b["parameters"]["trainable"] < b["parameters"]["total"]
    assert f"project step / plain step = {b['ratio']:.3f}" in r.output and "plain_autocast" not in b
    # the two sides took the same batches from the same weights: their mean losses agree
    assert b["project"]["final_loss"] == pytest.approx(b["plain"]["final_loss"], rel=1e-4)
    # in bf16 the obvious CPU loop stays float32, and the same loop under autocast is timed beside it
    r = invoke(*args, "--amp", "bf16", "--out", tmp_path / "bf16.json")
    assert r.exit_code == 0, r.output
    b = json.loads((tmp_path / "bf16.json").read_text())
    assert b["compute_dtype"] == "bfloat16" and b["plain"]["compute_dtype"] == "float32"
    assert b["plain_autocast"]["compute_dtype"] == "bfloat16"
    assert f"project step / plain step under autocast = {b['ratio_autocast']:.3f}" in r.output
    assert b["project"]["final_loss"] == pytest.approx(b["plain_autocast"]["final_loss"], rel=2e-2)
    bad = invoke("bench", "train", "--task", "bit-xor", "--backbone", "tiny-gpt2", "--steps", "0")
    assert bad.exit_code == 2 and "--steps: expected 1..1,000,000,000, found 0" in bad.output
    lstm = invoke("bench", "train", "--task", "bit-xor", "-p", "n_train=60", "-p", "n_test=20", "--backbone",
                  "lstm-1x16", "--init", "random", "--device", "cpu", "--steps", "1", "--warmup", "1")
    assert lstm.exit_code == 2 and "has none" in lstm.output


def test_attention_backends_leave_out_cudnn_reusably_and_restore():
    """The CUDA forward context: every SDPA backend but cuDNN's, entered again and nested, restored on exit."""
    import contextlib

    from reservoir.runtime import attention_backends, forward_context

    cuda_ctx = attention_backends(torch.device("cuda"))  # toggles dispatch flags only: no GPU needed
    before = torch.backends.cuda.cudnn_sdp_enabled()
    for _ in range(2):  # one object serves every forward of a pass
        with cuda_ctx:
            with cuda_ctx:
                assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    assert isinstance(attention_backends(CPU), contextlib.nullcontext)
    from reservoir.backbones import load_backbone

    bert = load_backbone("tiny-bert", d_in=3)
    assert isinstance(forward_context(bert, CPU, "none"), contextlib.nullcontext)  # float32: nothing to set
    assert isinstance(forward_context(bert, CPU, "bf16"), torch.autocast)  # the CPU's bf16: autocast
