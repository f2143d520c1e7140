"""Multinomial logistic regression with its whole L2 path fitted as one batched problem.

One estimator covers single-label tasks (``y`` of shape ``(n,)``) and several
heads over the same features (``y`` of shape ``(n, n_heads)``: bit XOR's 5
bits, bit memory's 50 bits per output token), each head a softmax over the same
classes.

Features are whitened first (centred and rotated onto the principal axes of
the training covariance, each axis scaled to unit variance; directions with
variance below ``1e-10`` of the largest are dropped). Hidden states of
transformers are badly conditioned (condition numbers of 1e6 and more are
common), and on whitened inputs L-BFGS converges in tens of iterations where
it otherwise needs thousands. The objective is
``mean cross-entropy * n_heads + alpha/2 * ||V||^2`` with ``V`` the weights
on the whitened features; ``coef_`` maps the original features directly. The
whitening is folded into the weights (``logits = Xc @ (P V) + b``), so the
rows are only centred, never rotated: a pass costs ``n*d*n_heads*C`` flops.

How the L2 path is fitted (the levers that make a sweep take seconds):

* **Every strength at once.** The candidate strengths are the rows of one
  parameter matrix and one objective call evaluates them all against a single
  read of the rows (one wide matrix product each way); each strength keeps its
  own L-BFGS state (:func:`~reservoir.readouts.lbfgs.lbfgs`).
* **The strength is chosen on a subsample.** With more than ``path_rows``
  rows to fit, the path runs on a seeded subsample of them, each strength
  scaled to keep its prior precision (``alpha * n``: a strength ``alpha`` of
  the full fit is ``alpha * n / m`` on ``m`` rows). The chosen strength is
  then fitted once on all training rows, warm-started from its subsample
  solution.
* **A tolerance matched to what validation can resolve**: a fit stops when an
  iteration lowers the objective by less than ``tol`` of it, or once its
  predictions on the validation rows have not changed for 15 rounds (weak
  strengths otherwise crawl for hundreds of iterations along directions that
  change no prediction).

``fit`` holds the centred rows in memory (float32; the covariance and its
eigendecomposition in float64); ``fit_chunks`` fits the same model from chunks
read again at every pass (one pass for the statistics, one to draw the path's
subsample, then one per objective call of the final fit), so the data never has
to fit in memory.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from reservoir import options
from reservoir.readouts import base
from reservoir.readouts.lbfgs import lbfgs
from reservoir.readouts.multinomial import Multinomial
from reservoir.readouts.stats import (
    MIN_CARVE_ROWS,
    Moments,
    can_carve,
    carve_fraction,
    carve_rows,
    checked_chunks,
    chunk_source,
    encode_labels,
    held_out,
    holdout_mask,
    per_group,
    split_seed,
)
from reservoir.runtime import resolve_device

DEFAULT_ALPHAS = (10.0, 1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
#: Rows the L2 path is fitted on by default (a seeded subsample when there are more).
PATH_ROWS = 16384


class LogisticReadout(base.LinearReadout):
    """Multinomial L2 logistic readout; the L2 strength is picked on a validation split.

    Parameters
    ----------
    alphas : sequence of float, optional
        Candidate L2 strengths (on the mean loss, each ``>= 0``), all fitted
        together (see the module's notes); the best validation accuracy wins,
        the strongest of ties. One value skips validation.
    val_fraction : float
        Share of the training rows, in ``(0, 1)``, held out to choose
        ``alpha`` when no validation data is given: a seeded random
        permutation in ``fit`` (:func:`~reservoir.readouts.stats.carve_rows`),
        a seeded hash of the row index in ``fit_chunks`` (independent of the
        chunking).
    penalty : {"whitened", "standardized"}
        Where the L2 penalty is measured: on the weights of the whitened
        features (every direction alike), or on the weights of standardized
        features (the usual L2 logistic regression, scikit-learn's model).
        The standardized penalty is fitted in a whitened basis rotated so that
        it weighs each direction separately, with L-BFGS preconditioned per
        strength by ``1 / (1/C + alpha * weight)``; it converges in as few
        iterations as the whitened one. Raw-pixel baselines and ``bench
        readout`` use ``"standardized"``.
    whiten : bool
        Whiten the features (train statistics) before the fit; otherwise
        only centre and scale each feature to unit variance.
    max_iter : int
        L-BFGS iterations per fit (``>= 1``).
    tol : float
        Stop a fit once an iteration lowers its objective by less than
        ``tol * max(1, objective)``, or its largest gradient entry is below
        ``tol`` (``>= 0``).
    path_rows : int or None
        Rows the L2 path is fitted on: with more rows to fit, a seeded
        subsample of them (strengths scaled to keep ``alpha * n``), and the
        chosen strength is then refitted on all rows; ``None`` fits the path
        on every row.
    group_rows : int
        Consecutive rows that make one example (``>= 1``): a bit-memory
        store's output tokens. The validation split holds out whole examples,
        and ``val_correct_`` counts per example.
    random_state : int or None
        Seed of the validation split and of the path's subsample.
    device : str
        Torch device for the fit: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``
        (checked by :func:`reservoir.runtime.resolve_device`).

    ``fit`` checks every parameter first (see :class:`~reservoir.readouts.base.LinearReadout`).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_heads, n_classes, n_features)
    intercept_ : ndarray of shape (n_heads, n_classes)
        On centred features: logits are ``(X - mean_) @ coef_[h].T + intercept_[h]``.
    mean_ : ndarray of shape (n_features,)
    alpha_ : float
        The chosen L2 strength.
    val_scores_ : dict of float to float
        Validation accuracy of each candidate.
    val_correct_ : ndarray of shape (n_val,) or None
        Correct heads of each validation row (each example of
        ``group_rows`` rows) at the chosen strength (what an interval of the
        validation accuracy resamples); None without validation.
    n_features_in_ : int
    n_iter_ : int
        L-BFGS iterations of the final fit.
    path_rows_ : int
        Rows the path was fitted on (0 without a path).
    rank_ : int
        Whitened directions kept.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X, y = load_iris(return_X_y=True)
    >>> LogisticReadout(random_state=0).fit(X, y).score(X, y) > 0.9
    True
    """

    _parameter_checks: ClassVar[dict[str, options.Constraint]] = {
        "alphas": options.grid(options.number(0)), "val_fraction": base.VAL_FRACTION, "whiten": options.FLAG,
        "penalty": options.one_of("whitened", "standardized"), "max_iter": options.integer(1),
        "tol": options.number(0), "path_rows": options.optional(options.integer(2)),
        "group_rows": options.integer(1), "random_state": options.RANDOM_STATE,
    }

    def __init__(self, alphas=None, val_fraction=0.1, whiten=True, penalty="whitened", max_iter=500, tol=1e-7,
                 path_rows=PATH_ROWS, group_rows=1, random_state=0, device="cpu"):
        self.alphas = alphas
        self.penalty = penalty
        self.val_fraction = val_fraction
        self.whiten = whiten
        self.max_iter = max_iter
        self.tol = tol
        self.path_rows = path_rows
        self.group_rows = group_rows
        self.random_state = random_state
        self.device = device

    # -- fitting -------------------------------------------------------------
    def _start_fit(self) -> list[float]:
        """Check the parameters and the device; the candidate alphas, strongest first."""
        self._check_params()
        self._device = resolve_device(self.device)
        return sorted(DEFAULT_ALPHAS if self.alphas is None else self.alphas, reverse=True)

    def fit(self, X, y, validation_data=None):
        """Fit; ``validation_data=(X_val, y_val)`` replaces the carved validation split."""
        alphas = self._start_fit()
        X, y = validate_data(self, X, y, multi_output=True, dtype=np.float32, y_numeric=False)
        check_classification_targets(y)
        if len(X) % self.group_rows:
            raise ValueError(f"expected rows in whole groups of group_rows={self.group_rows}; found {len(X)} rows")
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:  # nothing to learn; every row would be predicted right (scikit-learn refuses too)
            raise ValueError(f"expected training labels of at least 2 classes; found one class, "
                             f"{self.classes_.tolist()}")
        Y = np.searchsorted(self.classes_, y).reshape(len(y), -1)  # (n, n_heads)
        moments = Moments(full=self.whiten)
        moments.update(X)
        self._set_whitening(moments)
        dev = self._device
        Xc = torch.as_tensor(X, device=dev) - torch.as_tensor(self.mean_, device=dev)  # (n, d) centred
        Yt = torch.as_tensor(Y, device=dev)
        val = fit_rows = None
        if validation_data is not None:
            Xv = validate_data(self, validation_data[0], reset=False, dtype=np.float32)
            Yv = encode_labels(self.classes_, validation_data[1], unseen=True).reshape(len(Xv), -1)
            if Yv.shape[1] != Y.shape[1]:
                raise ValueError(f"validation y must have {Y.shape[1]} head(s) like the training y; got shape "
                                 f"{np.shape(validation_data[1])}")
            Xvc = torch.as_tensor(Xv, device=dev) - torch.as_tensor(self.mean_, device=dev)
            val, fit_rows = (Xvc, torch.as_tensor(Yv, device=dev)), np.arange(len(X))
        elif len(alphas) > 1 and len(X) >= MIN_CARVE_ROWS:
            fit_rows, val_rows = carve_rows(len(X), self.val_fraction, self.random_state, self.group_rows)
            v = torch.as_tensor(val_rows, device=dev)
            val = (Xc[v], Yt[v])
        path = None
        if val is not None:
            rows = self._path_rows(fit_rows)
            r = torch.as_tensor(rows, device=dev)
            path = ((Xc[r], Yt[r]), len(rows), len(fit_rows))
        return self._fit(alphas, lambda: ((Xc, Yt),), len(X), Y.shape[1], y.ndim > 1, path,
                         None if val is None else (lambda: (val,)))

    def fit_chunks(self, train_chunks, val_chunks=None):
        """Fit from chunks read again at every pass, never holding all rows (see :class:`base.LinearReadout`).

        Examples
        --------
        >>> est = LogisticReadout().fit_chunks(lambda: iter_layer(store, "train", 6))  # doctest: +SKIP
        """
        alphas = self._start_fit()
        train_chunks = chunk_source(train_chunks)
        seed = split_seed(self.random_state)
        carve = val_chunks is None and len(alphas) > 1
        moments, classes, y_shape, n_val = Moments(full=self.whiten), [], (), 0
        for X, y in checked_chunks(self, train_chunks, first=True):  # pass 1: statistics, classes
            if carve:
                n_val += int(holdout_mask(moments.n, len(X), self.val_fraction, seed, self.group_rows).sum())
            moments.update(X)
            classes.append(np.unique(y))
            y_shape = y.shape[1:]
        if moments.n == 0:
            raise ValueError("train_chunks yielded no rows; expected at least one (X, y) chunk with rows")
        self.classes_ = np.unique(np.concatenate(classes))
        self._set_whitening(moments)
        dev = self._device
        mean = torch.as_tensor(self.mean_, device=dev)
        n_heads = int(np.prod(y_shape))

        def stream(source, val=False):  # centred float32 tensors; train chunks were validated in pass 1
            def blocks():
                for X, y in source():
                    X = validate_data(self, X, reset=False, dtype=np.float32) if val else np.asarray(X, np.float32)
                    Y = encode_labels(self.classes_, y, unseen=val)
                    Y = Y.reshape(len(X), -1)
                    if Y.shape[1] != n_heads:
                        raise ValueError(f"validation y must have {n_heads} head(s) like the training y; got shape "
                                         f"{np.shape(y)}")
                    if len(X):
                        yield torch.as_tensor(X, device=dev) - mean, torch.as_tensor(Y, device=dev)
            return blocks

        full = stream(train_chunks)
        fit_source, n_fit, val = train_chunks, moments.n, None
        g, fraction = self.group_rows, self.val_fraction
        if carve and not 0 < n_val < moments.n:  # a few rows: the hash held none, or all, out
            fraction = carve_fraction(moments.n, self.val_fraction, seed, g)
            if fraction != self.val_fraction:
                n_val = int(holdout_mask(0, moments.n, fraction, seed, g).sum())
        if val_chunks is not None:
            val = stream(chunk_source(val_chunks, "val_chunks"), val=True)
        elif carve and can_carve(moments.n, n_val):
            val = stream(held_out(train_chunks, fraction, seed, group=g))
            fit_source = held_out(train_chunks, fraction, seed, keep=False, group=g)
            n_fit = moments.n - n_val
        path = None
        if val is not None:  # pass 2: the path's rows, a seeded share of the rows to fit, held in memory
            share = 1.0 if self.path_rows is None else min(1.0, self.path_rows / n_fit)
            sub = stream(held_out(fit_source, share, split_seed([self.random_state or 0, 1])) if share < 1
                         else fit_source)
            parts = list(sub())
            if parts:
                path = ((torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])),
                        sum(len(p[0]) for p in parts), n_fit)
        return self._fit(alphas, full, moments.n, n_heads, len(y_shape) > 0, path, val)

    def _path_rows(self, fit_rows: np.ndarray) -> np.ndarray:
        """The rows of ``fit_rows`` the path is fitted on: all, or a seeded subsample of ``path_rows``."""
        if self.path_rows is None or len(fit_rows) <= self.path_rows:
            return fit_rows
        rng = np.random.default_rng([self.random_state or 0, 1])
        return np.sort(rng.choice(fit_rows, self.path_rows, replace=False))

    def _fit(self, alphas, full, n, n_heads, multi, path, val):
        """The path (when there is validation) on ``path = ((Xc, Y), m, n_fit)``, scored on ``val``; then the
        chosen strength on every row of ``full`` (``n`` rows), warm-started from its path solution."""
        dev, C = self._device, len(self.classes_)
        P = torch.as_tensor(self._P, device=dev)
        w = None if self._w is None else torch.as_tensor(self._w, device=dev)

        def problem(blocks, rows, strengths):
            return Multinomial(blocks, rows, P, n_heads, C, torch.tensor(strengths, device=dev), w)

        self.val_scores_, self.path_rows_, self.n_iter_, self.val_correct_ = {}, 0, 0, None
        start = None
        if val is not None and path is not None:
            (Xp, Yp), m, n_fit = path
            on_path = problem(lambda: ((Xp, Yp),), m, [a * n_fit / m for a in alphas])
            solved, _ = self._solve(on_path, torch.zeros(len(alphas), on_path.size, device=dev), val)
            per_row = on_path.correct(val, solved)  # (alphas, val rows)
            accs = (per_row.sum(1) / max(per_row.shape[1] * n_heads, 1)).tolist()
            self.val_scores_ = {float(a): acc for a, acc in zip(alphas, accs)}
            best = int(np.argmax(accs))  # the first maximum: the strongest of ties
            self.alpha_, self.path_rows_ = float(alphas[best]), m
            self.val_correct_ = per_group(per_row[best], self.group_rows)
            start = solved[best: best + 1]
        else:
            self.alpha_ = float(alphas[-1])
        final = problem(full, n, [self.alpha_])
        theta, self.n_iter_ = self._solve(final, torch.zeros(1, final.size, device=dev) if start is None else start,
                                          val)
        V, b = final.unpack(theta)
        coef = (P @ V[0]).double()  # (d, n_heads * C) on centred features
        self.coef_ = coef.t().reshape(n_heads, C, -1).cpu().numpy().astype(np.float32)
        self.intercept_ = b[0].reshape(n_heads, C).cpu().numpy()
        del self._P, self._w
        self.n_heads_ = n_heads if multi else 0
        return self

    def _solve(self, problem: Multinomial, theta: torch.Tensor, watched=None) -> tuple[torch.Tensor, int]:
        """Every problem's minimum from ``theta`` and the most iterations one took; with one class there is
        nothing to fit (the weights stay). With ``watched`` blocks (the validation rows), a problem also stops
        once its predictions on them have not changed for 15 rounds."""
        if problem.C < 2:
            return theta, 0
        watch = None
        if watched is not None:
            rows = [Xc for Xc, _ in watched()]

            def watch(th):  # (b, H, rows): every prediction on the watched rows
                return torch.cat([problem.logits_t(Xc, th).argmax(2) for Xc in rows], 2)
        # The whitened penalty weighs every direction alike: the identity is the right initial inverse Hessian.
        precond = None if problem.w is None else problem.curvature()
        out = lbfgs(problem, theta, max_iter=self.max_iter, ftol=self.tol, gtol=self.tol, watch=watch, precond=precond)
        return out.theta, int(out.n_iter.max())

    def _set_whitening(self, moments: Moments):
        """``mean_``, and ``_P`` with ``(X - mean_) @ _P`` white (or standardized when ``whiten=False``)."""
        self.mean_ = moments.mean.astype(np.float32)
        var = moments.scatter() / max(moments.n, 1)  # (d, d), or (d,) when not whitening
        sd = np.sqrt(np.maximum(np.diag(var) if var.ndim == 2 else var, 0.0))  # (d,)
        sd = np.where(sd > 1e-12, sd, 1.0)
        self._w = None  # penalty sum_j w_j ||V_j||^2 on the rows of the whitened weights V; None: ||V||^2
        if not self.whiten:
            self._P = np.diag(1.0 / sd).astype(np.float32)
            self.rank_ = len(sd)
            return
        lam, V = np.linalg.eigh(var)
        keep = lam > max(lam.max(), 1e-30) * 1e-10
        if not keep.any():  # constant features: nothing to learn from them
            keep = lam >= lam.max()
            lam = np.where(keep, 1.0, lam)
        P = V[:, keep] / np.sqrt(lam[keep])  # (d, r), float64
        self.rank_ = int(keep.sum())
        if self.penalty == "standardized":
            # The weights on standardized features are diag(sd) P V, so the penalty is Vᵀ K V with K = Pᵀ diag(sd²) P.
            # Rotating the whitened basis onto K's eigenvectors (still a whitening) makes it diagonal: sum_j w_j
            # ||V_j||^2 with w K's eigenvalues, and 1 / (c + alpha w_j) a per-coordinate preconditioner for L-BFGS.
            M = sd[:, None] * P  # (d, r)
            w, Q = np.linalg.eigh(M.T @ M)
            P = P @ Q
            self._w = np.maximum(w, 0.0).astype(np.float32)
        self._P = P.astype(np.float32)

    # -- predicting ----------------------------------------------------------
    def predict_proba(self, X):
        """Class probabilities ``(n, n_classes)``; with several heads a list of those, one per head."""
        p = self._class_scores(X)  # (n, n_heads, C)
        return p[:, 0] if self.n_heads_ == 0 else [p[:, h] for h in range(p.shape[1])]

    def _class_scores(self, X):
        """Class probabilities per head ``(n, n_heads, C)`` (what ``predict`` takes the argmax of)."""
        X = self._validated(X)
        H, C, d = self.coef_.shape
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused whole below, not warned of
            logits = ((X - self.mean_) @ self.coef_.reshape(H * C, d).T).reshape(len(X), H, C) + self.intercept_
        logits = self._finite(logits)
        logits -= logits.max(-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(-1, keepdims=True)
        return p  # (n, n_heads, C)
