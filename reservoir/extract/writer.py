"""A background writer: store chunks are written while the next window computes.

The extraction loop hands each finished window to :class:`ChunkWriter` and
goes on with the next one; background threads write the windows' chunks (and
their ``done`` flags): one thread in submission order, or ``workers`` threads
side by side, each window's chunks disjoint from the others' (what a GPU
needs when it computes rows faster than one thread stores them). The queue
is short, so at most ``depth`` windows wait in memory beside those being
written. :func:`write_window` is what a pass hands it: a :class:`FinishedWindow`
into the store. A write error stops the run at the next hand-over (or at
:meth:`ChunkWriter.close`) with the original exception; a chunk whose write
failed is never marked done, so the same command resumes there.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.extract.plan import Window
    from reservoir.store import WritableStore
    from reservoir.tasks import Split

_STOP = object()
T = TypeVar("T")


class ChunkWriter(Generic[T]):
    """Run ``write(item)`` for every submitted item on background threads (one: in order).

    Parameters
    ----------
    write : callable
        Writes one item; its exceptions are re-raised in the submitting thread.
        With several workers it is called from several threads at once.
    depth : int
        Items that may wait; :meth:`submit` blocks beyond that (back-pressure
        keeps memory bounded when the disk is slower than the model).
    workers : int
        Threads writing items side by side (the first error stops them all).

    Examples
    --------
    >>> seen = []
    >>> with ChunkWriter(seen.append) as w:
    ...     w.submit(1); w.submit(2)
    >>> seen
    [1, 2]
    """

    def __init__(self, write: Callable[[T], None], depth: int = 2, workers: int = 1):
        self._write = write
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._abandon = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"reservoir-writer-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

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
                with self._error_lock:
                    if self._error is None:  # the first error is the one reported
                        self._error = err
                self._abandon.set()  # the other workers write nothing more

    def _raise(self) -> None:
        with self._error_lock:
            err, self._error = self._error, None
        if err is not None:
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
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join()
        if not abandon:
            self._raise()

    def __enter__(self) -> "ChunkWriter[T]":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(abandon=exc_type is not None)


@dataclass
class FinishedWindow:
    """A computed window on its way to the store (what the pass hands the background writer)."""

    split_name: str
    split: Split  # the task's split the window's rows come from
    window: Window
    feats: Any  # (n, P, n_layers, n_out, n_dim) host tensor, pinned on CUDA
    states: Any  # (n, L, n_dim) host tensor or None
    ready: Any  # the CUDA event that marks the copy to the host done; None on the CPU


def write_window(store: WritableStore, item: FinishedWindow) -> int:
    """Write a finished window's unfinished chunks (features per pooling, labels, lengths, states) and their flags;
    return the bytes of features and states written."""
    name, split, window = item.split_name, item.split, item.window
    if item.ready is not None:
        item.ready.synchronize()  # the window's device-to-host copy has landed
    feats = item.feats.numpy()  # (n, P, n_layers, n_out, n_dim)
    states = None if item.states is None else item.states.numpy()
    todo = [c for c in window.chunks if c not in window.done]  # done ones ran only to batch rows as before
    rows = window.rows  # the split's rows of window.chunks, chunk after chunk
    if window.done:
        keep = ~np.isin(rows // store.chunk_rows(name), window.done)  # (n,) the rows of chunks still to write
        rows, feats, states = rows[keep], feats[keep], None if states is None else states[keep]
    store.write_chunks(name, todo, {p: feats[:, i] for i, p in enumerate(store.poolings)}, split.labels[rows],
                       lengths=split.lengths[rows], states=states)
    return feats.nbytes + (0 if states is None else states.nbytes)
