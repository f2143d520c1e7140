"""The pass itself: every unfinished chunk of every split computed and written, by one process or one rank.

For each split, the unfinished store chunks are grouped into windows
(:mod:`reservoir.extract.plan`): a window's rows go to the device in one
transfer, sorted by length and cut into batches (a batch is padded only to
its own longest sequence, and holds at most ``batch_size`` rows or
``max_tokens`` padded tokens: 64 rows on the CPU and a token budget on CUDA
unless given, :func:`~reservoir.extract.plan.resolve_batching`). Each batch runs blocks ``1..max(layers)`` once
under ``inference_mode``, in the compute dtype the weights were cast to once
(:func:`reservoir.runtime.cast_for_inference`), and the pooled hidden states
of every requested layer stay on the device until the window ends
(:class:`~reservoir.extract.engine.Engine`). The window then goes to the host
in one copy and a background thread (:class:`~reservoir.extract.writer.ChunkWriter`;
on CUDA several, :data:`CUDA_WRITERS`) writes its chunks while the next window computes. A chunk's ``done`` flag is
set after its rows are written, so a rerun with the same settings skips
finished chunks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir import distributed
from reservoir.extract.engine import to_host
from reservoir.errors import ReservoirError
from reservoir.extract.plan import Window, batching_flags, other_batching, plan_order, plan_windows
from reservoir.extract.prepare import ExtractionPlan
from reservoir.extract.writer import ChunkWriter, FinishedWindow, write_window

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.store import FeatureStore, WritableStore
    from reservoir.store.remote import StoreURL
    from reservoir.tasks import Split


@dataclass
class PlannedWindow:
    """One window of one split as the pass runs it: its rows' length order and batch bounds, and the split's bar."""

    name: str  # the split's name
    split: Split
    window: Window
    order: np.ndarray  # (n,) positions in window.rows, by increasing length
    bounds: list[tuple[int, int]]  # batch i is order[lo:hi]
    bar: Any  # the split's progress bar (anything with update(n))


def write_store(plan: ExtractionPlan, out: Path | StoreURL, progress: bool = True) -> None:
    """Create (or reopen and repair) the store at ``out`` in this process and write every unfinished chunk.

    A store this call created is removed again if the pass fails before
    anything could be kept; ``plan.timings["pass_s"]`` receives the pass's
    seconds (nothing when the store was complete already: no pass ran).
    """
    fresh = not out.exists()
    store = create_store(plan, out, progress)
    t0 = time.perf_counter()
    with store:  # closed on the way out; an error already in flight is the one reported
        ran = not store.complete
        try:
            if ran:
                write_splits(plan, store, progress)
                store.mark_complete()
        except BaseException:
            if fresh:
                store.discard()  # a store of this run with no chunk written is not left behind
            raise
    if ran:
        plan.timings["pass_s"] = time.perf_counter() - t0


def create_store(plan: ExtractionPlan, out: Path | StoreURL, progress: bool = True) -> WritableStore:
    """The store at ``out``, created or reopened (and repaired) with its write lock (``WritableStore.create``)."""
    from reservoir.store import WritableStore

    task = plan.task
    store = WritableStore.create(
        out,
        plan.attrs,
        splits={name: (len(s), task.label_shape) for name, s in task.splits.items()},
        feature_shape=(len(plan.layers), task.n_out_tokens, plan.backbone.n_dim),
        projection_weight=plan.projection_weight,
        final_norm=plan.final_norm,
        fmt=plan.config.format,
        states_length=plan.states_length(),
        progress=progress,
        job=os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID"),
    )
    try:
        check_same_batching(store, plan.attrs.get("batching"), str(out))
    except ReservoirError:
        store.close()
        raise
    return store


def check_same_batching(store: FeatureStore, batching: dict[str, Any] | None, where: str) -> None:
    """Refuse (one line) to write more of an unfinished ``store`` with another batching than it was begun with
    (:func:`~reservoir.extract.plan.other_batching`); a complete store is read whatever batching made it."""
    begun = None if store.complete else other_batching(store.attrs.get("batching"), batching)
    if begun is None or batching is None:  # (batching None: begun is None too)
        return
    raise ReservoirError(f"{where}: expected the batching this store was begun with ({batching_flags(begun)}); "
                         f"found {batching_flags(batching)}: a row's features depend on the rows batched with it, "
                         f"so rerun with {batching_flags(begun)} to resume, or pass another --out")


def write_splits(plan: ExtractionPlan, store: WritableStore, progress: bool = True,
                 job: distributed.Local = distributed.LOCAL, done: dict[str, np.ndarray] | None = None) -> None:
    """Compute every unfinished chunk of every split and write it (the pass itself).

    ``job`` and ``done``: a rank of a sharded job writes its share of the
    chunks that the ``done`` flags rank 0 read leave unfinished.
    """
    import threading

    import torch

    engine = plan.engine()
    lock, spent = threading.Lock(), {"copy_wait_s": 0.0, "write_s": 0.0, "write_mb": 0.0}

    def write(item: FinishedWindow) -> None:
        t0 = time.perf_counter()
        if item.ready is not None:
            item.ready.synchronize()  # the window's copy to the host has landed
        t1 = time.perf_counter()
        written = write_window(store, item)
        t2 = time.perf_counter()
        with lock:
            spent["copy_wait_s"] += t1 - t0
            spent["write_s"] += t2 - t1
            spent["write_mb"] += written / 1e6

    queued, own = None, {"run_s": 0.0, "to_host_s": 0.0, "submit_wait_s": 0.0}  # the pass thread's account
    with ChunkWriter(write, **writers(plan.device, plan.config.writers)) as writer, torch.inference_mode(), \
            plan.context:
        for w in iter_windows(plan, store, progress, job=job, done=done):
            t0 = time.perf_counter()
            feats, states = engine.run(w.split.inputs, w.split.lengths, w.window.rows, w.order, w.bounds,
                                       progress=w.bar)
            t1 = time.perf_counter()
            item = FinishedWindow(w.name, w.split, w.window, *to_host(feats, states))
            t2 = time.perf_counter()
            writer.submit(item)  # blocks while the writer's queue is full
            own["run_s"] += t1 - t0
            own["to_host_s"] += t2 - t1
            own["submit_wait_s"] += time.perf_counter() - t2
        queued = time.perf_counter()
    if queued is not None:  # the writer's account (seconds summed over its threads), the pass's own, and its tail
        plan.timings.update(spent, **own, tail_s=time.perf_counter() - queued)


#: Threads writing windows side by side on CUDA, where a GPU computes rows faster than one thread stores them (GPT-2
#: small on an H200: 400 MB of bit XOR features in 0.2 s). On the CPU one thread keeps up and leaves the cores to
#: the forward.
CUDA_WRITERS = 3


def writers(device, workers: int | None = None) -> dict[str, int]:
    """The background writer's ``workers`` (given, or the device's default) and ``depth`` (windows waiting) for a
    pass on ``device``."""
    if workers is None:
        workers = CUDA_WRITERS if device.type == "cuda" else 1
    return {"workers": workers, "depth": 2}


def iter_windows(plan: ExtractionPlan, store: FeatureStore, progress: bool = True, every_chunk: bool = False,
                 job: distributed.Local = distributed.LOCAL,
                 done: dict[str, np.ndarray] | None = None) -> Iterator[PlannedWindow]:
    """Yield a :class:`PlannedWindow` for every unfinished window (of this rank's share).

    The one plan both the pass and ``bench extract``'s bare forward follow
    (the latter with ``every_chunk``: the windows of a fresh store). Every
    split runs the windows of a fresh store that hold an unfinished chunk
    (:func:`~reservoir.extract.plan.plan_windows` with ``stable``), and a rank
    of a sharded job every ``world``-th of them, so each row is padded and
    batched as in one uninterrupted process: a resumed, repaired or sharded
    store is the same bit for bit. Rows of one length too: a row's result can
    depend on its batch's size (a lone row takes another matrix kernel than a
    batch of two, with another summation order, on the CPU's threads as on
    CUDA).
    """
    for name, split in plan.task.splits.items():
        flags = store.done(name) if done is None else done[name]
        todo = np.arange(len(flags)) if every_chunk else np.flatnonzero(~flags)
        args = (store.chunk_rows(name), len(split), _row_bytes(store, name, split))
        windows = job.deal(plan_windows(todo, *args, stable=True))
        with job.bar(f"extract {name}", sum(len(w.rows) for w in windows), progress) as bar:
            for w in windows:
                yield PlannedWindow(name, split, w, *plan_order(split.lengths[w.rows], *plan.batching), bar)


def _row_bytes(store: FeatureStore, name: str, split: Split) -> int:
    """Host bytes one row of a window takes: its stored features (and states) plus its inputs."""
    itemsize = np.dtype(store.attrs["dtype"]).itemsize
    row = len(store.poolings) * int(np.prod(store.features(name).shape[1:])) * itemsize
    if store.full_seq_layer is not None:
        row += int(np.prod(store.shape(name, "states")[1:])) * itemsize
    return row + int(np.prod(split.inputs.shape[1:])) * split.inputs.dtype.itemsize
