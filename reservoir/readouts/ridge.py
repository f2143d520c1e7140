"""Ridge classification in closed form, from streamed sufficient statistics.

Targets are one-vs-rest ``±1`` per head and class (scikit-learn's
``RidgeClassifier`` convention; 0/1 one-hot targets would give the same
predictions with half the scores). One pass over the chunks accumulates, in
float64, ``n``, the column sums, ``XᵀX`` and ``XᵀY`` (as per-class sums of
rows); centring them analytically leaves the intercept unpenalized, and

    (XcᵀXc + alpha I) W = XcᵀYc

is solved for every candidate alpha from one eigendecomposition
``XcᵀXc = V diag(lam) Vᵀ``: ``W(alpha) = V diag(1 / (lam + alpha)) Vᵀ XcᵀYc``.
So a grid of alphas costs one ``eigh`` plus one pass over the validation rows.
The store is never loaded whole.

The default grid is scale-aware: ``alpha = r * trace(XcᵀXc) / d`` for 13
``r`` from ``1e-6`` to ``1e2`` (two thirds of a decade apart), i.e. ``r`` times ``n`` times the
mean feature variance, so it means the same on raw hidden states (variances of
1e3) and on normalized ones. The chosen ``alpha_`` is kept as an absolute value
when refitting on all rows (like a prior's precision, it does not scale with
``n``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from sklearn.utils.validation import validate_data

from reservoir import options
from reservoir.readouts import base
from reservoir.readouts.stats import (
    MOMENT_BLOCK_ROWS,
    Moments,
    can_carve,
    carve_fraction,
    checked_chunks,
    chunk_source,
    encode_labels,
    held_out,
    holdout_mask,
    per_group,
    split_seed,
)

DEFAULT_RATIOS = tuple(np.logspace(-6, 2, 13))  # times trace(XcᵀXc) / d: 13 strengths, 2/3 of a decade apart


class _Stats:
    """Streamed ``Moments`` of X plus, per label, ``Σ (x - shift) [y_h = label]`` ``(d, H)`` and counts ``(H,)``."""

    def __init__(self, shift: np.ndarray, dtype=np.float64):
        self.shift = shift  # (d,)
        self.x = Moments(shift, dtype=dtype)
        self.by_class: dict = {}

    def update(self, X: np.ndarray, Y: np.ndarray) -> None:  # X (m, d), Y (m, H)
        if not len(X):
            return
        present = np.unique(Y)  # (k,)
        O = (Y[:, :, None] == present).reshape(len(Y), -1)  # (m, H*k): label c of head h in column h*k + c
        xt = self.x.update(X, O)
        assert xt is not None  # asked for with targets
        sums = xt.reshape(-1, Y.shape[1], len(present))  # (d, H, k) shifted, float64
        counts = O.sum(0).reshape(Y.shape[1], len(present))  # (H, k)
        for i, c in enumerate(present):
            s, k = sums[:, :, i], counts[:, i].astype(np.float64)  # (d, H), (H,)
            old = self.by_class.get(c)
            self.by_class[c] = (s, k) if old is None else (old[0] + s, old[1] + k)

    def __sub__(self, other: _Stats) -> _Stats:
        """The statistics of the rows of ``self`` that are not in ``other`` (a subset of them)."""
        out = _Stats(self.shift, self.x.dtype)
        out.x = self.x - other.x
        out.by_class = dict(self.by_class)
        for c, (s, k) in other.by_class.items():
            mine = out.by_class[c]
            out.by_class[c] = (mine[0] - s, mine[1] - k)
        return out

    def centred(self, classes: np.ndarray, n_heads: int):
        """``mean_x (d,)``, ``XcᵀXc (d, d)``, ``XcᵀYc (d, H*C)`` and ``mean_y (H*C,)`` for ``±1`` targets."""
        n, d = max(self.x.n, 1), len(self.shift)
        zero = (np.zeros((d, n_heads)), np.zeros(n_heads))
        S1 = np.stack([self.by_class.get(c, zero)[0] for c in classes], -1)  # (d, H, C)
        cnt = np.stack([self.by_class.get(c, zero)[1] for c in classes], -1)  # (H, C)
        s1 = self.x.s1 if self.x.s1 is not None else np.zeros(d)
        XtY = 2.0 * (S1 - s1[:, None, None] * (cnt / n))  # (d, H, C): Xcᵀ(2·onehot - 1), centred
        mean_y = 2.0 * cnt / n - 1.0  # (H, C)
        return self.x.mean, self.x.scatter(), XtY.reshape(d, -1), mean_y.reshape(-1)


class RidgeReadout(base.LinearReadout):
    """Closed-form ridge classifier (one-vs-rest ``±1`` targets); alpha picked on validation accuracy.

    Parameters
    ----------
    alphas : sequence of float, optional
        Candidate L2 strengths (absolute, on the summed squared error, each
        ``> 0``); default ``r * trace(XcᵀXc) / d`` for 13 ``r`` from
        ``1e-6`` to ``1e2``, log-spaced. Ties in validation accuracy go to the
        stronger alpha. One value needs no carved validation split (given
        validation data still scores it).
    val_fraction : float
        Share of the training rows, in ``(0, 1)``, held out to choose
        ``alpha`` when no validation data is given, by a seeded hash of the
        global row index (so ``fit`` and ``fit_chunks`` hold out the same
        rows however the data is chunked); the final solution is refitted on
        all rows.
    precision : float or None
        Relative precision of the features (``np.finfo(np.float16).eps`` for
        a float16 store, what ``fit_linear`` passes). When it is coarser than
        1e-4 and the features are float32, each block's products are taken in
        float32 (twice as fast, rounding near 1e-7 of the sums); otherwise in
        float64.
    group_rows : int
        Consecutive rows that make one example (``>= 1``): a bit-memory
        store's output tokens. The validation split holds out whole examples,
        and ``val_correct_`` counts per example.
    random_state : int or None
        Seed of the validation split.

    ``fit`` checks every parameter first (see :class:`~reservoir.readouts.base.LinearReadout`).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_heads, n_classes, n_features)
    intercept_ : ndarray of shape (n_heads, n_classes)
        Scores are ``X @ coef_[h].T + intercept_[h]`` (on the original features).
    alpha_ : float
    val_scores_ : dict of float to float
        Validation accuracy of each candidate alpha (empty without validation).
    val_correct_ : ndarray of shape (n_val,) or None
        Correct heads of each validation row (each example of ``group_rows``
        rows) at the chosen alpha.
    n_features_in_ : int

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X, y = load_iris(return_X_y=True)
    >>> RidgeReadout().fit(X, y).score(X, y) > 0.8
    True
    """

    _parameter_checks: ClassVar[dict[str, options.Constraint]] = {
        "alphas": options.grid(options.number(0, open_low=True)), "val_fraction": base.VAL_FRACTION,
        "random_state": options.RANDOM_STATE, "precision": options.optional(options.number(0, 1)),
        "group_rows": options.integer(1),
    }
    _dtype = (np.float64, np.float32)

    def __init__(self, alphas=None, val_fraction=0.1, precision=None, group_rows=1, random_state=0):
        self.alphas = alphas
        self.val_fraction = val_fraction
        self.precision = precision
        self.group_rows = group_rows
        self.random_state = random_state

    # -- fitting -------------------------------------------------------------
    def fit(self, X, y, validation_data=None):
        """Fit on one chunk; ``validation_data=(X_val, y_val)`` replaces the carved validation split."""
        return self.fit_chunks([(X, y)], None if validation_data is None else [tuple(validation_data)])

    def fit_chunks(self, train_chunks, val_chunks=None):
        """Fit from chunks (see :class:`base.LinearReadout`): one pass for the statistics, one over the validation rows.

        A validation split carved from train reads ``train_chunks`` a second time.

        Examples
        --------
        >>> est = RidgeReadout().fit_chunks(lambda: iter_layer(store, "train", 6))  # doctest: +SKIP
        """
        self._check_params()
        train_chunks = chunk_source(train_chunks)
        seed = split_seed(self.random_state)
        carve = val_chunks is None and (self.alphas is None or len(self.alphas) > 1)
        everything, held, y_shape = self._accumulate(train_chunks, seed if carve else None, self.val_fraction)
        fraction = self.val_fraction
        if carve and not 0 < held.x.n < everything.x.n:  # a few rows: the hash held none, or all, out
            fraction = carve_fraction(everything.x.n, self.val_fraction, seed, self.group_rows)
            if fraction != self.val_fraction:
                everything, held, y_shape = self._accumulate(train_chunks, seed, fraction)
        fit_s = everything - held
        self.classes_ = np.unique(np.array(list(everything.by_class)))
        if len(self.classes_) < 2:  # nothing to learn; every row would be predicted right (scikit-learn refuses too)
            raise ValueError(f"expected training labels of at least 2 classes; found one class, "
                             f"{self.classes_.tolist()}")
        carve = carve and can_carve(everything.x.n, held.x.n)
        if not carve:
            fit_s = everything
        H, C, d = int(np.prod(y_shape)), len(self.classes_), self.n_features_in_
        mean_x, S, B, mean_y = fit_s.centred(self.classes_, H)
        lam, V = np.linalg.eigh(S)  # the one eigendecomposition for the whole grid
        lam = np.maximum(lam, 0.0)
        Q = V.T @ B  # (d, H*C)
        scale = np.trace(S) / d if np.trace(S) > 0 else 1.0
        grid = sorted(self.alphas if self.alphas is not None else [r * scale for r in DEFAULT_RATIOS], reverse=True)

        self.val_scores_, self.val_correct_ = {}, None
        solution = (mean_x, V, lam, Q, mean_y)
        if carve:
            held = held_out(train_chunks, fraction, seed, group=self.group_rows)
            self._select_alpha(grid, solution, held, H, validated=True)
        elif val_chunks is not None:
            self._select_alpha(grid, solution, chunk_source(val_chunks, "val_chunks"), H, validated=False)
        else:
            self.alpha_ = float(grid[-1])

        if carve:  # refit on all rows with the chosen alpha
            mean_x, S, B, mean_y = everything.centred(self.classes_, H)
            lam_all, V_all = np.linalg.eigh(S)  # eigenvalues at rounding level below 0 count as 0, as on the path
            W = V_all @ ((V_all.T @ B) / (np.maximum(lam_all, 0.0) + self.alpha_)[:, None])  # (d, H*C)
        else:
            W = V @ (Q / (lam + self.alpha_)[:, None])  # (d, H*C)
        self.coef_ = W.T.reshape(H, C, d)
        self.intercept_ = (mean_y - mean_x @ W).reshape(H, C)
        self.n_heads_ = H if y_shape else 0
        return self

    def _coarse(self, X: np.ndarray) -> bool:
        """Whether float32 statistics are exact enough: float32 features stored coarser than 1e-4 (a float16
        store, ``precision``), whose own rounding dwarfs float32's."""
        return self.precision is not None and self.precision >= 1e-4 and X.dtype == np.float32

    def _accumulate(self, train_chunks, seed: int | None, fraction: float
                    ) -> tuple[_Stats, _Stats, tuple[int, ...]]:
        """Pass 1: statistics of every row and of the held-out rows, and the shape of ``y`` past its rows.

        Rows are held out by :func:`holdout_mask` with ``fraction`` and ``seed``; none when ``seed`` is None.
        """
        every: _Stats | None = None
        held: _Stats | None = None
        start, y_shape = 0, ()
        for X, y in checked_chunks(self, train_chunks, first=True, dtype=self._dtype):
            Y = y.reshape(len(y), -1)  # (m, H)
            if every is None or held is None:
                shift = X[:MOMENT_BLOCK_ROWS].astype(np.float64).mean(0) if len(X) else np.zeros(X.shape[1])
                dtype = np.float32 if self._coarse(X) else np.float64
                every, held = _Stats(shift, dtype), _Stats(shift, dtype)
            every.update(X, Y)  # every row, then the held-out ones again (a tenth): no copy of the rows to fit
            if seed is not None:
                m = holdout_mask(start, len(X), fraction, seed, self.group_rows)
                held.update(X[m], Y[m])
            start, y_shape = start + len(X), y.shape[1:]
        if start == 0 or every is None or held is None:
            raise ValueError("train_chunks yielded no rows; expected at least one (X, y) chunk with rows")
        return every, held, y_shape

    def _select_alpha(self, grid, solution, val_rows, n_heads: int, validated: bool) -> None:
        """Pass 2: every alpha's accuracy on the validation rows; ``alpha_`` the best (the strongest of ties).

        ``solution`` is ``(mean_x, V, lam, Q, mean_y)``: the fit rows' mean, the eigenbasis of their
        ``XcᵀXc``, its eigenvalues, ``Vᵀ XcᵀYc`` and the targets' mean. ``validated``: the rows are
        held-out training rows, already checked in pass 1.
        """
        mean_x, V, lam, Q, mean_y = solution
        weights = np.concatenate([Q / (lam + a)[:, None] for a in grid], 1)  # (d, grid * H*C) in the eigenbasis
        parts = []
        for X, y in val_rows():
            if not validated:
                X = validate_data(self, X, reset=False, dtype=self._dtype)
            Yv = encode_labels(self.classes_, y, unseen=not validated)
            Yv = Yv.reshape(len(X), -1)  # (m, H)
            if Yv.shape[1] != n_heads:
                raise ValueError(f"validation y must have {n_heads} head(s) like the training y; "
                                 f"got shape {np.shape(y)}")
            Z = (X.astype(np.float64) - mean_x) @ V  # (m, d) in the eigenbasis
            scores = (Z @ weights).reshape(len(X), len(grid), n_heads, -1) + mean_y.reshape(n_heads, -1)
            parts.append((scores.argmax(-1) == Yv[:, None, :]).sum(2))  # (m, grid) correct heads per row
        per_row = np.concatenate(parts) if parts else np.zeros((0, len(grid)), np.int64)
        accs = per_row.sum(0) / max(per_row.size // len(grid) * n_heads, 1)
        self.val_scores_ = {float(a): float(acc) for a, acc in zip(grid, accs)}
        best = int(np.argmax(accs))  # first maximum: the strongest of ties
        self.alpha_, self.val_correct_ = float(grid[best]), per_group(per_row[:, best], self.group_rows)

    # -- predicting ----------------------------------------------------------
    def _class_scores(self, X):
        """Ridge scores per head ``(n, H, C)`` on the original features."""
        X = self._validated(X)
        H, C, d = self.coef_.shape
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused whole, not warned of
            scores = (X.astype(np.float64) @ self.coef_.reshape(H * C, d).T).reshape(len(X), H, C) + self.intercept_
        return self._finite(scores)

    def decision_function(self, X):
        """Ridge scores, per head in scikit-learn's convention.

        One head: ``(n,)`` for two classes (the score of ``classes_[1]`` against
        targets of -1 and +1, as scikit-learn's ``RidgeClassifier`` gives it:
        positive means ``classes_[1]``), else ``(n, n_classes)``. Several heads:
        ``(n, n_heads)`` for two classes, else ``(n, n_heads, n_classes)``.
        """
        s = self._class_scores(X)  # (n, H, C)
        # two classes: the columns' targets are each other's negatives, so are their scores; half their difference
        # is the positive class's score
        s = (s[..., 1] - s[..., 0]) / 2 if s.shape[-1] == 2 else (s[..., 0] if s.shape[-1] == 1 else s)
        return s[:, 0] if self.n_heads_ == 0 else s
