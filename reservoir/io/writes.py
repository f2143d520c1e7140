"""Files written whole or not at all: a temporary published by rename (never over a folder, a device, a held lock
or an HDF5 file), folders synced, and stop requests held back while a write must not be cut."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from reservoir.errors import ReservoirError
from reservoir.io.paths import file_kind, zarr_store_around
from reservoir.io.text import one_line

__all__ = ["HDF5_MAGIC", "atomic_write", "fsync_dir", "publish", "replaceable", "request_stop", "save_figure",
           "stop_deferred"]


#: The first bytes of every HDF5 file (its format signature).
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def replaceable(dest: str | os.PathLike) -> None:
    """Refuse (one line) to write ``dest`` unless nothing is there or a regular file is: never over a folder, a
    link, a device or a FIFO, a held lock file or an HDF5 file, and never inside a Zarr store."""
    store = zarr_store_around(dest)
    if store is not None:
        raise ReservoirError(f"{dest}: expected a file path to write outside any feature store; found it inside the "
                             f"Zarr store {store}, whose files (chunks, metadata) an output never replaces or joins")
    try:
        mode = os.lstat(dest).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file in the way of its folder is for the
        return                                       # folder's own check to name)
    except OSError as err:
        raise ReservoirError(f"{dest}: expected a file path to write, could not inspect it: "
                             f"{err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise ReservoirError(f"{dest}: expected a regular file (or no file) to write, found {file_kind(mode)}")
    try:
        with open(dest, "rb") as f:
            head = f.read(8)
            held = _held(f.fileno())
    except OSError:
        return  # unreadable: the write itself says why it fails, if it does
    if held:
        raise ReservoirError(f"{dest}: expected a file path to write; found a file a running process holds locked "
                             "(a store's or a run's lock), which is never replaced by an output")
    if head == HDF5_MAGIC:
        raise ReservoirError(f"{dest}: expected a file path to write; found an HDF5 file (a feature store?), which is "
                             "never replaced by an output: remove it first or choose another path")


def _held(fd: int) -> bool:
    """Whether another open file holds an exclusive ``flock`` on the file (a writer's lock file)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        return err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def publish(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Move a finished temporary file into place with ordinary permissions (mkstemp makes it 0600), the folder
    synced after; refuse (and remove the temporary) when ``dest`` is not a regular file (:func:`replaceable`)."""
    try:
        replaceable(dest)
    except ReservoirError:
        os.unlink(tmp)
        raise
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, dest)
    fsync_dir(Path(dest).absolute().parent)  # the rename itself survives a crash


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it, a file created in it) to disk; where a folder cannot be opened
    or synced (some filesystems), nothing."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: A stop request (SIGTERM, SIGHUP: :func:`request_stop`) that arrived inside a :func:`stop_deferred` block of the
#: main thread, raised when the outermost block ends; and how deep the main thread is in such blocks.
_STOP: dict[str, Any] = {"depth": 0, "pending": None}


@contextlib.contextmanager
def stop_deferred() -> Iterator[None]:
    """A block that a stop request waits for: raised at the block's end instead of inside it.

    Some writes are not safe to interrupt at an arbitrary line, such as
    ``torch.save``, whose zip writer an exception between two of its calls
    leaves unfinished. A stop request that arrives inside the block (on the
    main thread, where signal handlers run) is raised when the outermost
    block ends; Ctrl-C is not deferred.

    Examples
    --------
    >>> done = []
    >>> with stop_deferred():
    ...     request_stop(RuntimeError("stop"))  # the CLI's signal handler passes its Terminated
    ...     done.append("the block's end")
    Traceback (most recent call last):
    RuntimeError: stop
    >>> done
    ["the block's end"]
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STOP["depth"] += 1
    try:
        yield
    finally:
        _STOP["depth"] -= 1
        pending = _STOP["pending"] if _STOP["depth"] == 0 else None
        if pending is not None:
            _STOP["pending"] = None
            raise pending


def request_stop(stop: BaseException) -> None:
    """Raise ``stop`` now, or, inside a :func:`stop_deferred` block of the main thread, when the block ends."""
    if _STOP["depth"] > 0 and threading.current_thread() is threading.main_thread():
        _STOP["pending"] = _STOP["pending"] or stop
        return
    raise stop


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, what: str, *, text: bool = False, note: str = "") -> Iterator[IO[Any]]:
    """A file to write ``path`` through: a temporary beside it, flushed to disk and renamed into place when the block
    ends; nothing is left at ``path`` or beside it when a write fails.

    A failed write (a full disk, an I/O error) is one line, ``<path>: could
    not write <what> (<reason>)``, followed by ``; <note>`` when given; the
    file already at ``path`` stays as it was. ``path`` must be a regular file
    or nothing (:func:`publish`).

    Examples
    --------
    >>> path = Path(tempfile.mkdtemp()) / "a.txt"
    >>> with atomic_write(path, "the note", text=True) as f:
    ...     _ = f.write("hello")
    >>> path.read_text()
    'hello'
    """
    path = Path(path)
    tail = f"; {note}" if note else ""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise ReservoirError(f"{path}: could not write {what} ({err.strerror or one_line(err)}){tail}") from None
    try:
        opened: IO[Any] = open(fd, "w", encoding="utf-8") if text else open(fd, "wb")  # noqa: SIM115 - closed below
        with opened as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    except OSError as err:
        raise ReservoirError(f"{path}: could not write {what} ({err.strerror or one_line(err)}){tail}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 110, fmt: str = "png") -> Path:
    """A matplotlib figure written at ``path`` (as ``fmt``, whatever the suffix says) through :func:`atomic_write`:
    a full disk is one line and no half-written figure is left."""
    path = Path(path)
    with atomic_write(path, "the figure") as f:
        fig.savefig(f, format=fmt, dpi=dpi)
    return path
