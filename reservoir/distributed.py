"""Sharded extraction: one extraction as N cooperating processes under ``torchrun`` (torch.distributed).

``torchrun --nproc_per_node N -m reservoir extract ...`` starts N copies of the
command; :func:`launch` sees ``WORLD_SIZE > 1`` and joins them in one process
group (each rank on ``cuda:LOCAL_RANK``, or on the CPU). The steps, each ended
by a collective in which every rank reports success or failure:

1. ``task``, ``prepare``: local rank 0 of every node builds the task (or loads
   it from the task cache) first, the node's other ranks then load it from the
   cache; every rank loads the backbone onto its device.
2. ``create``: rank 0 creates or reopens the store under its write lock (held
   until the job ends) and sends every rank the ``done`` flags it sees.
3. ``open``: the other ranks open the store for writing under rank 0's lock
   (:class:`reservoir.store.lock.SharedLock`), checking their settings.
4. ``written``: each rank writes its share of the unfinished work
   (:meth:`Job.deal`: no chunk on two ranks) and the ``done`` flags.
5. ``complete``: only if every rank wrote its share does rank 0 mark the store
   complete.

The ranks exchange only control messages (CPU tensors, through gloo; NCCL is
the group's CUDA backend). A failed or timed-out collective
(``RESERVOIR_DIST_TIMEOUT`` seconds, default 1800) ends the rank with one line
naming the ranks that did not arrive; finished chunks stay done, so the same
command, under any number of processes, resumes the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import logging
import os
import re
import time
from pathlib import Path

import numpy as np

from reservoir.errors import ReservoirError

ENV_TIMEOUT = "RESERVOIR_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0
log = logging.getLogger("reservoir")
_jobs = itertools.count()  # one key prefix per job in the process group's store


def world_size() -> int:
    """Processes of the job this process was launched in (``WORLD_SIZE``; 1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE") or 1)


def is_leader() -> bool:
    """Whether this process is rank 0 (or the only process): the one that reports."""
    return int(os.environ.get("RANK") or 0) == 0


class Local:
    """The single-process job: every unfinished chunk is this process's, one progress bar per split."""

    rank, world, local_rank = 0, 1, 0

    def prepare(self, prepare, config, task=None):
        """``prepare(config, task)``: the task, backbone and store settings this process extracts with."""
        return prepare(config, task)

    def todo(self, store, split: str) -> np.ndarray:
        """The unfinished chunks of ``split``."""
        return np.flatnonzero(~store.done(split))

    def deal(self, todo: np.ndarray, plan, lengths: np.ndarray) -> list:
        """The windows (``plan(chunks)``, :func:`reservoir.batching.plan_windows`) of ``todo`` this process runs."""
        return plan(todo)

    def bar(self, split: str, total: int, enabled: bool):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"extract {split}", unit="rows", disable=None if enabled else True,
                    dynamic_ncols=True)


LOCAL = Local()


class _Lost(ReservoirError):
    """A collective that failed or timed out (a peer is gone or stuck); nothing can be agreed any more."""


class Job(Local):
    """One rank of a sharded extraction: its place, its share of the chunks, the collectives of the protocol."""

    def __init__(self, rank: int, world: int, local_rank: int, device: str, timeout: float, group=None):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.device, self.timeout, self.group = device, timeout, group  # group: None for the default one
        self.prefix = f"reservoir/{next(_jobs)}"
        self.done: dict[str, np.ndarray] = {}
        self.progress: _Progress | None = None
        self.dealt = 0  # chunks or windows dealt so far, over the splits in order: where the next deal starts

    def prepare(self, prepare, config, task=None):
        """``prepare(config, task)`` on this rank's device; a task to build is built (or loaded from the task cache)
        by local rank 0 of every node first, then read from the cache by the other ranks. A rank that fails
        stops every rank."""
        from reservoir.tasks import load_task

        if task is None:
            first, error = self.local_rank == 0, None
            if first:
                task, error = _attempt(lambda: load_task(config.task, config.task_params))
            self.sync("task (local rank 0)", error)
            if not first:
                task, error = _attempt(lambda: load_task(config.task, config.task_params))
            self.sync("task", error)
        prep, error = _attempt(lambda: prepare(dataclasses.replace(config, device=self.device), task))
        self.sync("prepare", error)
        return prep

    def todo(self, store, split: str) -> np.ndarray:
        """The chunks of ``split`` rank 0 found unfinished (the same on every rank)."""
        return np.flatnonzero(~self.done[split])

    def deal(self, todo: np.ndarray, plan, lengths: np.ndarray) -> list:
        """This rank's windows: every ``world``-th unit, round-robin over the splits, no unit on two ranks.

        A split whose sequences all have one length deals its chunks (then
        plans this rank's windows from them): a row's batch mates change, its
        features do not (on the CPU, batch size does not change a row's
        result). A split of varying lengths deals the windows a single process
        would run, so every row is padded and batched as in a single process
        and the store is the same, bit for bit.
        """
        start, rank = self.dealt, self.rank
        if len(lengths) == 0 or int(np.min(lengths)) == int(np.max(lengths)):
            self.dealt += len(todo)
            return plan(todo[(start + np.arange(len(todo))) % self.world == rank])
        windows = plan(todo)
        self.dealt += len(windows)
        return [w for i, w in enumerate(windows) if (start + i) % self.world == rank]

    @contextlib.contextmanager
    def bar(self, split: str, total: int, enabled: bool):
        try:
            yield self.progress
        finally:
            self.progress.push()

    # -- collectives ------------------------------------------------------
    def sync(self, phase: str, error: BaseException | None = None, poll=None) -> None:
        """Every rank says whether its part of ``phase`` failed; raise this rank's error, or name the failed ranks."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor([int(error is not None)], dtype=torch.int64)
        got = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self._collective(phase, lambda: dist.all_gather(got, mine, group=self.group, async_op=True), poll)
        if error is not None:
            raise error
        failed = [r for r, t in enumerate(got) if int(t.item())]
        if failed:
            raise ReservoirError(f"rank {self.rank}: stopped at {phase}: rank(s) {_names(failed)} failed (see their "
                                 f"errors){_after(phase)}")

    def share(self, phase: str, make, error: BaseException | None = None):
        """Rank 0's ``make()`` (small, picklable) on every rank; rank 0's failure stops every rank."""
        import torch
        import torch.distributed as dist

        payload: list = [None]
        if self.rank == 0:
            value = None
            if error is None:
                value, error = _attempt(make)
            payload = [("error", None) if error is not None else ("ok", value)]
        self._collective(phase, lambda: dist.broadcast_object_list(payload, src=0, group=self.group,
                                                                        device=torch.device("cpu")))
        if error is not None:
            raise error
        if payload[0][0] != "ok":
            raise ReservoirError(f"rank {self.rank}: stopped at {phase}: rank 0 failed (see its error)")
        return payload[0][1]

    def _collective(self, phase: str, start, poll=None) -> None:
        """Run one collective (``start()`` returns its work, or ``None`` when it blocks); a failure is one line."""
        self._store_call(lambda s: s.set(f"{self.prefix}/{phase}/{self.rank}", "1"))
        try:
            work = start()
            while work is not None and poll is not None and not work.is_completed():
                poll()
                time.sleep(0.2)
            if work is not None:
                work.wait()
        except RuntimeError as err:  # gloo timeouts and closed connections (DistBackendError is one)
            raise self._lost(phase, err) from None

    def _lost(self, phase: str, err: BaseException) -> _Lost:
        keys = {r: f"{self.prefix}/{phase}/{r}" for r in range(self.world)}
        missing = [r for r, k in keys.items() if self._store_call(lambda s, k=k: not s.check([k])) is True]
        who = f"rank(s) {_names(missing)}" if missing else "a peer rank"
        if "timed out" in str(err).lower():
            after = f"after {self.timeout:g} s ({ENV_TIMEOUT}) " if self.timeout is not None else ""
            what = f"timed out {after}waiting for {who}"
        else:
            what = f"lost {who} ({_gloo_cause(err)})"
        return _Lost(f"rank {self.rank} of {self.world}: {what} at {phase}{_after(phase)}")

    def _store_call(self, fn):
        """``fn(store)`` on the process group's key-value store; ``None`` when there is none or it fails."""
        try:
            import torch.distributed.distributed_c10d as c10d

            return fn(c10d._get_default_store())
        except Exception:  # noqa: BLE001 - diagnostics and progress only: never what stops a run
            return None


class _Progress:
    """Rows written by all ranks, counted in the process group's store; one bar on rank 0 with the total."""

    def __init__(self, job: Job, total: int, enabled: bool):
        from tqdm.auto import tqdm

        self.job, self.key, self.pending, self.last = job, f"{job.prefix}/rows", 0, time.monotonic()
        self.bar = tqdm(total=total, desc="extract", unit="rows", disable=None if enabled else True,
                        dynamic_ncols=True) if job.rank == 0 else None

    def update(self, n: int) -> None:
        self.pending += n
        if time.monotonic() - self.last > 0.5:
            self.push()

    def push(self) -> None:
        """Add this rank's rows since the last push to the shared count (and show it on rank 0)."""
        n, self.pending, self.last = self.pending, 0, time.monotonic()
        self._show(self.job._store_call(lambda s: s.add(self.key, n)))

    def poll(self) -> None:
        self._show(self.job._store_call(lambda s: s.add(self.key, 0)))

    def _show(self, count) -> None:
        if self.bar is not None and count is not None:
            self.bar.n = min(int(count), self.bar.total)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _attempt(fn):
    """``(fn(), None)`` or ``(None, error)`` for an ``Exception`` (interrupts propagate at once)."""
    try:
        return fn(), None
    except Exception as err:  # noqa: BLE001 - reported to the other ranks, then raised here
        return None, err


#: Phases after which the store exists and holds finished chunks: a failure there leaves something to resume.
_STORE_PHASES = ("open", "written", "complete", "closed")


def _after(phase: str) -> str:
    """What a failure at ``phase`` leaves: finished chunks to resume from, or nothing written yet."""
    if phase in _STORE_PHASES:
        return "; finished chunks are kept: rerun the same command to resume"
    return "; nothing was written"


def _names(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _gloo_cause(err: BaseException) -> str:
    """A gloo error's message without its source location and advice: ``Connection closed by peer [..]:4760``."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    return text.split(". ")[0].rstrip(".")


# -- launching ----------------------------------------------------------------
@contextlib.contextmanager
def launch(out: Path, fmt: str | None, device: str, sharded: bool | None = None):
    """The job this process is part of: :data:`LOCAL` outside torchrun, else a :class:`Job` in a process group.

    ``sharded``: ``None`` shards when launched by torchrun with several
    processes (the CLI), ``False`` never (one process extracts alone, as in a
    DDP script where only rank 0 extracts), ``True`` requires a torchrun
    launch. A sharded run is checked before the group forms: a Zarr store on
    a filesystem (HDF5 takes one writer without MPI), a device each rank can
    own. A group the caller formed is used, else one is formed here and ended
    on the way out.
    """
    world = world_size()
    if sharded and world <= 1:
        raise ReservoirError(f"expected a torchrun launch of several processes for sharded=True; found WORLD_SIZE="
                             f"{os.environ.get('WORLD_SIZE', 'unset')}")
    if world <= 1 or sharded is False:
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
    r, n = store.chunk_rows(split), store.shape(split, "features")[0]
    return int(sum(min((c + 1) * r, n) - c * r for c in chunks))
