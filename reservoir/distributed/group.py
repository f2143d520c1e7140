"""Forming the process group torchrun describes, and the sharded pass over one store."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time
from pathlib import Path

import numpy as np

from reservoir.distributed.jobs import (DEFAULT_TIMEOUT, ENV_TIMEOUT, LOCAL, Job, _attempt, _gloo_cause, _Lost,
                                        _Progress, log, world_size)
from reservoir.errors import ReservoirError


# -- launching ----------------------------------------------------------------
@contextlib.contextmanager
def launch(out: Path, fmt: str | None, device: str, sharded: bool | None = None):
    """The job this process is part of: :data:`LOCAL` outside torchrun, else a :class:`Job` in a process group.

    ``sharded``: ``None`` shards when launched by torchrun with several
    processes (the CLI), ``False`` never (one process extracts alone, as in a
    DDP script where only rank 0 extracts), ``True`` requires a torchrun
    launch (of any size: a job of one process runs the whole protocol, its
    group included). A sharded run is checked before the group forms: a Zarr store on
    a filesystem (HDF5 takes one writer without MPI), a device each rank can
    own. A group the caller formed is used, else one is formed here and ended
    on the way out.
    """
    world = world_size()
    launched = "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ  # torchrun sets both, even for 1 process
    if sharded and not launched:
        raise ReservoirError(f"expected a torchrun launch for sharded=True; found WORLD_SIZE="
                             f"{os.environ.get('WORLD_SIZE', 'unset')} and MASTER_ADDR "
                             f"{'set' if 'MASTER_ADDR' in os.environ else 'unset'}")
    if sharded is False or (world <= 1 and not sharded):
        yield LOCAL
        return
    import torch.distributed as dist

    _check_format(out, fmt, world)
    local_rank = int(os.environ.get("LOCAL_RANK") or 0)
    timeout = _timeout()
    device = rank_device(device, local_rank)
    _set_threads(int(os.environ.get("LOCAL_WORLD_SIZE") or world))
    own = not dist.is_initialized()
    if own:
        _init(device, timeout)
    group = None  # a caller's group without gloo (NCCL only) gets a gloo group beside it for the CPU messages
    if "gloo" not in str(dist.get_backend()):
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    # a caller's own group keeps the timeout it was formed with
    known = timeout if own or group is not None else None
    try:
        yield Job(dist.get_rank(), dist.get_world_size(), local_rank, device, known, group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        if own:
            dist.destroy_process_group()


def _check_format(out: Path, fmt: str | None, world: int) -> None:
    from reservoir.store import detect_format

    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", str(out)):
        raise ReservoirError(f"expected a store path on a filesystem every node mounts, found the URL {out}: the "
                             "store's atomic creation (rename) and lock (a file) need a filesystem")
    if detect_format(out, fmt) != "zarr":
        raise ReservoirError(f"{out}: expected a Zarr store for a sharded run ({world} processes write their own "
                             "chunks; HDF5 takes one writer without MPI), found an HDF5 store: pass --out *.zarr, "
                             "or run one process")


def _timeout() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    try:
        seconds = DEFAULT_TIMEOUT if raw is None else float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ReservoirError(f"{ENV_TIMEOUT}: expected seconds above 0, found {raw!r}")
    return seconds


def rank_device(device: str, local_rank: int) -> str:
    """The device of local rank ``local_rank``: ``cuda``/``auto`` on a GPU machine give ``cuda:LOCAL_RANK``."""
    import torch

    device = str(device)  # a torch.device from the Python API too
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    if str(device).startswith("cuda:"):
        raise ReservoirError(f"expected --device cuda, auto or cpu in a sharded run (each rank takes "
                             f"cuda:LOCAL_RANK), found {device!r}")
    return device


def _set_threads(local_world: int) -> None:
    """Split the cores among this node's ranks, unless ``OMP_NUM_THREADS`` asks for other than torchrun's 1."""
    import torch

    if os.environ.get("OMP_NUM_THREADS", "1") not in ("", "1"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // max(1, local_world)))


def _init(device: str, timeout: float) -> None:
    """Join the process group torchrun describes (``MASTER_ADDR``, ``RANK``, ...): gloo, plus NCCL for CUDA."""
    import torch
    import torch.distributed as dist

    backend = "gloo"
    if device.startswith("cuda"):
        from reservoir.runtime import resolve_device

        torch.cuda.set_device(resolve_device(device))
        backend = "cpu:gloo,cuda:nccl"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as err:
        raise ReservoirError(f"rank {os.environ.get('RANK')}: expected a torchrun launch (MASTER_ADDR, "
                             f"MASTER_PORT, RANK, WORLD_SIZE), could not join it: {_gloo_cause(err)}") from None


# -- the sharded pass -----------------------------------------------------------
def write_sharded(job: Job, prep, out: Path, progress: bool, create, write) -> None:
    """Write the store at ``out`` with every rank of ``job`` (the protocol in the module docstring).

    ``create()`` creates or reopens the store on rank 0 (taking its lock);
    ``write(prep, store, progress, job)`` writes this rank's chunks.
    """
    fresh, store, started = job.rank == 0 and not out.exists(), None, False
    t0 = time.perf_counter()
    try:
        store, error = _attempt(create) if job.rank == 0 else (None, None)
        job.done = {k: np.asarray(v, dtype=bool) for k, v in job.share(
            "create", lambda: {s: store.done(s).tolist() for s in store.splits}, error).items()}
        if job.rank != 0:
            store, error = _attempt(lambda: _open_shared(out, prep, job))
        job.sync("open", error)
        total = sum(_rows(store, s, np.flatnonzero(~d)) for s, d in job.done.items())
        job.progress, started = _Progress(job, total, progress), True
        if not store.complete:
            error = _attempt(lambda: write(prep, store, progress, job))[1]
            job.sync("written", error, poll=job.progress.poll if job.rank == 0 else None)
            job.progress.close()
            error = _attempt(store.mark_complete)[1] if job.rank == 0 else None
            try:
                job.sync("complete", error)
            except _Lost:
                if not store.complete:
                    raise
                log.warning("rank %d: the store is complete; a peer rank was lost as the job ended", job.rank)
    except BaseException as err:
        if job.progress is not None:
            job.progress.close()
        if store is not None:
            if fresh and not started and not isinstance(err, _Lost):
                store.discard()  # agreed before anyone wrote: no empty store is left behind
            else:
                with contextlib.suppress(ReservoirError):
                    store.close()
        raise
    store.close()
    with contextlib.suppress(_Lost):  # every rank returns after rank 0 let the lock go: the store is open to readers
        job.sync("closed")
    prep.timings["pass_s"] = elapsed = time.perf_counter() - t0
    if job.rank == 0 and total:
        log.info("%d processes wrote %d rows in %.1f s (%.0f rows/s)", job.world, total, elapsed, total / elapsed)


def _open_shared(out: Path, prep, job: Job):
    """The store rank 0 created, open for writing under its lock; refused if this rank's settings differ."""
    from reservoir import settings
    from reservoir.store import KEY_FIELDS, SCHEMA, FeatureStore, first_difference
    from reservoir.store.lock import SharedLock

    store = FeatureStore.open(out, mode="r+", allow_incomplete=True, _lock=SharedLock(out))
    key = {"schema": SCHEMA, **{k: prep.attrs[k] for k in KEY_FIELDS if k != "schema"}}
    diff = first_difference(store.attrs, key)
    if diff is not None:
        store.close()
        raise ReservoirError(f"rank {job.rank}: {out} was created by rank 0 with "
                             f"{settings.describe_difference(diff)}; expected every rank to load the same task and "
                             "backbone (same files, revision and seed on every node)")
    return store


def _rows(store, split: str, chunks: np.ndarray) -> int:
    """Rows in ``chunks`` of ``split`` (the last chunk may be short)."""
    r, n = store.chunk_rows(split), store.n_rows(split)
    return int(sum(min((c + 1) * r, n) - c * r for c in chunks))
