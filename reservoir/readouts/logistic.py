"""Multinomial logistic regression fitted with torch L-BFGS, L2 strength chosen on validation.

One estimator covers single-label tasks (``y`` of shape ``(n,)``) and several
heads over the same features (``y`` of shape ``(n, n_heads)``: bit XOR's 5
bits, bit memory's 50 bits per output token), each head a softmax over the same
classes.

Features are whitened first (centred and rotated onto the principal axes of
the training covariance, each axis scaled to unit variance; directions with
variance below ``1e-10`` of the largest are dropped). Hidden states of
transformers are badly conditioned (condition numbers of 1e6 and more are
common), and L-BFGS on whitened inputs converges in tens of iterations where
it otherwise needs thousands. The objective is
``mean cross-entropy + alpha/2 * ||V||^2`` with ``V`` the weights on the
whitened features; ``coef_`` maps the original features directly.

``fit`` holds the whitened rows in memory; ``fit_chunks`` fits the same model
from chunks that are read again at every pass (one pass for the whitening
statistics, then one per L-BFGS function evaluation, summing each chunk's loss
and gradient), so the data never has to fit in memory. Both run one alpha path
and L-BFGS loop over "sources" of chunks: ``fit``'s is a single cached chunk of
whitened float32 rows (results identical to fitting without chunks);
``fit_chunks`` folds the whitening into the weights and computes the logits in
float64 on centred rows, so a pass costs ``n*d*n_heads*C`` flops, not ``n*d*d``.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
import torch
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data
from torch.nn import functional as F

from reservoir.readouts import base
from reservoir.readouts.stats import (
    MIN_CARVE_ROWS,
    Moments,
    can_carve,
    carve_rows,
    checked_chunks,
    chunk_source,
    encode_labels,
    held_out,
    holdout_mask,
    split_seed,
)
from reservoir.runtime import resolve_device

DEFAULT_ALPHAS = (10.0, 1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


class LogisticReadout(base.LinearReadout):
    """Multinomial L2 logistic readout; the L2 strength is picked on a validation split.

    Parameters
    ----------
    alphas : sequence of float, optional
        Candidate L2 strengths (on the mean loss, each ``>= 0``), tried
        from strongest to weakest with warm starts; the path stops once
        validation accuracy has been below its best for ``patience``
        candidates in a row (weak penalties cost the most iterations). One
        value skips validation.
    patience : int
        See ``alphas`` (``>= 1``).
    val_fraction : float
        Share of the training rows, in ``(0, 1)``, held out to choose
        ``alpha`` when no validation data is given: a seeded random
        permutation in ``fit`` (:func:`~reservoir.readouts.stats.carve_rows`),
        a seeded hash of the row index in ``fit_chunks`` (independent of the
        chunking).
    penalty : {"whitened", "standardized"}
        Where the L2 penalty is measured: on the weights of the whitened
        features (well conditioned, fast; suits hidden states), or on the
        weights of standardized features (the usual L2 logistic regression;
        the whitening then only preconditions L-BFGS, which converges more
        slowly). Raw-pixel baselines use ``"standardized"``.
    whiten : bool
        Whiten the features (train statistics) before the fit; otherwise
        only centre and scale each feature to unit variance.
    max_iter : int
        L-BFGS iterations per candidate (``>= 1``).
    tol : float
        L-BFGS gradient tolerance (``>= 0``).
    random_state : int or None
        Seed of the validation split.
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
    n_features_in_ : int
    n_iter_ : int
        L-BFGS iterations of the final fit.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X, y = load_iris(return_X_y=True)
    >>> LogisticReadout(random_state=0).fit(X, y).score(X, y) > 0.9
    True
    """

    _parameter_checks: ClassVar[dict[str, base.Check]] = {
        "alphas": base.grid(0, open_low=False), "val_fraction": base.VAL_FRACTION, "whiten": base.FLAG,
        "penalty": base.one_of("whitened", "standardized"), "max_iter": base.integer(1), "tol": base.number(0),
        "patience": base.integer(1), "random_state": base.RANDOM_STATE,
    }

    def __init__(self, alphas=None, val_fraction=0.1, whiten=True, penalty="whitened", max_iter=500, tol=1e-7,
                 patience=2, random_state=0, device="cpu"):
        self.alphas = alphas
        self.penalty = penalty
        self.patience = patience
        self.val_fraction = val_fraction
        self.whiten = whiten
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.device = device

    # -- fitting -------------------------------------------------------------
    # A source is ``(chunks, n, P)``: ``chunks()`` yields ``(X, Y (m, *heads))`` tensors, X either whitened
    # float32 ``(m, r)`` (P None: ``fit``) or centred float64 ``(m, d)`` with the whitening ``P (d, r)`` folded
    # into the weights (``fit_chunks``: ``m*d*n_heads*C`` flops per chunk and pass instead of ``m*d*r``; float64
    # keeps the gradient on low-variance directions exact, where ``P`` is large).
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
        self.classes_ = np.unique(y)
        Y = np.searchsorted(self.classes_, y)
        if validation_data is not None:
            Xv = validate_data(self, validation_data[0], reset=False, dtype=np.float32)
            Yv = encode_labels(self.classes_, validation_data[1])
            Xt, Yt = X, Y
        elif len(alphas) > 1 and len(X) >= MIN_CARVE_ROWS:
            fit_rows, val_rows = carve_rows(len(X), self.val_fraction, self.random_state)
            Xv, Yv, Xt, Yt = X[val_rows], Y[val_rows], X[fit_rows], Y[fit_rows]
        else:
            Xv = Yv = None
            Xt, Yt = X, Y
        moments = Moments(full=self.whiten)
        moments.update(X)
        self._set_whitening(moments)

        def cached(A, B):  # one whitened chunk, computed on first use
            return functools.cache(lambda: [(self._tensor(A), torch.as_tensor(B, device=self._device))]), len(A), None

        train = cached(Xt, Yt)
        val = cached(Xv, Yv) if Xv is not None else None
        n_heads = 1 if Y.ndim == 1 else Y.shape[1]
        return self._fit_path(alphas, train, val, train if Xt is X else cached(X, Y), n_heads, Y.ndim > 1)

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
                n_val += int(holdout_mask(moments.n, len(X), self.val_fraction, seed).sum())
            moments.update(X)
            classes.append(np.unique(y))
            y_shape = y.shape[1:]
        if moments.n == 0:
            raise ValueError("train_chunks yielded no rows; expected at least one (X, y) chunk with rows")
        self.classes_ = np.unique(np.concatenate(classes))
        self._set_whitening(moments)
        mean = torch.as_tensor(self.mean_, dtype=torch.float64, device=self._device)  # (d,)
        P = torch.as_tensor(self._P, dtype=torch.float64, device=self._device)  # (d, r)

        def stream(source, n, val=False):  # centred float64 tensors; train chunks were validated in pass 1
            def chunks():
                for X, y in source():
                    X = validate_data(self, X, reset=False, dtype=np.float32) if val else np.asarray(X, np.float32)
                    Y = encode_labels(self.classes_, y, "validation labels" if val else "labels")
                    if len(X):
                        Xc = torch.as_tensor(X, dtype=torch.float64, device=self._device) - mean  # (m, d)
                        yield Xc, torch.as_tensor(Y, device=self._device)
            return chunks, n, P

        full = stream(train_chunks, moments.n)
        if val_chunks is not None:
            val, train = stream(chunk_source(val_chunks, "val_chunks"), None, val=True), full
        elif carve and can_carve(moments.n, n_val):
            val = stream(held_out(train_chunks, self.val_fraction, seed), n_val)
            train = stream(held_out(train_chunks, self.val_fraction, seed, keep=False), moments.n - n_val)
        else:
            val, train = None, full
        return self._fit_path(alphas, train, val, full, int(np.prod(y_shape)), len(y_shape) > 0)

    def _fit_path(self, alphas, train, val, full, n_heads, multi):
        """The alpha path on ``train`` scored on ``val``, then the refit on ``full`` from the best solution."""
        C = len(self.classes_)
        if val is None:
            alphas = alphas[-1:]
        W = torch.zeros(self._P.shape[1], n_heads * C, device=self._device)  # (r, n_heads * C)
        b = torch.zeros(n_heads * C, device=self._device)
        self.val_scores_ = {}
        best = (-1.0, alphas[0])
        worse = 0
        if val is not None:
            for alpha in alphas:
                W, b = self._lbfgs(train, alpha, W, b, n_heads)
                acc = self._accuracy(val, W, b, n_heads)
                self.val_scores_[float(alpha)] = acc
                if acc > best[0]:
                    best = (acc, alpha)
                    best_W, best_b = W, b
                    worse = 0
                else:
                    worse += 1
                    if worse >= self.patience:
                        break
        self.alpha_ = float(best[1])
        if val is not None:  # refit on all rows, warm-started from the chosen solution
            W, b = best_W, best_b
        W, b = self._lbfgs(full, self.alpha_, W, b, n_heads)
        coef = torch.as_tensor(self._P, device=W.device) @ W  # (d, n_heads * C) on centred features
        self.coef_ = coef.t().reshape(n_heads, C, -1).cpu().numpy()  # (n_heads, C, d)
        self.intercept_ = b.reshape(n_heads, C).cpu().numpy()
        del self._P
        self.n_heads_ = n_heads if multi else 0
        return self

    def _set_whitening(self, moments: Moments):
        """``mean_`` and ``_P`` with ``(X - mean_) @ _P`` white (or standardized when ``whiten=False``)."""
        self.mean_ = moments.mean.astype(np.float32)
        var = moments.scatter() / max(moments.n, 1)  # (d, d), or (d,) when not whitening
        sd = np.sqrt(np.maximum(np.diag(var) if var.ndim == 2 else var, 0.0))  # (d,)
        sd = np.where(sd > 1e-12, sd, 1.0)
        self._M = None  # penalty ||M V||^2 on the whitened weights V; None: ||V||^2
        if not self.whiten:
            self._P = np.diag(1.0 / sd).astype(np.float32)
            return
        lam, V = np.linalg.eigh(var)
        keep = lam > max(lam.max(), 1e-30) * 1e-10
        if not keep.any():  # constant features: nothing to learn from them
            keep = lam >= lam.max()
            lam = np.where(keep, 1.0, lam)
        self._P = (V[:, keep] / np.sqrt(lam[keep])).astype(np.float32)  # (d, r)
        if self.penalty == "standardized":  # the weights on standardized features are diag(sd) @ P @ V
            self._M = torch.as_tensor(sd[:, None] * self._P, dtype=torch.float32, device=self._device)  # (d, r)

    def _tensor(self, X):
        return torch.as_tensor((X - self.mean_) @ self._P, dtype=torch.float32, device=self._device)  # (m, r)

    @staticmethod
    def _logits(X, W, b, n_heads, P=None):
        if P is not None:  # centred float64 rows: fold the whitening into the weights
            W, b = P @ W.double(), b.double()  # (d, n_heads * C), (n_heads * C,)
        return (X @ W + b).view(len(X), n_heads, -1)  # (m, n_heads, C)

    def _accuracy(self, source, W, b, n_heads):
        """Share of correct (row, head) predictions over the chunks of a source."""
        chunks, _, P = source
        correct = total = 0
        with torch.no_grad():
            for X, Y in chunks():
                pred = self._logits(X, W, b, n_heads, P).argmax(-1).cpu().numpy()  # (m, n_heads)
                hit = pred == Y.cpu().numpy().reshape(len(X), -1)
                correct, total = correct + int(hit.sum()), total + hit.size
        return correct / max(total, 1)

    def _lbfgs(self, source, alpha, W0, b0, n_heads):
        """Minimize ``mean CE * n_heads + alpha/2 ||W||^2`` over the source's chunks (gradients summed)."""
        chunks, n, P = source
        W = W0.detach().clone().requires_grad_(True)
        b = b0.detach().clone().requires_grad_(True)
        C = len(self.classes_)
        opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=self.max_iter, tolerance_grad=self.tol,
                                tolerance_change=1e-10, history_size=20, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            total = 0.0
            for X, Y in chunks():
                logits = self._logits(X, W, b, n_heads, P)  # (m, n_heads, C)
                target = Y.reshape(-1).long()  # (m * n_heads,)
                loss = F.cross_entropy(logits.reshape(-1, C), target) * (n_heads * len(X) / n)
                loss.backward()
                total = total + loss.detach()
            MW = W if self._M is None else self._M.to(W.dtype) @ W  # (d, n_heads * C)
            reg = 0.5 * alpha * (MW * MW).sum()
            reg.backward()
            return total + reg.detach()

        if C > 1:
            opt.step(closure)
        self.n_iter_ = int(opt.state[opt._params[0]].get("n_iter", 0))
        return W.detach(), b.detach()

    # -- predicting ----------------------------------------------------------
    def predict_proba(self, X):
        """Class probabilities ``(n, n_classes)``; with several heads a list of those, one per head."""
        p = self._class_scores(X)  # (n, n_heads, C)
        return p[:, 0] if self.n_heads_ == 0 else [p[:, h] for h in range(p.shape[1])]

    def _class_scores(self, X):
        """Class probabilities per head ``(n, n_heads, C)`` (what ``predict`` takes the argmax of)."""
        X = self._validated(X)
        logits = np.einsum("nd,hcd->nhc", X - self.mean_, self.coef_) + self.intercept_  # (n, n_heads, C)
        logits -= logits.max(-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(-1, keepdims=True)
        return p  # (n, n_heads, C)
