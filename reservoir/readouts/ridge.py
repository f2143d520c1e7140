"""Ridge classification in closed form, from streamed sufficient statistics.

Targets are one-vs-rest ``±1`` per head and class (scikit-learn's
``RidgeClassifier`` convention; 0/1 one-hot targets would give the same
predictions with half the scores). One pass over the chunks accumulates, in
float64, ``n``, the column sums, ``XᵀX`` and ``XᵀY`` (as per-class sums of
rows); centring them analytically leaves the intercept unpenalized, and

    (XcᵀXc + alpha I) W = XcᵀYc

is solved for every candidate alpha from ONE eigendecomposition
``XcᵀXc = V diag(lam) Vᵀ``: ``W(alpha) = V diag(1 / (lam + alpha)) Vᵀ XcᵀYc``.
So a grid of alphas costs one ``eigh`` plus one pass over the validation rows.
The store is never loaded whole.

The default grid is scale-aware: ``alpha = r * trace(XcᵀXc) / d`` for ``r`` in
``10**arange(-6, 3)`` (``1e-6 .. 1e2``), i.e. ``r`` times ``n`` times the
mean feature variance, so it means the same on raw hidden states (variances of
1e3) and on normalized ones. The chosen ``alpha_`` is kept as an absolute value
when refitting on all rows (like a prior's precision, it does not scale with
``n``).
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from reservoir.readouts.features import Moments, checked_chunks, chunk_source, encode_labels, holdout_mask

DEFAULT_RATIOS = tuple(10.0 ** np.arange(-6, 3))  # times trace(XcᵀXc) / d


class _Stats:
    """Streamed ``Moments`` of X plus, per label, ``Σ (x - shift) [y_h = label]`` ``(d, H)`` and counts ``(H,)``."""

    def __init__(self, shift: np.ndarray):
        self.x = Moments(shift)
        self.by_class: dict = {}

    def update(self, X: np.ndarray, Y: np.ndarray) -> None:  # X (m, d), Y (m, H)
        if not len(X):
            return
        Xs = self.x.update(X)  # (m, d) shifted, float64
        for c in np.unique(Y):
            O = (Y == c).astype(np.float64)  # (m, H) one-hot of label c per head
            s, k = Xs.T @ O, O.sum(0)  # (d, H), (H,)
            old = self.by_class.get(c)
            self.by_class[c] = (s, k) if old is None else (old[0] + s, old[1] + k)

    def __add__(self, other: _Stats) -> _Stats:
        out = _Stats(self.x.shift)
        out.x = self.x + other.x
        out.by_class = dict(self.by_class)
        for c, (s, k) in other.by_class.items():
            old = out.by_class.get(c)
            out.by_class[c] = (s, k) if old is None else (old[0] + s, old[1] + k)
        return out

    def centred(self, classes: np.ndarray, n_heads: int):
        """``mean_x (d,)``, ``XcᵀXc (d, d)``, ``XcᵀYc (d, H*C)`` and ``mean_y (H*C,)`` for ``±1`` targets."""
        n, d = max(self.x.n, 1), len(self.x.shift)
        zero = (np.zeros((d, n_heads)), np.zeros(n_heads))
        S1 = np.stack([self.by_class.get(c, zero)[0] for c in classes], -1)  # (d, H, C)
        cnt = np.stack([self.by_class.get(c, zero)[1] for c in classes], -1)  # (H, C)
        s1 = self.x.s1 if self.x.s1 is not None else np.zeros(d)
        XtY = 2.0 * (S1 - s1[:, None, None] * (cnt / n))  # (d, H, C): Xcᵀ(2·onehot - 1), centred
        mean_y = 2.0 * cnt / n - 1.0  # (H, C)
        return self.x.mean, self.x.scatter(), XtY.reshape(d, -1), mean_y.reshape(-1)


class RidgeReadout(ClassifierMixin, BaseEstimator):
    """Closed-form ridge classifier (one-vs-rest ``±1`` targets); alpha picked on validation accuracy.

    Parameters
    ----------
    alphas : sequence of float, optional
        Candidate L2 strengths (absolute, on the summed squared error);
        default ``r * trace(XcᵀXc) / d`` for ``r`` in ``10**arange(-6, 3)``.
        Ties in validation accuracy go to the stronger alpha. One value
        needs no carved validation split (given validation data still
        scores it).
    val_fraction : float
        Share of the training rows held out to choose ``alpha`` when no
        validation data is given, by a seeded hash of the global row index
        (so ``fit`` and ``fit_chunks`` hold out the same rows however the
        data is chunked); the final solution is refitted on all rows.
    random_state : int
        Seed of the validation split.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_heads, n_classes, n_features)
    intercept_ : ndarray of shape (n_heads, n_classes)
        Scores are ``X @ coef_[h].T + intercept_[h]`` (on the original features).
    alpha_ : float
    val_scores_ : dict of float to float
        Validation accuracy of each candidate alpha (empty without validation).
    n_features_in_ : int

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X, y = load_iris(return_X_y=True)
    >>> RidgeReadout().fit(X, y).score(X, y) > 0.8
    True
    """

    def __init__(self, alphas=None, val_fraction=0.1, random_state=0):
        self.alphas = alphas
        self.val_fraction = val_fraction
        self.random_state = random_state

    # -- fitting -------------------------------------------------------------
    def fit(self, X, y, validation_data=None):
        """Fit on one chunk; ``validation_data=(X_val, y_val)`` replaces the carved validation split."""
        return self.fit_chunks([(X, y)], None if validation_data is None else [tuple(validation_data)])

    def fit_chunks(self, train_chunks, val_chunks=None):
        """Fit from chunks: one pass for the statistics, one over the validation rows.

        Parameters
        ----------
        train_chunks : callable or list
            ``train_chunks()`` returns a fresh iterable of ``(X (m, d), y (m,) or (m, n_heads))``.
        val_chunks : callable or list, optional
            Validation chunks; without them ``val_fraction`` of the training
            rows (a seeded hash of the global row index) choose alpha, which
            reads ``train_chunks`` a second time.

        Examples
        --------
        >>> est = RidgeReadout().fit_chunks(lambda: iter_layer(store, "train", 6))  # doctest: +SKIP
        """
        train_chunks = chunk_source(train_chunks)
        if self.alphas is not None and (len(self.alphas) == 0 or min(self.alphas) <= 0):
            raise ValueError(f"alphas must be positive numbers; got {list(self.alphas)}")
        seed = int(np.random.default_rng(self.random_state).integers(2**63))
        carve = val_chunks is None and (self.alphas is None or len(self.alphas) > 1)
        fit_s = held = None
        start, y_shape = 0, ()
        for X, y in checked_chunks(self, train_chunks, first=True, dtype=(np.float64, np.float32)):  # pass 1
            Y = y.reshape(len(y), -1)  # (m, H)
            if fit_s is None:
                shift = X.astype(np.float64).mean(0) if len(X) else np.zeros(X.shape[1])
                fit_s, held = _Stats(shift), _Stats(shift)
            m = holdout_mask(start, len(X), self.val_fraction, seed) if carve else np.zeros(len(X), bool)
            fit_s.update(X[~m], Y[~m])
            held.update(X[m], Y[m])
            start, y_shape = start + len(X), y.shape[1:]
        everything = fit_s + held if fit_s is not None else None
        if everything is None or everything.x.n == 0:
            raise ValueError("train_chunks yielded no rows; expected at least one (X, y) chunk with rows")
        self.classes_ = np.unique(np.array(list(everything.by_class)))
        carve = carve and everything.x.n >= 10 and 0 < held.x.n < everything.x.n
        if not carve:
            fit_s = everything
        H, C, d = int(np.prod(y_shape)), len(self.classes_), self.n_features_in_
        mean_x, S, B, mean_y = fit_s.centred(self.classes_, H)
        lam, V = np.linalg.eigh(S)  # the one eigendecomposition for the whole grid
        lam = np.maximum(lam, 0.0)
        Q = V.T @ B  # (d, H*C)
        scale = np.trace(S) / d if np.trace(S) > 0 else 1.0
        grid = sorted(self.alphas if self.alphas is not None else [r * scale for r in DEFAULT_RATIOS], reverse=True)

        self.val_scores_ = {}
        if carve or val_chunks is not None:
            if carve:
                def val_rows():
                    start = 0
                    for X, y in train_chunks():
                        X, y = validate_data(self, X, reset=False, dtype=(np.float64, np.float32)), np.asarray(y)
                        m = holdout_mask(start, len(X), self.val_fraction, seed)
                        start += len(X)
                        if m.any():
                            yield X[m], y[m]
            else:
                val_rows = chunk_source(val_chunks, "val_chunks")
            correct, total = np.zeros(len(grid)), 0
            for X, y in val_rows():  # pass 2: every alpha's accuracy on the validation rows
                X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
                Yv = encode_labels(self.classes_, y, "validation labels" if not carve else "labels")
                Yv = Yv.reshape(len(X), -1)  # (m, H)
                if Yv.shape[1] != H:
                    raise ValueError(f"validation y must have {H} head(s) like the training y; got shape {np.shape(y)}")
                Z = (X.astype(np.float64) - mean_x) @ V  # (m, d) in the eigenbasis
                for i, a in enumerate(grid):
                    scores = ((Z / (lam + a)) @ Q + mean_y).reshape(len(X), H, C)  # (m, H, C)
                    correct[i] += (scores.argmax(-1) == Yv).sum()
                total += Yv.size
            accs = correct / max(total, 1)
            self.val_scores_ = {float(a): float(acc) for a, acc in zip(grid, accs)}
            self.alpha_ = float(grid[int(np.argmax(accs))])  # first maximum: the strongest of ties
        else:
            self.alpha_ = float(grid[-1])

        if carve:  # refit on all rows with the chosen alpha
            mean_x, S, B, mean_y = everything.centred(self.classes_, H)
            W = linalg.solve(S + self.alpha_ * np.eye(d), B, assume_a="pos")  # (d, H*C)
        else:
            W = V @ (Q / (lam + self.alpha_)[:, None])  # (d, H*C)
        self.coef_ = W.T.reshape(H, C, d)
        self.intercept_ = (mean_y - mean_x @ W).reshape(H, C)
        self.n_heads_ = H if y_shape else 0
        return self

    # -- predicting ----------------------------------------------------------
    def _scores(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        return np.einsum("nd,hcd->nhc", X.astype(np.float64), self.coef_) + self.intercept_  # (n, H, C)

    def decision_function(self, X):
        """Ridge scores, per head in scikit-learn's convention.

        One head: ``(n,)`` for two classes (``score[1] - score[0]``, positive
        means ``classes_[1]``), else ``(n, n_classes)``. Several heads:
        ``(n, n_heads)`` for two classes, else ``(n, n_heads, n_classes)``.
        """
        s = self._scores(X)  # (n, H, C)
        s = s[..., 1] - s[..., 0] if s.shape[-1] == 2 else (s[..., 0] if s.shape[-1] == 1 else s)
        return s[:, 0] if self.n_heads_ == 0 else s

    def predict(self, X):
        """Labels ``(n,)``, or ``(n, n_heads)`` with several heads."""
        idx = self._scores(X).argmax(-1)  # (n, H)
        return self.classes_[idx[:, 0] if self.n_heads_ == 0 else idx]

    def score(self, X, y, sample_weight=None):
        """Mean accuracy over rows and heads (each bit counts once)."""
        y = np.asarray(y)
        correct = (self.predict(X) == y).reshape(len(y), -1).mean(1)
        return float(np.average(correct, weights=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.classifier_tags.multi_label = False
        return tags
