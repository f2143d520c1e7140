"""What caching buys: cached vs live training cost, measured in one run on the same data.

``reservoir bench speedup`` measures, on one task, backbone and depth:

* the one-time costs: the setup both ways pay (loading the task and the
  model), the extraction pass and a bare forward of the same model over the
  same batches, so the pass's overhead is a ratio;
* (a) one epoch of output-only training: live (frozen forward every batch,
  then the head update) vs from the store (:class:`~reservoir.training.cached.CachedHead`:
  features resident on the device, a few fused operations a step), at the
  asked batch size (Lu et al. train with batches of up to 16) and at a large
  batch (1024, or every timed row when fewer: one batch size for both sides);
* (b) layernorm tuning of blocks ``s+1..K``: live (blocks ``1..K`` forward,
  backward through the top blocks) vs from a split-point store at layer ``s``
  (blocks ``s+1..K`` only).

An epoch is what both sides run, live and cached: ``n_train // batch``
whole batches (the last partial batch is dropped). Live epochs run
``reservoir train``'s step (:class:`~reservoir.training.step.Stepper`) on at
most ``max_live_rows`` rows, and their time per step is scaled to the
epoch's steps (a step's cost is flat across an epoch); cached epochs are
timed whole, repeated for half a second and averaged.
The split-point store keeps every position of every row, so it is extracted
for the timed rows only and its cost scaled to the epoch. Every timed part
follows warm-up steps (live: including the CUDA graph capture). The break-even point is the number of epochs after
which extracting first was cheaper than training live: what only caching
pays once (the pass, and reading the store back: ``cached_extra_s``) over
what it saves per epoch. The pass counted is over every split, though a live
run also runs its validation and test rows forward to evaluate: the
break-even point errs late. The setup (task and model loads) is paid by a live
run too and is not counted. Times are wall-clock on this machine and noisy:
compare ratios from one run, not seconds across runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reservoir import options
from reservoir.bench.result import BenchResult
from reservoir.errors import ReservoirError
from reservoir.io import scratch_folder
from reservoir.runtime import cast_frozen_matmuls, check_seed, compute_dtype, resolve_device
from reservoir.runtime import synchronize as _sync

#: The large batch of (a); both sides use fewer when a live epoch is timed on fewer rows.
LARGE_BATCH = 1024


def _time_steps(model, feeder, batch_size: int, seed: int, device, amp: str = options.AMP.default
                ) -> tuple[float, int, str]:
    """Seconds for an epoch of ``feeder``'s rows as ``reservoir train`` steps them, the rows they took, the step mode.

    The steps are the live loop's (:class:`~reservoir.training.step.Stepper`:
    batches ahead, autocast on CUDA, fused Adam, a CUDA graph where every row
    has one length), after warm-up steps that include any graph capture.
    """
    from reservoir.training.step import GRAPH_WARMUP_STEPS, Stepper, adam

    params = [p for p in model.parameters() if p.requires_grad]
    stepper = Stepper(model, adam(params, 1e-3, device), feeder, device, batch_size, seed, amp=amp)
    n_steps = max(1, len(feeder) // batch_size)
    try:
        stepper.run(GRAPH_WARMUP_STEPS + 1)  # warm-up: kernel selection, optimizer state, graph capture
        _sync(device)
        t0 = time.perf_counter()
        stepper.run(n_steps)
        _sync(device)
        seconds = time.perf_counter() - t0
        mode = stepper.mode
    finally:
        stepper.close()
    return seconds, n_steps * min(batch_size, len(feeder)), mode


def _epoch_s(seconds: float, rows_timed: int, batch_size: int, n_rows: int) -> float:
    """An epoch's seconds from ``seconds`` timed over ``rows_timed`` rows in whole batches: the time per step
    times the epoch's ``n_rows // batch_size`` steps (what a cached or a live epoch of ``n_rows`` rows runs)."""
    return seconds / max(1, rows_timed // batch_size) * max(1, n_rows // batch_size)


def _time_cached(head: torch.nn.Linear, X: torch.Tensor, Y: torch.Tensor, n_classes: int, batch_size: int,
                 seed: int, device, min_seconds: float = 0.5) -> float:
    """Seconds per cached epoch of a copy of ``head``: epochs repeated for at least ``min_seconds``, after a warm-up
    step and a warm-up epoch.

    One epoch of a small head lasts milliseconds, too short to time alone on a
    shared machine; the mean over repeated epochs is the epoch's cost.
    """
    import copy

    from reservoir.training.cached import CachedHead

    trainer = CachedHead(copy.deepcopy(head), X, Y, n_classes)
    order = trainer.epoch_order(seed, 0)
    trainer.step(order[: min(batch_size, len(order))])
    trainer.run(order, batch_size)  # warm-up epoch: any CUDA graph is captured here, not in the timed epochs
    _sync(device)
    epochs, t0 = 0, time.perf_counter()
    while True:
        trainer.run(order, batch_size)
        epochs += 1
        _sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return elapsed / epochs


def head_step_ms(n_dim: int = 768, n_classes: int = 10, batch_size: int = 16, n_rows: int = 4096,
                 device="cpu", seed: int = 0) -> float:
    """Milliseconds of one cached Adam step of an ``n_dim x n_classes`` head on random resident features."""
    device = resolve_device(device)
    n_rows = max(n_rows, batch_size)  # at least one whole batch
    gen = torch.Generator().manual_seed(check_seed(seed))
    X = torch.randn(n_rows, 1, n_dim, generator=gen).to(device)
    Y = torch.randint(0, n_classes, (n_rows, 1, 1), generator=gen).to(device)
    epoch_s = _time_cached(torch.nn.Linear(n_dim, n_classes).to(device), X, Y, n_classes, batch_size, seed, device)
    return 1e3 * epoch_s / (n_rows // batch_size)


def speedup(
    task: str,
    task_params: dict[str, Any] | None = None,
    backbone: str = options.DEFAULT_BACKBONE,
    init: str = "pretrained",
    layers: int | None = None,
    split_layer: int | None = None,
    batch_size: int = 16,
    max_live_rows: int = 1024,
    seed: int = 0,
    device: str = "auto",
    progress: bool = False,
    amp: str = options.AMP.default,
) -> BenchResult:
    """Measure cached vs live training cost per epoch; every timing and ratio (``kind="bench-speedup"``).

    Examples
    --------
    >>> r = speedup("bit-xor", {"n_train": 256, "n_test": 64}, backbone="tiny-gpt2")  # doctest: +SKIP
    >>> r["output_only"]["speedup"]  # doctest: +SKIP
    """
    from reservoir.backbones import load_backbone
    from reservoir.bench.extract import time_pass
    from reservoir.extract import ExtractConfig, prepare

    if batch_size < 1 or max_live_rows < 1:
        raise ReservoirError(f"batch size and max live rows must be >= 1, found {batch_size}, {max_live_rows}")
    base = ExtractConfig(task=task, task_params=dict(task_params or {}), backbone=backbone, init=init, layers=layers,
                         seed=seed, device=device, dtype="float32", amp=amp)
    prep = prepare(base)
    data, dev, K = prep.task, prep.device, prep.backbone.depth
    if K < 1:  # (b) trains the top block from the states below it: there must be one
        raise ReservoirError(f"bench speedup needs a depth of at least 1 (--layers), found {K}")
    s = K - 1 if split_layer is None else split_layer
    if not 0 <= s < K:
        raise ReservoirError(f"--split-layer must be within 0..{K - 1} (below the depth {K}), found {s}")
    n_train = len(data.splits["train"])
    if batch_size > min(n_train, max_live_rows):  # an epoch must hold at least one whole batch
        raise ReservoirError(f"--batch-size must be at most the {min(n_train, max_live_rows):,} rows an epoch is "
                             f"timed on (train rows, --max-live-rows), found {batch_size:,}")
    large = min(LARGE_BATCH, n_train, max_live_rows)  # the rows a live epoch is timed on bound both sides' batch
    result: dict[str, Any] = {"task": data.name, "task_params": data.params, "backbone": prep.backbone.info.to_dict(),
                              "depth": K, "split_layer": s, "batch_size": batch_size, "large_batch": large,
                              "n_train": len(data.splits["train"]), "device": str(dev),
                              "torch_threads": torch.get_num_threads(), "seed": seed, "amp": amp,
                              "max_live_rows": max_live_rows,
                              "compute_dtype": str(compute_dtype(dev, amp)).removeprefix("torch.")}
    # live training keeps float32 weights (autocast on CUDA), as `reservoir train` does
    live_bb = prep.backbone if next(prep.backbone.parameters()).dtype == torch.float32 else load_backbone(
        backbone, init=init, depth=K, d_in=data.d_in, seed=seed).to(dev)
    timing = _Timing(data, live_bb, dev, batch_size, large, max_live_rows, seed, amp)

    with scratch_folder("bench") as tmp:
        # one-time costs: the setup both ways pay (task, model); the pass (store written) vs the bare forward on the
        # same batches, which only caching pays
        t = time_pass(prep, Path(tmp) / "last.zarr", "zarr", progress)
        result.update(task_s=prep.timings["task_s"], model_s=prep.timings["model_s"], pass_s=t["pass_s"],
                      bare_forward_s=t["bare_forward_s"], extract_overhead=t["pass_s"] / t["bare_forward_s"])
        result["setup_s"] = result["task_s"] + result["model_s"]
        result["output_only"] = timing.output_only(t["path"], K, result["pass_s"])
        # (b) a split-point store at layer s (float16, extract's default), extracted for the timed rows only; a
        # store for `train --from-store` holds every split: its pass is scaled to the rows of them all
        timed = timing.timed_rows()
        sprep = prepare(ExtractConfig(**{**base.__dict__, "full_seq_layer": s, "dtype": "float16"}),
                        task=_subset(data, timed))
        st_t = time_pass(sprep, Path(tmp) / "split.zarr", "zarr", progress, bare=False)
        split_pass_s = st_t["pass_s"] * sum(len(sp) for sp in data.splits.values()) / len(timed)
        result["layernorm_top"] = timing.layernorm_top(st_t["path"], timed, s, K, split_pass_s)
    return BenchResult("bench-speedup", result)


class _Timing:
    """The live and cached epochs of one task and backbone, timed on the same rows and batches."""

    def __init__(self, data, live_bb, device, batch_size: int, large_batch: int, max_live_rows: int, seed: int,
                 amp: str):
        from reservoir.training import heads_per_token

        self.data, self.live_bb, self.dev, self.amp = data, live_bb, device, amp
        self.batch_size, self.large_batch, self.max_live_rows, self.seed = batch_size, large_batch, max_live_rows, seed
        tr = data.splits["train"]
        self.n = len(tr)
        self.n_heads = heads_per_token(data.label_shape, data.n_out_tokens)

    def timed_rows(self) -> np.ndarray:
        """The train rows live epochs are timed on (sorted): a seeded ``max_live_rows`` of them."""
        return np.sort(np.random.default_rng(self.seed).permutation(self.n)[: self.max_live_rows])

    def model(self, groups: tuple[str, ...], first_block: int = 0, states: bool = False):
        from reservoir.training import ReservoirClassifier
        from reservoir.training.freeze import apply_freeze

        d = self.data
        model = ReservoirClassifier(self.live_bb, d.n_out_tokens, self.n_heads, d.n_classes, seed=self.seed)
        apply_freeze(self.live_bb, model.head, groups, first_block=first_block, states=states)
        model = model.to(self.dev)
        cast_frozen_matmuls(self.live_bb, compute_dtype(self.dev, self.amp))  # as `reservoir train` does
        return model

    def output_only(self, store: Path, layer: int, pass_s: float) -> dict[str, Any]:
        """(a) Live forward + head vs the head on resident cached features, at the batch size and at the large batch.

        ``cached_extra_s`` is what only caching pays: the pass (``pass_s``) and reading the train features back
        onto the device (``store_read_s``); ``break_even_epochs`` divides it by the saving per epoch (``None``
        where caching saves nothing per epoch: it never breaks even).
        """
        from reservoir.readouts.features import load_layer
        from reservoir.store import FeatureStore
        from reservoir.training import Feeder
        from reservoir.training.cached import resident

        model = self.model(("output",))
        t0 = time.perf_counter()
        with FeatureStore.open(store) as st:
            X, Y = resident(*load_layer(st, "train", layer), self.data.n_out_tokens, self.dev)
        _sync(self.dev)
        out: dict[str, Any] = {"store_read_s": time.perf_counter() - t0}
        out["cached_extra_s"] = pass_s + out["store_read_s"]
        timed = self.timed_rows()
        feeder = Feeder.from_split(self.data.splits["train"], timed)
        for key, b in (("", self.batch_size), ("large_batch_", self.large_batch)):  # both <= the timed rows
            seconds, live_rows, mode = _time_steps(model, feeder, b, self.seed, self.dev, self.amp)
            t_live = _epoch_s(seconds, live_rows, b, self.n)  # the cached epoch's steps, at the live step's cost
            t_cached = _time_cached(model.head, X, Y, model.n_classes, b, self.seed, self.dev)
            steps = max(1, self.n // b)
            out.update({f"{key}live_epoch_s": t_live, f"{key}cached_epoch_s": t_cached,
                        f"{key}cached_step_ms": 1e3 * t_cached / steps, f"{key}speedup": t_live / t_cached})
            if not key:
                out.update(live_rows_timed=live_rows, live_step_mode=mode,
                           break_even_epochs=_break_even(out["cached_extra_s"], t_live - t_cached))
        out["head_768x10_step_ms"] = head_step_ms(batch_size=self.batch_size, device=self.dev)
        return out

    def layernorm_top(self, split_store: Path, timed: np.ndarray, s: int, K: int, split_pass_s: float
                      ) -> dict[str, Any]:
        """(b) Layernorm tuning of blocks s+1..K: live vs from the split-point store of the ``timed`` rows.

        The split-point side trains as ``train --from-store`` does: its batches read from the store every
        step (:func:`~reservoir.training.stores.build_from_store`'s feeder), so the reading is in each epoch.
        ``cached_extra_s`` is what only the split-point store pays: its pass (``split_pass_s``, scaled to the rows
        of every split).
        """
        from reservoir.store import FeatureStore
        from reservoir.training import Feeder

        model = self.model(("layernorm", "output"), first_block=s, states=True)  # one trained set, live and split
        b = min(self.batch_size, len(timed))
        seconds, rows, _ = _time_steps(model, Feeder.from_split(self.data.splits["train"], timed), b, self.seed,
                                       self.dev, self.amp)
        t_live = _epoch_s(seconds, rows, b, self.n)
        with FeatureStore.open(split_store) as st:  # the feeder build_from_store makes: the store's arrays
            feeder = Feeder(st.states("train"), st.lengths("train"), st.labels("train"), start=s)
            seconds, rows, _ = _time_steps(model, feeder, b, self.seed, self.dev, self.amp)
        t_split = _epoch_s(seconds, rows, b, self.n)
        return {"blocks_trained": list(range(s + 1, K + 1)), "live_epoch_s": t_live, "split_store_epoch_s": t_split,
                "speedup": t_live / t_split, "rows_timed": len(timed), "split_pass_s": split_pass_s,
                "cached_extra_s": split_pass_s, "break_even_epochs": _break_even(split_pass_s, t_live - t_split)}


def _subset(task, rows: np.ndarray):
    """The task with only ``rows`` of its train split (what the split-point store is extracted for)."""
    from dataclasses import replace

    from reservoir.tasks import Split

    tr = task.splits["train"]
    sub = Split(np.asarray(tr.inputs[rows]), tr.lengths[rows], tr.labels[rows])
    return replace(task, splits={"train": sub}, fingerprint=f"{task.fingerprint}:rows{len(rows)}")


def _break_even(once_s: float, saved_per_epoch_s: float) -> float | None:
    """Epochs after which what caching pays once (``once_s``) is repaid, or ``None`` when an epoch saves nothing."""
    return once_s / saved_per_epoch_s if saved_per_epoch_s > 0 else None


def _epochs(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def format_speedup(r: BenchResult) -> str:
    """The benchmark as a small text table."""
    a, b = r["output_only"], r["layernorm_top"]
    big = r["large_batch"]
    lines = [
        f"{r['task']} through {r['backbone']['id']} ({r['backbone']['init']}), depth {r['depth']}, "
        f"{r['n_train']} train rows, batch {r['batch_size']}, {r['device']}"
        + (f" ({r['compute_dtype']})" if "compute_dtype" in r else "") + f", {r['torch_threads']} threads",
        f"one-time setup, paid live and cached: task {r['task_s']:.2f} s + model {r['model_s']:.2f} s = "
        f"{r['setup_s']:.2f} s",
        f"one-time, paid only cached (a): pass {r['pass_s']:.2f} s + store read {a['store_read_s']:.2f} s = "
        f"{a['cached_extra_s']:.2f} s; bare forward {r['bare_forward_s']:.2f} s; pass / bare forward = "
        f"{r['extract_overhead']:.2f}",
        f"one-time, paid only cached (b): split-point pass {b['split_pass_s']:.2f} s (scaled from {b['rows_timed']} "
        "rows to every split's; its states are read from the store every epoch, as train --from-store reads them)",
        f"{'per epoch':<34} {'live s':>9} {'cached s':>9} {'step ms':>8} {'speedup':>9} {'break-even epochs':>18}",
        f"{'(a) output layer only':<34} {a['live_epoch_s']:9.2f} {a['cached_epoch_s']:9.4f} "
        f"{a['cached_step_ms']:8.3f} {a['speedup']:8.0f}x {_epochs(a['break_even_epochs']):>18}",
        f"{'    at batch ' + str(big):<34} {a['large_batch_live_epoch_s']:9.2f} "
        f"{a['large_batch_cached_epoch_s']:9.4f} {a['large_batch_cached_step_ms']:8.3f} "
        f"{a['large_batch_speedup']:8.0f}x",
        f"{'(b) layernorm, blocks ' + str(b['blocks_trained'][0]) + '..' + str(b['blocks_trained'][-1]):<34} "
        f"{b['live_epoch_s']:9.2f} {b['split_store_epoch_s']:9.3f} {'':>8} {b['speedup']:8.1f}x "
        f"{_epochs(b['break_even_epochs']):>18}",
        f"(an epoch: {r['n_train']} // batch whole batches, both ways; live steps timed on {a['live_rows_timed']} rows "
        f"({a.get('live_step_mode', 'eager')}), cached epochs repeated for 0.5 s and averaged; break-even epochs = "
        f"what only caching pays once / what it saves per epoch, the setup not counted)",
        f"cached step of a 768 x 10 head at batch {r['batch_size']}: {a['head_768x10_step_ms']:.3f} ms",
    ]
    return "\n".join(lines)
