"""``reservoir bench train``: the project's training step against a plain PyTorch loop over the Hugging Face model.

In one run, on one task, backbone, depth, freeze scheme and batch size:

* **project**: the step ``reservoir train`` runs
  (:class:`~reservoir.training.step.Stepper`: batches prepared ahead, the loss
  kept on the device, fused Adam, the step captured as a CUDA graph where every
  row has one length);
* **plain**: the same model written the obvious way: the Hugging Face model's
  own forward from input embeddings with its attention mask, a gather of the
  last real token, a linear head, ``F.cross_entropy``, ``torch.optim.Adam``
  with its defaults (and a ``GradScaler`` under fp16), gradient-norm
  clipping, each batch copied to the device from host memory and its loss
  read back every step (as a loop that logs its loss does).

Both start from the same weights (the same seeded loads), train the same
parameters (the same freeze groups, applied to the same modules) under the
same autocast, and take the same batches in the same order; both are timed
after the same warm-up steps. ``project step / plain step`` below 1 means
the project's step is faster. Times are wall-clock and noisy: compare the
ratio of one run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from reservoir.bench.reference import hf_forward, load_hf_model
from reservoir.bench.result import BenchResult, peak_device_mb, peak_rss_mb
from reservoir.errors import ReservoirError
from reservoir.runtime import autocast, compute_dtype, compute_path, resolve_device
from reservoir.runtime import synchronize as _sync


def _check_plain(backbone: str) -> None:
    """Refuse (one line) a backbone the plain loop cannot run: the LSTM baseline has no Hugging Face model."""
    from reservoir.backbones.names import lstm_spec

    if lstm_spec(backbone) is not None:
        raise ReservoirError(f"bench train compares against a Hugging Face model; backbone {backbone!r} (the LSTM "
                             "baseline) has none")


class PlainLoop:
    """The obvious training loop over the bare Hugging Face model, with the project model's trainable groups.

    Parameters
    ----------
    config : TrainConfig
        The run (task, backbone, init, depth, groups, lr, batch size, seed, amp, clip).
    task : Task
        The loaded task (its train split is fed as :class:`~reservoir.training.TrainData` carves it).
    feeder : Feeder
        The training rows (the same as the project's).
    device : torch.device
    info : BackboneInfo
        The project backbone's provenance (the same load).

    Attributes
    ----------
    model : ReservoirClassifier
        The bare HF model's modules seen as a reservoir (same parameter names
        as the project's model); the forward below does not use its code.
    """

    def __init__(self, config, task, feeder, device: torch.device, info, amp: str | None = None):
        from reservoir.backbones.arch import arch_for
        from reservoir.backbones.projection import input_projection
        from reservoir.backbones.model import Backbone
        from reservoir.training import ReservoirClassifier, heads_per_token
        from reservoir.training.data import EpochOrder
        from reservoir.training.freeze import apply_freeze, parse_groups
        from reservoir.training.loop import _set_dropout

        _check_plain(config.backbone)
        hf = load_hf_model(config.backbone, config.init, config.seed, depth=info.depth)  # the same depth K
        projection = input_projection(config.projection, task.d_in, int(hf.config.hidden_size), config.projection_gain,
                                      config.seed)
        view = Backbone(hf, arch=arch_for(hf.config.model_type), depth=info.depth, projection=projection, info=info)
        n_heads = heads_per_token(task.label_shape, task.n_out_tokens)
        self.model = ReservoirClassifier(view, task.n_out_tokens, n_heads, task.n_classes, seed=config.seed)
        hf.requires_grad_(False)
        apply_freeze(view, self.model.head, parse_groups(config.finetune), first_block=0)
        self.hf = hf.to(device)
        self.model.to(device)
        _set_dropout(self.hf, config.dropout)
        self.hf.train(config.dropout > 0)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=config.lr)
        self.config, self.feeder, self.device = config, feeder, device
        self.amp = config.amp if amp is None else amp
        # fp16 the obvious way too: torch.amp.GradScaler, as the project's step
        fp16 = device.type == "cuda" and compute_dtype(device, self.amp) == torch.float16
        self.scaler = torch.amp.GradScaler(device.type) if fp16 else None
        self.order = EpochOrder(len(feeder), config.batch_size, config.seed)
        self.step_index = 0
        self.losses: list[float] = []

    def step(self) -> None:
        """One step, the obvious way: batch to the device, HF forward, loss, backward, clip, Adam, loss logged."""
        from reservoir.backbones.model import last_token_index

        rows = self.order.rows(self.step_index)
        self.step_index += 1
        x, lengths, y = self.feeder.batch(rows, self.device)
        L = x.shape[1]
        mask = (torch.arange(L, device=self.device)[None, :] < lengths[:, None]).long()  # (B, L)
        m = self.model
        with autocast(self.device, self.amp):
            h = hf_forward(self.hf, m.backbone.project(x), mask).last_hidden_state  # (B, L, n_dim), final norm in
            r, idx = last_token_index(lengths, m.n_out_tokens)
            logits = m.head(h[r, idx]).view(len(y), m.n_out_tokens, m.n_heads, m.n_classes)
        loss = F.cross_entropy(logits.float().reshape(-1, m.n_classes), y.reshape(-1))
        self.opt.zero_grad()
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        if self.scaler is None:
            self.opt.step()
        else:
            self.scaler.step(self.opt)
            self.scaler.update()
        self.losses.append(loss.item())

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()


def _timed(run, n: int, device: torch.device) -> float:
    """Seconds for ``run(n)``, from a drained device to a drained device."""
    _sync(device)
    t0 = time.perf_counter()
    run(n)
    _sync(device)
    return time.perf_counter() - t0


def bench_train(config, steps: int = 50, warmup: int = 10) -> BenchResult:
    """Time ``steps`` training steps of the project and of the plain loop, each after ``warmup`` steps.

    Parameters
    ----------
    config : TrainConfig
        What to train (``steps``/``epochs`` and ``out`` are ignored; nothing is written).
    steps, warmup : int
        Timed steps and warm-up steps per side (the same batches on both sides).

    Returns
    -------
    BenchResult
        ``kind="bench-train"``: ``project`` and ``plain`` (``step_ms``,
        ``steps_per_s``, ``peak_device_mb``, ``final_loss``), ``ratio``
        (project step / plain step), the step mode, trainable and total
        parameter counts, the device and compute dtype.

    Examples
    --------
    >>> from reservoir.training import TrainConfig
    >>> r = bench_train(TrainConfig(task="bit-xor", backbone="tiny-gpt2", device="cpu"), steps=5, warmup=2)
    ... # doctest: +SKIP
    >>> r["ratio"]  # doctest: +SKIP
    """
    from reservoir.training import build
    from reservoir.training.loop import ready_to_train
    from reservoir.training.step import GRAPH_WARMUP_STEPS, Stepper

    if steps < 1 or warmup < 1:
        raise ReservoirError(f"bench train needs at least 1 timed and 1 warm-up step, found {steps} and {warmup}")
    _check_plain(config.backbone)  # before the project's side is timed
    device = resolve_device(config.device)
    task, model, data = build(config, device)
    if config.batch_size > len(data.train):  # a step would take every row, not the batch the result names
        raise ReservoirError(f"--batch-size must be at most the {len(data.train):,} training rows (after the "
                             f"validation carve), found {config.batch_size:,}")
    counts, opt = ready_to_train(model, data, config)
    stepper = Stepper(model, opt, data.train, device, config.batch_size, config.seed, amp=config.amp,
                      grad_clip=config.grad_clip, cuda_graphs=config.cuda_graphs, compile=config.compile)
    if stepper.use_graph and warmup <= GRAPH_WARMUP_STEPS:  # the capture would be timed as one of the steps
        stepper.close()
        raise ReservoirError(f"--warmup must be at least {GRAPH_WARMUP_STEPS + 1} where the step is captured as a "
                             f"CUDA graph ({GRAPH_WARMUP_STEPS} eager steps, then the capture, precede the timed "
                             f"steps), found {warmup}")
    r: dict[str, Any] = {
        "task": task.name, "task_params": task.params, "backbone": model.backbone.info.to_dict(),
        "depth": model.backbone.depth, "finetune": config.finetune, "batch_size": config.batch_size,
        "n_train": len(data.train), "max_length": task.max_length, "device": str(device),
        "compute_dtype": str(compute_dtype(device, config.amp)).replace("torch.", ""),
        "compute_path": compute_path(device, config.amp),
        "torch_threads": torch.get_num_threads(), "steps": steps, "warmup": warmup, "parameters": counts,
        "settings": {k: getattr(config, k) for k in ("init", "lr", "seed", "grad_clip", "amp", "cuda_graphs",
                                                      "compile", "dropout")},
    }
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        stepper.run(warmup)
        stepper.mean_loss()
        seconds = _timed(stepper.run, steps, device)
        r["project"] = {"step_ms": 1e3 * seconds / steps, "steps_per_s": steps / seconds,
                        "peak_device_mb": peak_device_mb(device), "final_loss": stepper.mean_loss(),
                        "mode": stepper.mode, "eager_because": stepper.why_eager}
    finally:
        stepper.close()
    info = model.backbone.info
    del stepper, opt, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    # the obvious loop: autocast on CUDA, float32 on the CPU (where a user seldom reaches for autocast); on a CPU
    # computing in bf16, the same loop under the project's autocast as well
    sides = {"plain": config.amp if device.type == "cuda" else "none"}
    if device.type == "cpu" and compute_dtype(device, config.amp) != torch.float32:
        sides["plain_autocast"] = config.amp
    for side, amp in sides.items():
        plain = PlainLoop(config, task, data.train, device, info, amp=amp)
        plain.run(warmup)
        seconds = _timed(plain.run, steps, device)
        r[side] = {"step_ms": 1e3 * seconds / steps, "steps_per_s": steps / seconds, "amp": amp,
                   "compute_dtype": str(compute_dtype(device, amp)).removeprefix("torch."),
                   "peak_device_mb": peak_device_mb(device), "final_loss": float(np.mean(plain.losses[-steps:]))}
        del plain
    r["ratio"] = r["project"]["step_ms"] / r["plain"]["step_ms"]
    if "plain_autocast" in r:
        r["ratio_autocast"] = r["project"]["step_ms"] / r["plain_autocast"]["step_ms"]
    r["peak_rss_mb"] = peak_rss_mb()
    return BenchResult("bench-train", r)


def format_train(r: BenchResult) -> str:
    """The benchmark as the lines ``reservoir bench train`` prints."""
    p, q = r["project"], r["plain"]
    counts = r["parameters"]
    mode = p["mode"] + ("" if p["mode"] != "eager" or not p["eager_because"] else f" ({p['eager_because']})")

    def mem(side):
        return "" if side["peak_device_mb"] is None else f"{side['peak_device_mb']:14,.0f}"

    head = f"{'':<32} {'step ms':>9} {'steps/s':>9}"
    head += "" if p["peak_device_mb"] is None else f" {'peak device MB':>14}"
    q2 = r.get("plain_autocast")
    lines = [
        f"{r['task']} through {r['backbone']['id']} ({r['backbone']['init']}), depth {r['depth']}, "
        f"finetune {r['finetune']} ({counts['trainable']:,} of {counts['total']:,} parameters), batch "
        f"{r['batch_size']}, {r['device']} ({r.get('compute_path', r['compute_dtype'])}), {r['torch_threads']} threads",
        f"project step: {mode}",
        head,
        f"{'project (reservoir train)':<32} {p['step_ms']:9.3f} {p['steps_per_s']:9.1f} {mem(p)}".rstrip(),
        f"{'plain (HF model, Adam, ' + q.get('compute_dtype', r['compute_dtype']) + ')':<32} {q['step_ms']:9.3f} "
        f"{q['steps_per_s']:9.1f} {mem(q)}".rstrip(),
    ]
    if q2 is not None:
        lines.append(f"{'plain under autocast (' + q2['compute_dtype'] + ')':<32} {q2['step_ms']:9.3f} "
                     f"{q2['steps_per_s']:9.1f} {mem(q2)}".rstrip())
    lines.append(f"project step / plain step = {r['ratio']:.3f}")
    if q2 is not None:
        lines.append(f"project step / plain step under autocast = {r['ratio_autocast']:.3f}")
    losses = f"project {p['final_loss']:.4f}, plain {q['final_loss']:.4f}"
    if q2 is not None:
        losses += f", plain under autocast {q2['final_loss']:.4f}"
    lines.append(f"({r['steps']} steps timed on each side after {r['warmup']} warm-up steps, the same batches; mean "
                 f"training loss over them: {losses}; peak host memory {r['peak_rss_mb']:,.0f} MB)")
    if r["device"].startswith("cuda"):  # what a plain loop gets without asking, which the project's step does not use
        lines.append("(the plain loop's attention takes PyTorch's default dispatch, cuDNN included, which plans each "
                     "new input shape; the project's excludes cuDNN)")
    return "\n".join(lines)


__all__ = ["PlainLoop", "bench_train", "format_train"]
