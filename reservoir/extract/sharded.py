"""A rank's part of a sharded extraction: one store written by every process of a torchrun job.

The steps, each ended by a collective in which every rank reports success
or failure (:meth:`reservoir.distributed.Job.sync`):

1. ``task``, ``prepare``: local rank 0 of every node builds the task (or loads
   it from the task cache) first, the node's other ranks then load it from the
   cache; every rank loads the backbone onto its device.
2. ``create``: rank 0 creates or reopens the store under its write lock (held
   until the job ends) and sends every rank the ``done`` flags it sees.
3. ``open``: the other ranks open the store for writing under rank 0's lock
   (:class:`reservoir.store.lock.SharedLock`), checking their settings.
4. ``written``: each rank writes its share of the unfinished work
   (:func:`~reservoir.extract.passes.iter_windows` deals it: no chunk on two
   ranks) and the ``done`` flags.
5. ``complete``: only if every rank wrote its share does rank 0 mark the store
   complete.

A failed or timed-out step ends every rank with one line; finished chunks
stay done, so the same command, under any number of processes, resumes the
store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir.distributed import Job, Lost, attempt
from reservoir.errors import ReservoirError
from reservoir.extract.config import ExtractConfig
from reservoir.extract.passes import write_splits
from reservoir.extract.plan import batching_flags, other_batching
from reservoir.extract.prepare import ExtractionPlan, plan_extraction, prepare

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.backbones.model import ReservoirBackbone
    from reservoir.store import FeatureStore, WritableStore
    from reservoir.store.remote import StoreURL
    from reservoir.tasks import TaskData

log = logging.getLogger("reservoir")

#: Steps after which the store exists and holds finished chunks: a failure there leaves something to resume.
_STORE_STEPS = ("written", "complete", "closed")


def after(step: str) -> str:
    """What a failure at ``step`` leaves: finished chunks to resume from, or nothing written yet (at ``open``, no
    chunk: a store rank 0 created for this run is removed again, one it resumed keeps what it held)."""
    if step in _STORE_STEPS:
        return "; finished chunks are kept: rerun the same command to resume"
    if step == "open":
        return "; this run wrote no chunk (a store it created is removed, one it resumed is kept as it was)"
    return "; nothing was written"


def check_out(out: Path | StoreURL, fmt: str | None, world: int) -> None:
    """Refuse, before the group forms, an output a sharded run cannot share: an HDF5 store."""
    from reservoir.store import detect_format

    if detect_format(out, fmt) != "zarr":
        raise ReservoirError(f"{out}: expected a Zarr store for a sharded run ({world} processes write their own "
                             "chunks; HDF5 takes one writer without MPI), found an HDF5 store: pass --out *.zarr, "
                             "or run one process")


def prepare_rank(job: Job, config: ExtractConfig, task: TaskData | None = None,
                 backbone: ReservoirBackbone | None = None) -> ExtractionPlan:
    """This rank's plan on its device: the task built by local rank 0 of every node first (the others then read it
    from the task cache), then the backbone loaded (or ``backbone`` planned) on every rank; a rank that fails stops
    every rank."""
    from reservoir.tasks import load_task

    if task is None:
        first, error = job.local_rank == 0, None
        if first:
            task, error = attempt(lambda: load_task(config.task, config.task_params))
        job.sync("task (local rank 0)", error, after=after("task"))
        if not first:
            task, error = attempt(lambda: load_task(config.task, config.task_params))
        job.sync("task", error, after=after("task"))
    assert task is not None  # built on every rank, or the sync above raised
    config = dataclasses.replace(config, device=job.device)
    if backbone is None:
        plan, error = attempt(lambda: prepare(config, task))
    else:
        plan, error = attempt(lambda: plan_extraction(config, task, backbone))
    job.sync("prepare", error, after=after("prepare"))
    assert plan is not None  # every rank prepared
    return plan


def write_sharded(job: Job, plan: ExtractionPlan, out: Path | StoreURL, progress: bool = True) -> None:
    """Write the store at ``out`` with every rank of ``job`` (the steps in the module docstring)."""
    from reservoir.extract.passes import create_store

    fresh, store, started, total, ran = job.rank == 0 and not out.exists(), None, False, 0, False
    t0 = time.perf_counter()
    try:
        store, error = attempt(lambda: create_store(plan, out, progress)) if job.rank == 0 else (None, None)
        created = job.share("create", lambda: _created(store), error, after("create"))
        done = {k: np.asarray(v, dtype=bool) for k, v in created["done"].items()}
        if job.rank != 0:
            store, error = attempt(lambda: _open_shared(out, plan, job, created["writer"]))
        job.sync("open", error, after=after("open"))
        assert store is not None  # opened on every rank
        total = sum(_rows(store, s, np.flatnonzero(~d)) for s, d in done.items())
        count, started = job.count(total, progress), True
        if not store.complete:
            ran = True
            error = attempt(lambda: write_splits(plan, store, progress, job, done))[1]
            job.sync("written", error, poll=count.poll if job.rank == 0 else None, after=after("written"))
            count.close()
            error = attempt(store.mark_complete)[1] if job.rank == 0 else None
            try:
                job.sync("complete", error, after=after("complete"))
            except Lost:
                if not store.complete:
                    raise
                log.warning("rank %d: the store is complete; a peer rank was lost as the job ended", job.rank)
    except BaseException:
        if job.progress is not None:
            job.progress.close()
        if store is not None:
            if fresh and not started:  # no rank writes before every rank opened it: no empty store is left behind
                store.discard()  # (a peer lost at create or open included: it never got to write)
            else:
                with contextlib.suppress(ReservoirError):
                    store.close()
        raise
    store.close()
    with contextlib.suppress(Lost):  # every rank returns after rank 0 let the lock go: the store is open to readers
        job.sync("closed", after=after("closed"))
    elapsed = time.perf_counter() - t0
    if ran:  # nothing when the store was complete already
        plan.timings["pass_s"] = elapsed
    if job.rank == 0 and total:
        log.info("%d processes wrote %d rows in %.1f s (%.0f rows/s)", job.world, total, elapsed, total / elapsed)


def _created(store: WritableStore | None) -> dict[str, Any]:
    """What rank 0 sends once it holds the store: every split's ``done`` flags as it sees them (plain lists: what a
    broadcast pickles) and the holder its write lock recorded (``writer``), which the other ranks check before
    every write."""
    assert store is not None  # rank 0 created it, or the share reports its error instead
    writer = store.writer()
    assert writer is not None  # created under rank 0's lock
    return {"done": {s: store.done(s).tolist() for s in store.splits}, "writer": writer}


def _open_shared(out: Path | StoreURL, plan: ExtractionPlan, job: Job, writer: dict[str, Any]) -> WritableStore:
    """The store rank 0 created, open for writing under its lock (held by ``writer``, as rank 0's lock recorded
    it); refused if this rank's settings differ."""
    from reservoir import settings
    from reservoir.store import WritableStore, first_difference, store_key
    from reservoir.store.lock import SharedLock

    store = WritableStore.open(out, mode="r+", allow_incomplete=True, _lock=SharedLock(out, writer))
    try:
        key = store_key(plan.attrs, f"rank {job.rank}: {out}")
    except ReservoirError:
        store.close()
        raise
    diff = first_difference(store.attrs, key)
    if diff is not None:
        store.close()
        raise ReservoirError(f"rank {job.rank}: {out} was created by rank 0 with "
                             f"{settings.describe_difference(diff)}; expected every rank to load the same task and "
                             "backbone (same files, revision and seed on every node)")
    mine = plan.attrs.get("batching")
    begun = other_batching(store.attrs.get("batching"), mine)  # every rank batches as rank 0 did
    if begun is not None and mine is not None:
        store.close()
        raise ReservoirError(f"rank {job.rank}: {out} is batched by rank 0 with "
                             f"{batching_flags(begun)}; found {batching_flags(mine)} on this rank: "
                             "expected one batching on every rank (the same --batch-size and --max-tokens, and the "
                             "same kind of device)")
    return store


def _rows(store: FeatureStore, split: str, chunks: np.ndarray) -> int:
    """Rows in ``chunks`` of ``split`` (the last chunk may be short)."""
    r, n = store.chunk_rows(split), store.n_rows(split)
    return int(sum(min((c + 1) * r, n) - c * r for c in chunks))
