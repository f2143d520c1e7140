"""``reservoir bench extract``: what extraction costs beyond the model's own forward.

In one run, on one task, backbone and depth, over the same windows and
batches:

(a) ``extract`` end to end into a temporary store, split into task loading,
    model loading and the pass (forwards, device-to-host copies, store writes);
(b) the bare forward of the same truncated model: inputs to the device and
    ``Backbone.features``, nothing copied back;
(c) the Hugging Face model's own forward (same depth, same dtype, SDPA with
    PyTorch's default backend choice, its own attention mask) on the same
    batches;
(d) the naive way, as the official FPT code runs a model: the full model with
    ``output_hidden_states=True``, every sequence padded to the task's
    maximum, float32 weights, batch 32, on some of its whole batches (and
    every split's partial last batch) and scaled by the count of whole ones.

Ratios (``pass / bare forward``, ``bare forward / HF forward``,
``naive / pass``) compare times taken minutes apart on one machine; seconds
are not comparable across runs. Each timed part follows one untimed batch
(the pass and the bare forward: the first window's largest; the Hugging
Face forward: the plan's largest; the naive way: one batch of 32), so one-time
set-up (kernels, allocator growth) is not counted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from reservoir.bench.reference import NAIVE_BATCH, hf_forward, hf_model, time_naive
from reservoir.bench.result import BenchResult, peak_device_mb, peak_rss_mb
from reservoir.io import scratch_folder
from reservoir.runtime import compute_dtype, compute_path
from reservoir.runtime import synchronize as _sync

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.store.remote import StoreURL


def bench_extract(config, naive_rows: int = 128, progress: bool = False, store_url: str | None = None) -> BenchResult:
    """Time extraction against the bare forward, the Hugging Face forward and the naive way.

    Parameters
    ----------
    config : ExtractConfig
        The extraction to measure (``out`` is ignored: a temporary store is written).
    naive_rows : int
        Rows the naive way is timed on: that many rows' worth of whole
        batches of 32 (at least one), scaled by the whole batches of all
        splits, plus every split's partial last batch, timed.
    store_url : str, optional
        An object-store prefix (``s3://bucket/prefix``): the pass is also
        timed into a new store there (removed afterwards), beside the one on
        local disk (``url_pass_s``, ``url_pass_over_bare``, ``url_over_local``).

    Returns
    -------
    BenchResult
        ``kind="bench-extract"``: seconds, ratios, token counts and peak memory; see :func:`format_extract`.

    Examples
    --------
    >>> from reservoir.extract import ExtractConfig
    >>> r = bench_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=2))  # doctest: +SKIP
    >>> r["pass_over_bare"]  # doctest: +SKIP
    """
    from reservoir.extract import prepare
    from reservoir.extract.passes import writers

    if store_url is not None:  # the bucket listed now, not after the local pass has run for minutes
        from reservoir.store.remote import StoreURL

        StoreURL(store_url).check_outside_stores()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    prep = prepare(config)
    task, bb, dev = prep.task, prep.backbone, prep.device
    dtype = compute_dtype(dev, config.amp)
    splits = task.splits.values()
    n_rows = sum(len(s) for s in splits)
    n_tokens = int(sum(int(s.lengths.sum()) for s in splits))
    r: dict[str, Any] = {
        "task": task.name, "task_params": task.params, "backbone": bb.info.to_dict(), "depth": bb.depth,
        "layers": prep.layers, "n_rows": n_rows, "tokens": n_tokens, "max_length": task.max_length,
        "batch_size": prep.batching[0], "max_tokens": prep.batching[1],
        "writers": writers(dev, config.writers)["workers"], "format": None, "device": str(dev),
        "compute_dtype": str(dtype).replace("torch.", ""), "compute_path": compute_path(dev, config.amp),
        "store_dtype": config.dtype,
        "torch_threads": torch.get_num_threads(), **prep.timings,
    }
    with scratch_folder("bench") as tmp:
        fmt = config.format or "zarr"
        path = Path(tmp) / ("store.h5" if fmt == "hdf5" else "store.zarr")
        t = time_pass(prep, path, fmt, progress)
        r["store_mb"] = _size_mb(path)
    plan = t.pop("plan")
    r.update(t)
    if store_url is not None:
        r.update(_time_url(prep, store_url, progress))
    r["padded_tokens"] = sum(_padded(s, rows, o, bound) for s, rows, o, b in plan for bound in b)
    # Hugging Face's model the way the project computes: cast to the compute dtype on CUDA, under autocast on the CPU
    r["hf_forward_s"] = _time_hf(prep, plan, dtype, autocast_cpu=dev.type == "cpu")
    if dtype != torch.float32:  # the way a user runs the model: float32 weights, no autocast
        r["hf_forward_f32_s"] = _time_hf(prep, plan, torch.float32)
    r.update(time_naive(prep, naive_rows))
    r["extract_s"] = r["task_s"] + r["model_s"] + r["pass_s"]
    r.pop("path")
    r["pass_over_bare"] = r["pass_s"] / r["bare_forward_s"]
    r["bare_over_hf"] = r["bare_forward_s"] / r["hf_forward_s"]
    if "hf_forward_f32_s" in r:
        r["bare_over_hf_f32"] = r["bare_forward_s"] / r["hf_forward_f32_s"]
    r["naive_over_pass"] = r["naive_s"] / r["pass_s"]
    if store_url is not None:
        r["url_pass_over_bare"] = r["url_pass_s"] / r["bare_forward_s"]
        r["url_over_local"] = r["url_pass_s"] / r["pass_s"]
    r["tokens_per_s"] = n_tokens / r["pass_s"]
    r["peak_rss_mb"] = peak_rss_mb()
    r["peak_device_mb"] = peak_device_mb(dev)
    return BenchResult("bench-extract", r)


def time_pass(prep, path: Path | StoreURL, fmt: str, progress: bool = False, bare: bool = True) -> dict[str, Any]:
    """Time the extraction pass into a new store at ``path`` and (``bare``) the bare forward on the same plan.

    Returns ``pass_s``, ``bare_forward_s``, ``format``, ``path``, the writer's
    account (:data:`WRITER_ACCOUNT`), the peak memory during the pass and the
    plan (``(split, rows, order, bounds)`` per window).
    """
    from dataclasses import replace

    from reservoir.extract.passes import create_store, iter_windows, write_splits

    _warm_up(prep)
    prep.config = replace(prep.config, out=str(path), format=fmt)
    store = create_store(prep, path, progress)
    r: dict[str, Any] = {"format": store.format, "path": path}
    with store:
        t0 = time.perf_counter()
        write_splits(prep, store, progress)
        store.mark_complete()
        _sync(prep.device)
        r["pass_s"] = time.perf_counter() - t0
        r.update({k: prep.timings.pop(k) for k in WRITER_ACCOUNT})
        r["peak_rss_mb_extract"] = peak_rss_mb()
        r["peak_device_mb_extract"] = peak_device_mb(prep.device)
        r["plan"] = [(w.split, w.window.rows, w.order, w.bounds)
                     for w in iter_windows(prep, store, progress=False, every_chunk=True)]
    if bare:
        r["bare_forward_s"] = _time_bare(prep, r["plan"])
    return r


#: What ``write_splits`` adds to the plan's timings: the writer threads' seconds waiting for each window's copy to
#: the host and writing it (summed over threads), the megabytes of features and states written; the pass thread's
#: seconds computing windows (on CUDA: until their kernels are queued, or until whatever in them waits for the
#: device), starting their copies to the host (pinned buffers included) and waiting for room in the writer's queue;
#: and the pass's tail (from the last window queued to every write done).
WRITER_ACCOUNT = ("copy_wait_s", "write_s", "write_mb", "run_s", "to_host_s", "submit_wait_s", "tail_s")


def _time_url(prep, prefix: str, progress: bool) -> dict[str, Any]:
    """The pass into a new store under the object-store ``prefix`` (removed afterwards): ``url_pass_s``."""
    import uuid

    from reservoir.store import remove
    from reservoir.store.remote import StoreURL

    url = StoreURL(prefix).child(f"bench-{uuid.uuid4().hex[:12]}.zarr")
    try:
        t = time_pass(prep, url, "zarr", progress, bare=False)
    finally:
        remove(url, ignore_errors=True)
    return {"url": str(url), "url_pass_s": t["pass_s"]}


def _warm_up(prep) -> None:
    """Run the largest batch of the first split's plan once: kernels chosen, allocator grown to its peak size.

    Without it the first timed part pays one-time costs (about a tenth of a
    MiniLM pass over 2,000 ListOps rows on a CPU) that the later parts do not.
    """
    from reservoir.extract.plan import WINDOW_ROWS, plan_order

    split = next(iter(prep.task.splits.values()))
    rows = np.arange(min(len(split), WINDOW_ROWS))
    order, bounds = plan_order(split.lengths[rows], *prep.batching)
    lo, hi = max(bounds, key=lambda b: _padded(split, rows, order, b))
    with torch.inference_mode(), prep.context:
        prep.engine().run(split.inputs, split.lengths, rows[order[lo:hi]], np.arange(hi - lo), [(0, hi - lo)])
    _sync(prep.device)


def _time_bare(prep, plan) -> float:
    """Seconds for the same uploads and forwards as the pass, nothing gathered, copied back or written."""
    engine = prep.engine()
    t0 = time.perf_counter()
    with torch.inference_mode(), prep.context:
        for split, rows, order, bounds in plan:
            engine.run(split.inputs, split.lengths, rows, order, bounds, keep=False)
    _sync(prep.device)
    return time.perf_counter() - t0


def _time_hf(prep, plan, dtype, autocast_cpu: bool = False) -> float:
    """Seconds for the Hugging Face model's own forward (same depth and dtype, its own mask) on the same batches;
    ``autocast_cpu``: its float32 weights under CPU autocast in ``dtype`` (how bf16 is used on a CPU)."""
    import contextlib

    bb, dev = prep.backbone, prep.device
    mixed = autocast_cpu and dtype != torch.float32
    hf = hf_model(prep, full=False, dtype=torch.float32 if mixed else dtype) if bb.arch is not None else None
    if hf is None:  # the LSTM baseline has no Hugging Face model
        return float("nan")
    engine = prep.engine()
    context = torch.autocast("cpu", dtype=dtype) if mixed else contextlib.nullcontext()

    def forward(hf, split, rows, order, bounds) -> None:
        x, lens = engine.upload(split.inputs, split.lengths, rows[order])
        sorted_len = split.lengths[rows[order]]
        for lo, hi in bounds:
            L = int(sorted_len[hi - 1])
            mask = (torch.arange(L, device=dev)[None, :] < lens[lo:hi, None]).long()  # (b, L)
            hf_forward(hf, bb.project(x[lo:hi, :L]).to(torch.float32 if mixed else dtype), mask)

    with torch.inference_mode(), context:  # as a user runs it: PyTorch's default attention dispatch
        forward(hf, *_largest_batch(plan))  # untimed, as the pass's warm-up: kernels chosen, allocator grown
        _sync(dev)
        t0 = time.perf_counter()
        for window in plan:
            forward(hf, *window)
    _sync(dev)
    seconds = time.perf_counter() - t0
    del hf  # freeing the model is not the forward's time
    return seconds


def _padded(split, rows: np.ndarray, order: np.ndarray, bound: tuple[int, int]) -> int:
    """The padded tokens of the batch ``bound`` of a window's rows sorted by ``order``: rows x its longest length
    (the last, lengths rising)."""
    lo, hi = bound
    return (hi - lo) * int(split.lengths[rows[order[hi - 1]]])


def _largest_batch(plan) -> tuple[Any, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """The plan's batch of most padded tokens, as a window of that one batch ``(split, rows, order, bounds)``."""
    (split, rows, order, _), (lo, hi) = max(((w, b) for w in plan for b in w[3]),
                                            key=lambda wb: _padded(*wb[0][:3], wb[1]))
    return split, rows[order[lo:hi]], np.arange(hi - lo), [(0, hi - lo)]


def _size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def format_extract(r: BenchResult) -> str:
    """The benchmark as the lines ``reservoir bench extract`` prints."""
    from reservoir.extract.plan import DEFAULT_BATCH_SIZE

    batches = f"{r['max_tokens']:,} tokens" if r["max_tokens"] else f"{r['batch_size'] or DEFAULT_BATCH_SIZE} rows"
    if r["max_tokens"] and r["batch_size"]:
        batches += f" / {r['batch_size']} rows"
    if r["max_tokens"] and r["max_tokens"] < r["max_length"]:  # a row longer than the budget is a batch of its own
        batches += " (a longer row alone)"
    dev_mem = "" if r["peak_device_mb"] is None else f"; device {r['peak_device_mb']:,.0f} MB"
    return "\n".join(line for line in [
        f"{r['task']} through {r['backbone']['id']} ({r['backbone']['init']}), depth {r['depth']}, "
        f"{r['n_rows']:,} rows, {r['tokens']:,} tokens ({r['padded_tokens']:,} padded), batches of {batches}, "
        f"{r['device']} ({r.get('compute_path', r['compute_dtype'])}), {r['torch_threads']} threads, {r['format']} "
        f"store ({r['store_dtype']}" + (f", {r['writers']} writer threads" if r.get("writers", 1) > 1 else "") + ")",
        f"extract: task {r['task_s']:.2f} s + model {r['model_s']:.2f} s + pass {r['pass_s']:.2f} s "
        f"= {r['extract_s']:.2f} s",
        f"bare forward {r['bare_forward_s']:.2f} s; Hugging Face forward {r['hf_forward_s']:.2f} s in "
        f"{r['compute_dtype']}" + (" (autocast)" if r['device'] == "cpu" and "hf_forward_f32_s" in r else "")
        + (f", {r['hf_forward_f32_s']:.2f} s in float32" if "hf_forward_f32_s" in r else "")
        + " (same batches" + ("; PyTorch's default attention dispatch, cuDNN included, which plans each new "
                              "input shape: the project's excludes cuDNN)" if r["device"].startswith("cuda") else ")"),
        f"naive (full model, all hidden states, padded to {r['naive_padded_length']}, float32, batch {NAIVE_BATCH}): "
        f"{r['naive_timed_s']:.2f} s for {r['naive_rows']} rows ({r['naive_whole_batches_timed']} of "
        f"{r['naive_whole_batches']:,} whole batches, and the partial ones), {r['naive_s']:.2f} s scaled to "
        f"{r['n_rows']:,}" if "naive_timed_s" in r else "naive: not timed (no Hugging Face model for this backbone)",
        f"writer: {r['write_mb']:,.0f} MB of features in {r['write_s']:.2f} s summed over {r['writers']} "
        f"thread{'s' if r['writers'] > 1 else ''} ({r['write_mb'] / 1e3 / max(r['write_s'], 1e-9):.2f} GB/s a "
        f"thread), {r['copy_wait_s']:.2f} s waiting for windows to reach the host; the pass's tail after the last "
        f"window was queued {r['tail_s']:.2f} s" if "write_s" in r else "",
        f"pass thread: {r['run_s']:.2f} s computing windows, {r['to_host_s']:.2f} s starting their copies to the "
        f"host, {r['submit_wait_s']:.2f} s waiting for room in the writer's queue" if "run_s" in r else "",
        f"pass / bare forward = {r['pass_over_bare']:.3f}" + (
            f" (local disk); {r['url_pass_over_bare']:.3f} to {r['url']} (object store / local = "
            f"{r['url_over_local']:.3f})" if r.measurements.get("url") else ""),
        f"bare forward / HF forward = {r['bare_over_hf']:.3f}" + (
            f" (both {r['compute_dtype']}); against HF in float32 = {r['bare_over_hf_f32']:.3f}"
            if "bare_over_hf_f32" in r else ""),
        f"naive / pass = {r['naive_over_pass']:.2f}",
        f"tokens per second (pass): {r['tokens_per_s']:,.0f}",
        f"peak memory: host {r['peak_rss_mb_extract']:,.0f} MB up to the pass's end (task, model and pass), "
        f"{r['peak_rss_mb']:,.0f} MB "
        f"whole benchmark{dev_mem}",
    ] if line)


__all__ = ["bench_extract", "format_extract"]
