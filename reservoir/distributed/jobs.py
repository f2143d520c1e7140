"""A job's ranks: one process (:data:`LOCAL`), or one rank of a torchrun job (:class:`Job`).

A :class:`Job` deals work units to ranks, runs collectives that every rank
ends with success or failure (one-line errors naming the ranks that failed
or never arrived), and counts every rank's progress for one bar on rank 0.
It knows nothing of what the units are.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from reservoir.errors import ReservoirError
from reservoir.io import first_sentence

ENV_TIMEOUT = "RESERVOIR_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0
log = logging.getLogger("reservoir")
_jobs = itertools.count()  # one key prefix per job in the process group's store
T = TypeVar("T")


def _env_count(name: str, default: int) -> int:
    """A non-negative integer that torchrun sets (``WORLD_SIZE``, ``RANK``); one line when it is something else."""
    raw = os.environ.get(name)
    if not raw:
        return default
    if not (raw.strip().isascii() and raw.strip().isdigit()) or len(raw.strip()) > 18:  # int() refuses 4301 digits
        raise ReservoirError(f"{name}: expected a non-negative integer (as torchrun sets it), found {raw[:40]!r}")
    return int(raw)


def world_size() -> int:
    """Processes of the job this process was launched in (``WORLD_SIZE``; 1 outside torchrun)."""
    world = _env_count("WORLD_SIZE", 1)
    if world < 1:
        raise ReservoirError(f"WORLD_SIZE: expected at least 1 process (as torchrun sets it), found {world}")
    return world


def local_place(world: int) -> tuple[int, int]:
    """This process's rank on its node and the node's process count (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` as
    torchrun sets them, 0 and ``world`` unset); one line when they cannot be a place in a job of ``world``."""
    local_rank, local_world = _env_count("LOCAL_RANK", 0), _env_count("LOCAL_WORLD_SIZE", world)
    if not 0 < local_world <= world or local_rank >= local_world:
        raise ReservoirError(f"LOCAL_RANK, LOCAL_WORLD_SIZE: expected a local rank below the node's process count, "
                             f"itself from 1 to WORLD_SIZE={world} (as torchrun sets them), found LOCAL_RANK="
                             f"{local_rank}, LOCAL_WORLD_SIZE={local_world}")
    return local_rank, local_world


def is_leader() -> bool:
    """Whether this process is rank 0 (or the only process): the one that reports.

    A ``RANK`` outside the job (``RANK=5`` alone, or not below ``WORLD_SIZE``)
    is one line, not a run that never reports.
    """
    rank, world = _env_count("RANK", 0), world_size()
    if rank >= world:
        raise ReservoirError(f"RANK: expected a rank below WORLD_SIZE={os.environ.get('WORLD_SIZE') or '1 (unset)'} "
                             f"(as torchrun sets them), found {rank}")
    return rank == 0


class Local:
    """The single-process job: every unit is this process's; a progress bar of its own."""

    rank, world, local_rank = 0, 1, 0

    def deal(self, units: Sequence[T]) -> list[T]:
        """This process's share of ``units``: all of them."""
        return list(units)

    def bar(self, desc: str, total: int, enabled: bool) -> Any:
        """A progress bar over ``total`` units (a context manager with ``update(n)``)."""
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="rows", disable=None if enabled else True, dynamic_ncols=True)


LOCAL = Local()


class Lost(ReservoirError):
    """A collective that failed or timed out (a peer is gone or stuck); nothing can be agreed any more."""


class Job(Local):
    """One rank of a job: its place, its share of the units, the collectives every rank takes part in."""

    def __init__(self, rank: int, world: int, local_rank: int, device: str, timeout: float | None, group=None):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.device, self.timeout, self.group = device, timeout, group  # group: None for the default one
        self.prefix = f"reservoir/{next(_jobs)}"
        self.progress: Progress | None = None
        self.dealt = 0  # units dealt so far, over every deal in order: where the next deal starts
        self.store_lost = False  # a call to the group's store failed: its host is gone, no later call is made

    def deal(self, units: Sequence[T]) -> list[T]:
        """This rank's share: every ``world``-th unit, continuing from the previous deal, no unit on two ranks."""
        start, self.dealt = self.dealt, self.dealt + len(units)
        return [u for i, u in enumerate(units) if (start + i) % self.world == self.rank]

    def count(self, total: int, enabled: bool) -> Progress:
        """Start counting every rank's units (``total`` over all ranks) for one bar on rank 0."""
        self.progress = Progress(self, total, enabled)
        return self.progress

    @contextlib.contextmanager
    def bar(self, desc: str, total: int, enabled: bool) -> Iterator[Progress]:
        """The job's shared count (:meth:`count`), pushed when a stretch of work ends."""
        if self.progress is None:
            raise RuntimeError("Job.bar before Job.count")
        try:
            yield self.progress
        finally:
            self.progress.push()

    # -- collectives ------------------------------------------------------
    def sync(self, phase: str, error: BaseException | None = None, poll: Callable[[], None] | None = None,
             after: str = "") -> None:
        """Every rank says whether its part of ``phase`` failed; raise this rank's error, or name the failed ranks.

        ``poll`` runs every 0.2 s while waiting; ``after`` ends a failure's line (what the failure leaves behind).
        """
        import torch
        import torch.distributed as dist

        mine = torch.tensor([int(error is not None)], dtype=torch.int64)
        got = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self._collective(phase, lambda: dist.all_gather(got, mine, group=self.group, async_op=True), poll, after)
        if error is not None:
            raise error
        failed = [r for r, t in enumerate(got) if int(t.item())]
        if failed:
            raise ReservoirError(f"rank {self.rank}: stopped at {phase}: rank(s) {_names(failed)} failed (see their "
                                 f"errors){after}")

    def share(self, phase: str, make: Callable[[], Any], error: BaseException | None = None, after: str = "") -> Any:
        """Rank 0's ``make()`` (small, picklable) on every rank; rank 0's failure stops every rank."""
        import torch
        import torch.distributed as dist

        payload: list = [None]
        if self.rank == 0:
            value = None
            if error is None:
                value, error = attempt(make)
            payload = [("error", None) if error is not None else ("ok", value)]
        self._collective(phase, lambda: dist.broadcast_object_list(payload, src=0, group=self.group,
                                                                        device=torch.device("cpu")), after=after)
        if error is not None:
            raise error
        if payload[0][0] != "ok":
            raise ReservoirError(f"rank {self.rank}: stopped at {phase}: rank 0 failed (see its error)")
        return payload[0][1]

    def _collective(self, phase: str, start: Callable[[], Any], poll: Callable[[], None] | None = None,
                    after: str = "") -> None:
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
            raise self._lost(phase, err, after) from None

    def _lost(self, phase: str, err: BaseException, after: str) -> Lost:
        keys = {r: f"{self.prefix}/{phase}/{r}" for r in range(self.world)}
        missing = [r for r, k in keys.items() if self._store_call(lambda s, k=k: not s.check([k])) is True]
        who = f"rank(s) {_names(missing)}" if missing else "a peer rank"
        if "timed out" in str(err).lower():
            waited = f"after {self.timeout:g} s ({ENV_TIMEOUT}) " if self.timeout is not None else ""
            what = f"timed out {waited}waiting for {who}"
        else:
            what = f"lost {who} ({gloo_cause(err)})"
        return Lost(f"rank {self.rank} of {self.world}: {what} at {phase}{after}")

    def _store_call(self, fn):
        """``fn(store)`` on the process group's key-value store; ``None`` when there is none or it fails (then
        for good: a store whose host is gone fails every call, slowly, each with a warning from c10d)."""
        if self.store_lost:
            return None
        try:
            import torch.distributed.distributed_c10d as c10d

            return fn(c10d._get_default_store())
        except Exception:  # noqa: BLE001 - diagnostics and progress only: never what stops a run
            self.store_lost = True
            return None


class Progress:
    """Units done by all ranks, counted in the process group's store; one bar on rank 0 with the total."""

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


def attempt(fn: Callable[[], T]) -> tuple[T | None, Exception | None]:
    """``(fn(), None)`` or ``(None, error)`` for an ``Exception`` (interrupts propagate at once)."""
    try:
        return fn(), None
    except Exception as err:  # noqa: BLE001 - reported to the other ranks, then raised here
        return None, err


def _names(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def gloo_cause(err: BaseException) -> str:
    """A gloo error's message without its source location and advice: ``Connection closed by peer [..]:4760``."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    return first_sentence(text)
