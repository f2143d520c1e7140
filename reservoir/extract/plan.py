"""How rows become forward passes: windows of store chunks, length buckets, token budgets.

A split is processed in *windows*: consecutive unfinished store chunks whose
rows, output and inputs fit a memory budget. Inside a window the rows are
sorted by length and cut into batches, so a batch is padded only to its own
longest sequence; a window of many chunks pads far less than one chunk alone.
Batches hold at most ``batch_size`` rows and, with a token budget, at most
``max_tokens`` padded tokens (rows x longest length), so short sequences travel
in large batches and long ones in small ones.

Everything here is plain numpy on the host: the plan is known before the
first forward, and the hot loop never asks the device for a length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError

#: Default rows per batch when no token budget is given (the CPU's default).
DEFAULT_BATCH_SIZE = 64
#: On CUDA, with neither a batch size nor a token budget given: a token budget of this many activation elements
#: (padded tokens x model width) per forward. Rows of 64 keep a GPU launch-bound on short sequences and small models
#: (kernels shorter than their launches); this budget fills it (87,381 tokens at width 768, 16,384 at 4,096), and the
#: window (:data:`WINDOW_ROWS`) caps the rows.
CUDA_BATCH_ELEMENTS = 1 << 26
#: Host memory one window may use for its outputs and inputs (the extraction's working set).
WINDOW_BYTES = 256 << 20
#: Most rows per window: what a kill can cost, since a window's chunks are written when it ends; small enough that
#: a split runs as several windows, so writing one overlaps computing the next (the last window's write is the
#: pass's tail), large enough that batching rows by length within a window pads little.
WINDOW_ROWS = 2048


@dataclass(frozen=True)
class Window:
    """Chunks processed together; ``rows`` are the split's row indices in chunk order.

    ``done`` lists chunks of the window already written: their rows are run
    again (so every row is batched as in an uninterrupted run) but not
    written.
    """

    chunks: list[int]
    rows: np.ndarray  # (n,)
    done: tuple[int, ...] = ()


def check_batching(batch_size: int | None, max_tokens: int | None) -> None:
    """Refuse batch sizes and token budgets that are not integers >= 1, in one line."""
    for flag, value in (("--batch-size", batch_size), ("--max-tokens", max_tokens)):
        if value is not None and not (options.is_int(value) and value >= 1):
            raise ReservoirError(f"{flag} must be an integer >= 1, found {options.shown(value)}")


def other_batching(begun: dict[str, Any] | None, mine: dict[str, Any] | None) -> dict[str, Any] | None:
    """The batching a store was begun with when a writer's own differs from it, else ``None`` (the same, or either
    unrecorded: a store of an earlier version is taken as it is). A row's features depend on the rows batched with
    it (their padding), so one store holds one batching: a resume, and every rank, writes only with its own.

    Examples
    --------
    >>> other_batching({"batch_size": 64, "max_tokens": None}, {"batch_size": 32, "max_tokens": None})
    {'batch_size': 64, 'max_tokens': None}
    >>> other_batching(None, {"batch_size": 32, "max_tokens": None}) is None
    True
    """
    return None if begun is None or mine is None or begun == mine else begun


def batching_flags(batching: dict[str, Any]) -> str:
    """A store's recorded batching as the options that give it (``--batch-size 64``, ``--max-tokens 87381``).

    Examples
    --------
    >>> batching_flags({"batch_size": None, "max_tokens": 87381})
    '--max-tokens 87381'
    """
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in batching.items() if v is not None]
    return " ".join(flags) or "the device's default"


def resolve_batching(batch_size: int | None, max_tokens: int | None, device,
                     n_dim: int) -> tuple[int | None, int | None]:
    """The ``(batch_size, max_tokens)`` a pass runs with: the given ones, or the device's default.

    Given either, they stand (a row cap of :data:`DEFAULT_BATCH_SIZE` without
    a budget, :func:`plan_order`). Given neither: 64 rows on the CPU; on CUDA
    a budget of :data:`CUDA_BATCH_ELEMENTS` // ``n_dim`` padded tokens.

    Examples
    --------
    >>> resolve_batching(None, None, "cuda", 768), resolve_batching(None, None, "cpu", 768)
    ((None, 87381), (64, None))
    """
    check_batching(batch_size, max_tokens)
    if batch_size is not None or max_tokens is not None:
        return batch_size, max_tokens
    if getattr(device, "type", str(device).split(":")[0]) == "cuda":
        return None, max(1, CUDA_BATCH_ELEMENTS // n_dim)
    return DEFAULT_BATCH_SIZE, None


def plan_order(lengths: np.ndarray, batch_size: int | None = None,
               max_tokens: int | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Rows sorted by length (stable) and the ``(lo, hi)`` bounds of each batch in that order.

    Parameters
    ----------
    lengths : np.ndarray
        ``(n,)`` real lengths, ``n >= 1``.
    batch_size : int, optional
        Most rows per batch. Default: :data:`DEFAULT_BATCH_SIZE` without a
        token budget, unbounded with one.
    max_tokens : int, optional
        Most padded tokens per batch (rows x the batch's longest length); a
        row longer than the budget still gets a batch of its own.

    Returns
    -------
    order : np.ndarray
        ``(n,)`` row indices in increasing length.
    bounds : list of (int, int)
        Batch ``i`` is ``order[lo:hi]``, padded to ``lengths[order[hi - 1]]``.
    """
    check_batching(batch_size, max_tokens)
    if batch_size is None and max_tokens is None:
        batch_size = DEFAULT_BATCH_SIZE
    lengths = np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    n = len(order)
    if max_tokens is None:
        assert batch_size is not None  # set above when both are None
        return order, [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
    cap = batch_size or n
    sorted_len = lengths[order].tolist()
    bounds, lo = [], 0
    while lo < n:
        # rows lo..hi-1 fit while (hi - lo) * sorted_len[hi - 1] <= max_tokens (lengths increase with hi)
        hi = lo + 1
        while hi < n and hi - lo < cap and (hi + 1 - lo) * sorted_len[hi] <= max_tokens:
            hi += 1
        bounds.append((lo, hi))
        lo = hi
    return order, bounds


def plan_windows(todo: np.ndarray, chunk_rows: int, n_rows: int, row_bytes: int,
                 budget: int | None = None, max_rows: int | None = None, stable: bool = False) -> list[Window]:
    """Group unfinished chunks (in order) into windows of at most ``budget`` bytes and ``max_rows`` rows.

    Defaults: :data:`WINDOW_BYTES` and :data:`WINDOW_ROWS`. A window holds at
    least one chunk, whatever its size. ``stable``: the windows of a fresh
    store (every chunk), keeping those with an unfinished chunk and marking
    their finished ones ``done``, so that a resumed run pads and batches every
    row as an uninterrupted one does (rows of varying lengths are batched by
    length within their window, so another window would change a row's batch,
    its padding and its float rounding).

    Examples
    --------
    >>> [(w.chunks, w.done) for w in plan_windows(np.array([1, 2]), 10, 40, 4, max_rows=20, stable=True)]
    [([0, 1], (0,)), ([2, 3], (3,))]
    """
    budget = WINDOW_BYTES if budget is None else budget
    max_rows = WINDOW_ROWS if max_rows is None else max_rows
    per_window = max(1, min(budget // max(1, row_bytes * chunk_rows), max_rows // chunk_rows))
    plan = np.arange(-(-n_rows // chunk_rows)) if stable else todo
    unfinished = {int(c) for c in todo}
    windows = []
    for i in range(0, len(plan), per_window):
        chunks = [int(c) for c in plan[i : i + per_window]]
        if not unfinished.intersection(chunks):
            continue
        rows = np.concatenate([np.arange(c * chunk_rows, min((c + 1) * chunk_rows, n_rows)) for c in chunks])
        windows.append(Window(chunks, rows, tuple(c for c in chunks if c not in unfinished)))
    return windows
