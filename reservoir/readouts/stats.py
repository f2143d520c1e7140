"""Streams of feature chunks and the statistics both readouts accumulate from them.

Readouts that fit from a stream take a *chunk source*: a callable returning a
fresh iterable of ``(X_chunk, y_chunk)`` each time it is called (every pass over
the data calls it again), e.g. ``lambda: iter_layer(store, "train", 6)``. This
module holds what both readouts share on such streams: label checks, streamed
moments, and the validation split carved from train (by a seeded hash of the
row index when streaming, so it does not depend on how rows are chunked; by a
seeded permutation when all rows are in memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

Chunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]

#: Rows converted to float64 at a time when accumulating moments (a few MB: the block stays in cache).
MOMENT_BLOCK_ROWS = 8192
#: Rows per float32 product when moments are taken in float32 (short sums: rounding stays near 1e-7 of them).
FLOAT32_BLOCK_ROWS = 2048
#: Fewer training rows than this are never split for validation (every row fits the one candidate).
MIN_CARVE_ROWS = 10


def chunk_source(chunks, name: str = "train_chunks") -> Chunks:
    """A callable giving a fresh iterable per pass, from a callable or a list of ``(X, y)``."""
    if callable(chunks):
        return chunks
    if isinstance(chunks, Iterator):
        raise TypeError(f"{name} must be a callable returning a fresh iterable of (X, y) chunks, or a list; "
                        f"got a one-shot {type(chunks).__name__} (the fit reads the chunks more than once)")
    return lambda: chunks


def checked_chunks(est, chunks: Chunks, first: bool = False, dtype=np.float32):
    """Yield ``(X, y)`` validated like ``fit`` input; ``first=True`` sets ``n_features_in_`` from chunk one."""
    head_shape = None
    for X, y in chunks():
        X, y = validate_data(est, X, y, reset=first, multi_output=True, dtype=dtype, y_numeric=False)
        check_classification_targets(y)
        if head_shape is not None and y.shape[1:] != head_shape:
            raise ValueError(f"every chunk's y must have shape (n, *{head_shape}); got a chunk with {y.shape}")
        head_shape, first = y.shape[1:], False
        yield X, y


def encode_labels(classes: np.ndarray, y, what: str = "labels", unseen: bool = False) -> np.ndarray:
    """Class indices of ``y`` in ``classes``; a ``ValueError`` for labels outside them.

    ``unseen=True`` (validation labels) encodes a label outside ``classes`` as
    -1 instead, which no prediction equals: a row of a class the training rows
    lack counts as wrong, as it does on the test split.
    """
    y = np.asarray(y)
    idx = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
    known = classes[idx] == y
    if unseen:
        return np.where(known, idx, -1)
    if not np.all(known):
        raise ValueError(f"{what} must be among the training classes {classes.tolist()}")
    return idx


# -- the validation split carved from train ------------------------------------
def carve_rows(n: int, fraction: float, random_state, group: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(fit_rows, val_rows)`` of ``n`` in-memory rows: a seeded permutation, ``fraction`` of it held out.

    At least one row lands on each side. What :meth:`LogisticReadout.fit
    <reservoir.readouts.logistic.LogisticReadout.fit>` holds out, so a
    comparison can select on the same rows. With ``group > 1`` each run of
    ``group`` consecutive rows (one example's output tokens) is permuted and
    held out whole, its rows kept in order.

    Examples
    --------
    >>> fit_rows, val_rows = carve_rows(20, 0.1, 0)
    >>> len(fit_rows), len(val_rows), sorted([*fit_rows, *val_rows]) == list(range(20))
    (18, 2, True)
    """
    if group > 1:
        fit_groups, val_groups = carve_rows(n // group, fraction, random_state)
        rows = np.arange(group)
        return (fit_groups[:, None] * group + rows).ravel(), (val_groups[:, None] * group + rows).ravel()
    perm = np.random.default_rng(random_state).permutation(n)
    n_val = min(n - 1, max(1, round(fraction * n)))
    return perm[n_val:], perm[:n_val]


def split_seed(random_state) -> int:
    """The key of :func:`holdout_mask` for an estimator's ``random_state``."""
    return int(np.random.default_rng(random_state).integers(2**63))


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def holdout_mask(start: int, n: int, fraction: float, seed: int, group: int = 1) -> np.ndarray:
    """Which of the global rows ``start..start+n-1`` are held out for validation.

    A seeded hash of the row index (splitmix64), so the split is the same
    however the rows are chunked; about ``fraction`` of the rows are held out.
    With ``group > 1``, of the index of the run of ``group`` consecutive rows
    a row is in: an example's output tokens are held out together.
    """
    return _uniform(np.arange(start, start + n, dtype=np.uint64) // np.uint64(group), seed) < fraction  # (n,) bool


def _uniform(index: np.ndarray, seed: int) -> np.ndarray:
    """The seeded hash of each index, as a float64 in [0, 1) (53 bits)."""
    key = _splitmix64(np.array([seed % 2**64], dtype=np.uint64))
    return (_splitmix64(index ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def carve_fraction(n: int, fraction: float, seed: int, group: int = 1) -> float:
    """The ``fraction`` to give :func:`holdout_mask` over ``n`` rows so it holds out some rows and keeps some.

    ``fraction`` itself whenever it does, which is all but certain past a few
    dozen rows. Otherwise (a few rows: 20 hold out none about one time in
    eight at 0.1) the threshold that holds out the ``max(1, round(fraction *
    groups))`` groups of rows whose hashes are smallest, fewer than all; the
    same rows however they are chunked.

    Examples
    --------
    >>> carve_fraction(10_000, 0.1, 0)
    0.1
    >>> int(holdout_mask(0, 20, carve_fraction(20, 0.01, 0), 0).sum())
    1
    """
    u = _uniform(np.arange(max(n // group, 1), dtype=np.uint64), seed)  # one per group of rows
    if 0 < int((u < fraction).sum()) < len(u) or len(u) < 2:
        return fraction
    k = min(len(u) - 1, max(1, round(fraction * len(u))))
    return float(np.nextafter(np.sort(u)[k - 1], 1.0))  # holds out exactly the k smallest


def held_out(chunks: Chunks, fraction: float, seed: int, keep: bool = True, group: int = 1) -> Chunks:
    """The chunk source of the rows :func:`holdout_mask` holds out (``keep=True``) or leaves to fit (``False``).

    Empty chunks are skipped; rows keep their order.
    """
    def source():
        start = 0
        for X, y in chunks():
            X, y = np.asarray(X), np.asarray(y)
            m = holdout_mask(start, len(X), fraction, seed, group) == keep  # (m,) bool
            start += len(X)
            if m.any():
                yield X[m], y[m]
    return source


def per_group(correct: np.ndarray, group: int, what: str = "validation rows") -> np.ndarray:
    """Correct heads per example ``(m,)`` from those per row ``(m * group,)`` (rows of one example consecutive)."""
    if group == 1:
        return correct
    if len(correct) % group:
        raise ValueError(f"expected {what} in whole groups of {group} (group_rows); found {len(correct)} rows")
    return correct.reshape(-1, group).sum(1)


def can_carve(n: int, n_val: int) -> bool:
    """Whether ``n_val`` held-out rows of ``n`` make a validation split (enough rows, some on each side)."""
    return n >= MIN_CARVE_ROWS and 0 < n_val < n


# -- moments -------------------------------------------------------------------
class Moments:
    """Streamed row count, mean and scatter of feature rows, in float64.

    Rows are shifted by a fixed vector (the first chunk's mean unless given)
    before accumulating, so features with large means (hidden states have a
    few huge dimensions) do not cancel catastrophically. Two ``Moments`` with
    the same shift add up with ``+``. ``full=False`` keeps only the diagonal.
    ``dtype=np.float32`` takes each block's products in float32 (twice as
    fast; rounding near 1e-7 of the sums, far below the precision of features
    stored in float16), summed across blocks in float64.

    Examples
    --------
    >>> m = Moments()
    >>> _ = m.update(np.array([[1.0, 2.0], [3.0, 6.0]]))
    >>> m.n, m.mean.tolist(), m.scatter().tolist()
    (2, [2.0, 4.0], [[2.0, 4.0], [4.0, 8.0]])
    """

    def __init__(self, shift: np.ndarray | None = None, full: bool = True, dtype=np.float64):
        self.shift: np.ndarray | None = shift
        self.full, self.n = full, 0
        self.dtype = np.dtype(dtype)  # of the products; sums across blocks are float64 either way
        self.s1: np.ndarray | None = None  # (d,) sum of shifted rows
        self.sxx: np.ndarray | None = None  # (d, d), or (d,) when not full: sum of their squares

    def update(self, X: np.ndarray, targets: np.ndarray | None = None) -> np.ndarray | None:
        """Add rows ``X (n, d)`` (any float dtype; sums in float64, a block of rows at a time).

        With ``targets (n, k)``, also returns ``(X - shift)ᵀ targets`` ``(d, k)`` in float64, from the same
        read of the rows (what ridge needs per class).
        """
        if self.shift is None:  # close to the mean is all the shift needs to be: the first rows' mean
            self.shift = X[:MOMENT_BLOCK_ROWS].astype(np.float64).mean(0) if len(X) else np.zeros(X.shape[1])
        d = X.shape[1]
        s1 = np.zeros(d)
        sxx = np.zeros((d, d) if self.full else d)
        xt = None if targets is None else np.zeros((d, targets.shape[1]))
        step = MOMENT_BLOCK_ROWS if self.dtype == np.float64 else FLOAT32_BLOCK_ROWS
        shift = self.shift.astype(self.dtype)
        for lo in range(0, len(X), step):  # a block at a time: no float64 copy of X
            B = X[lo: lo + step].astype(self.dtype)
            B -= shift  # (m, d)
            s1 += B.sum(0, dtype=np.float64)
            sxx += B.T @ B if self.full else np.einsum("ij,ij->j", B, B)  # BᵀB: a symmetric rank-k update
            if xt is not None and targets is not None:  # (k, m) @ (m, d), transposed: fast for a few targets
                xt += (targets[lo: lo + step].T.astype(self.dtype) @ B).T
        if self.s1 is None or self.sxx is None:
            self.s1, self.sxx = s1, sxx
        else:
            self.s1, self.sxx = self.s1 + s1, self.sxx + sxx
        self.n += len(X)
        return xt

    def __sub__(self, other: Moments) -> Moments:
        """The moments of the rows of ``self`` not in ``other`` (a subset of them, shifted alike)."""
        if other.full != self.full or not _same(other.shift, self.shift):
            raise ValueError("expected Moments with the same shift and kind to subtract; found different ones")
        if other.s1 is None:
            return self
        out = Moments(self.shift, self.full, self.dtype)
        out.n, out.s1, out.sxx = self.n - other.n, _sum(self.s1) - other.s1, _sum(self.sxx) - _sum(other.sxx)
        return out

    @property
    def mean(self) -> np.ndarray:
        """The mean row ``(d,)``."""
        return _sum(self.shift) + _sum(self.s1) / max(self.n, 1)  # (d,)

    def scatter(self) -> np.ndarray:
        """Centred ``Xcᵀ Xc`` ``(d, d)`` (its diagonal ``(d,)`` when ``full=False``)."""
        s1 = _sum(self.s1)
        m = s1 / max(self.n, 1)
        return _sum(self.sxx) - (np.outer(s1, m) if self.full else s1 * m)


def _sum(a: np.ndarray | None) -> np.ndarray:
    """A sum held by :class:`Moments`; a ValueError if no rows were added yet."""
    if a is None:
        raise ValueError("expected Moments with rows added; found none")
    return a


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two shifts are one (both unset, or equal arrays)."""
    return a is b or (a is not None and b is not None and bool(np.array_equal(a, b)))
