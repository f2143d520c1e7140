"""The jobs of an extraction: one process (:data:`LOCAL`), or one rank of a sharded job (:class:`Job`).

A :class:`Job` deals the unfinished work to ranks, runs the collectives of
the protocol (:mod:`reservoir.distributed`) with one-line errors, and counts
every rank's rows for one progress bar on rank 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import re
import time

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import first_sentence

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
    return first_sentence(text)
