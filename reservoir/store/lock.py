"""One writer per store: an exclusive lock file beside the store, held for the whole write.

The lock is ``flock`` on ``<store>.lock``. The kernel drops it when the holding
process exits, however it exits, so a lock left by a killed process is simply
taken by the next writer (a stale lock cannot block anyone). The holder writes
its pid, host and start time into the file so that a refused writer, or a
reader of an unfinished store, can say who is writing. The file is removed on
release; a writer that locked a file another process has just removed
notices (the path no longer names the locked file) and locks the new one.
A writer checks before each write that the path still names its locked file,
so a lock file removed by hand stops the writer rather than letting a second
one in beside it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from reservoir.errors import ReservoirError
from reservoir.io import check_local
from reservoir.store import lease
from reservoir.store.lease import describe  # who holds a lock or a lease, in words (re-exported)
from reservoir.store.remote import StoreURL, is_url


def lock_path(store: str | os.PathLike) -> Path:
    """The lock file of a store: ``<store>.lock`` beside it, symbolic links resolved (one lock per real store)."""
    p = Path(os.path.realpath(store))
    return p.with_name(p.name + ".lock")


def _read_holder(fd: int, wait: float = 0.2) -> dict | None:
    """The holder's record, waiting up to ``wait`` seconds for a writer that has locked but not yet written it."""
    deadline = time.monotonic() + wait
    while True:
        try:
            raw = os.pread(fd, 4096, 0)
            found = json.loads(raw.decode()) if raw else None
        except (OSError, ValueError, RecursionError):  # not what a writer records: say nothing about the holder
            found = None
        if isinstance(found, dict) or time.monotonic() > deadline:
            return found if isinstance(found, dict) else None
        time.sleep(0.005)


def holder(store: str | os.PathLike | StoreURL) -> dict | None:
    """Who holds the write lock of ``store`` (``{pid, host, started}``), or ``None`` when nobody does.

    A store on object storage is held by its unexpired lease (:mod:`reservoir.store.lease`).
    """
    if isinstance(store, StoreURL):
        return lease.holder(store)
    if is_url(store):
        return lease.holder(StoreURL(str(store)))
    try:
        fd = os.open(lock_path(os.fspath(store)), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class StoreLock:
    """Exclusive write lock of one store; :meth:`acquire` refuses in one line when another process holds it.

    Examples
    --------
    >>> lock = StoreLock("/tmp/doc-lock.zarr").acquire()
    >>> holder("/tmp/doc-lock.zarr")["pid"] == os.getpid()
    True
    >>> lock.release()
    """

    def __init__(self, store: str | os.PathLike):
        self.store = Path(store)
        self.path = lock_path(store)
        self._fd: int | None = None
        self.record: dict | None = None  # what this holder wrote into the lock file ({pid, host, started})

    def acquire(self) -> "StoreLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ReservoirError(f"{self.store}: expected a writable output path, "
                                 f"found: {err.strerror or err}") from err
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never write through a link
            except OSError as err:
                raise ReservoirError(f"{self.store}: expected a writable output path, could not create its lock file "
                                     f"{self.path}: {err.strerror or err}") from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                who = _read_holder(fd)
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ReservoirError(f"{self.store}: could not lock {self.path}: {err.strerror or err}") from err
                raise lease.busy(self.store, who) from None
            if self._still_current(fd):
                break
            os.close(fd)  # the holder removed the file between our open and lock: lock the new one
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
        except OSError as err:  # a full disk: no lock file is left behind, held or half-written
            self.path.unlink(missing_ok=True)
            os.close(fd)
            raise ReservoirError(f"{self.store}: expected a writable output path, could not write its lock file "
                                 f"{self.path}: {err.strerror or err}") from None
        self._fd, self.record = fd, me
        return self

    def _still_current(self, fd: int) -> bool:
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def check(self) -> None:
        """Refuse to write once the lock file is not this holder's any more: removed by hand, or removed and
        created again, in which case another writer may hold the new one."""
        if self._fd is None or self._still_current(self._fd):
            return
        raise ReservoirError(f"{self.store}: expected this writer's lock file {self.path} in place; found it removed "
                             "or replaced while writing, so another writer may have started: stopping, rerun the "
                             "same command to resume once no other writer runs")

    def release(self) -> None:
        """Remove the lock file and unlock (in that order, so no one locks a file about to vanish). A lock file
        that is not this holder's any more (removed, or another writer's since) is left alone."""
        if self._fd is None:
            return
        try:
            if self._still_current(self._fd):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "StoreLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


#: What identifies the holder of a lock or lease (a lease's record also says when it expires, which changes).
_HOLDER_KEYS = ("pid", "host", "started", "job")


def same_holder(a: dict | None, b: dict | None) -> bool:
    """Whether two records of a lock's or a lease's holder name the same holder (its pid, host, start and job)."""
    if not a or not b:
        return False
    return all(a.get(k) == b.get(k) for k in _HOLDER_KEYS)


class SharedLock:
    """The write lock of a store (a lock file, or a lease on object storage) as held for a whole sharded job by its
    rank 0, seen from the job's other ranks.

    Internal to :mod:`reservoir.extract.sharded`: the other ranks open the store
    for writing (``FeatureStore.open(..., _lock=SharedLock(path, record))``)
    only after rank 0 has taken the lock and sent them its holder's
    ``record``; releasing it here does nothing, the lock goes when rank 0
    closes the store.
    """

    held = True

    def __init__(self, store: str | os.PathLike | StoreURL, record: dict):
        self.store = store if isinstance(store, StoreURL) else StoreURL(str(store)) if is_url(store) else Path(store)
        self.record = record  # rank 0's, as its lock recorded it

    def check(self) -> None:
        """Refuse to write unless the lock is still rank 0's (the holder it recorded): once rank 0 has ended,
        another writer may have taken the store."""
        now = holder(self.store)
        if same_holder(now, self.record):
            return
        what, gone = ("lease", "released or expired") if isinstance(self.store, StoreURL) else ("lock", "released")
        found = f"it {gone}" if now is None else f"it held by {describe(now)}"
        raise ReservoirError(f"{self.store}: expected rank 0 of this job ({describe(self.record)}) to hold the store's "
                             f"write {what} while the other ranks write; found {found} (rank 0 has ended): stopping, "
                             "rerun the same command to resume")

    def release(self) -> None:
        pass


def writer_lock(store: Path | StoreURL, job: str | None = None):
    """The write lock of a store: a lock file on disk, a lease on object storage (not yet acquired)."""
    if isinstance(store, StoreURL):
        return lease.Lease(store, job)
    return StoreLock(store)


@contextlib.contextmanager
def run_folder_lock(folder: str | os.PathLike | None) -> Iterator[StoreLock | None]:
    """One writer per results folder (a ``train`` run, a sweep, a recipe's results): the store's lock on the folder,
    held while the block writes into it; ``None`` locks nothing. A second writer is refused in one line naming the
    holder."""
    if folder is None:
        yield None
        return
    check_local(folder, "a results folder")
    with StoreLock(folder) as lock:
        _sweep(Path(folder))
        yield lock


def _sweep(folder: Path) -> None:
    """Remove what a killed writer of ``folder`` left: the temporaries of :func:`reservoir.io.atomic_write`
    (``.<name>.<random>.tmp``) directly in it. Called with the folder's lock held, so no live writer owns them."""
    try:
        leftovers = [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError:  # not made yet, or unreadable: the writer's own error says so
        return
    for p in leftovers:
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
