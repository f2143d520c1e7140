"""A background writer: store chunks are compressed and written while the next window computes.

The extraction loop hands each finished window to :class:`ChunkWriter` and
goes on with the next one; one thread writes the window's chunks (and their
``done`` flags) in order. The queue is short, so at most ``depth`` windows wait
in memory. A write error stops the run at the next hand-over (or at
:meth:`ChunkWriter.close`) with the original exception; a chunk whose write
failed is never marked done, so the same command resumes there.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, TypeVar

_STOP = object()
T = TypeVar("T")


class ChunkWriter(Generic[T]):
    """Run ``write(item)`` for every submitted item on one background thread, in order.

    Parameters
    ----------
    write : callable
        Writes one item; its exceptions are re-raised in the submitting thread.
    depth : int
        Items that may wait; :meth:`submit` blocks beyond that (back-pressure
        keeps memory bounded when the disk is slower than the model).

    Examples
    --------
    >>> seen = []
    >>> with ChunkWriter(seen.append) as w:
    ...     w.submit(1); w.submit(2)
    >>> seen
    [1, 2]
    """

    def __init__(self, write: Callable[[T], None], depth: int = 2):
        self._write = write
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._abandon = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reservoir-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None or self._abandon.is_set():
                continue  # drain without writing: the run is stopping
            try:
                self._write(item)
            except BaseException as err:  # noqa: BLE001 - handed to the submitting thread
                self._error = err

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            self._abandon.set()
            raise err

    def submit(self, item: T) -> None:
        """Queue one item; raises a previous write's error instead, if there was one."""
        self._raise()
        self._queue.put(item)

    def close(self, abandon: bool = False) -> None:
        """Wait for queued writes (or, with ``abandon``, skip those not started) and stop the thread."""
        if abandon:
            self._abandon.set()
        self._queue.put(_STOP)
        self._thread.join()
        if not abandon:
            self._raise()

    def __enter__(self) -> "ChunkWriter[T]":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(abandon=exc_type is not None)
