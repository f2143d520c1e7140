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
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data
from torch.nn import functional as F

DEFAULT_ALPHAS = (10.0, 1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


class LogisticReadout(ClassifierMixin, BaseEstimator):
    """Multinomial L2 logistic readout; the L2 strength is picked on a validation split.

    Parameters
    ----------
    alphas : sequence of float, optional
        Candidate L2 strengths (on the mean loss), tried from strongest to
        weakest with warm starts; the path stops once validation accuracy
        has been below its best for ``patience`` candidates in a row (weak
        penalties cost the most iterations). One value skips validation.
    patience : int
        See ``alphas``.
    val_fraction : float
        Share of the training rows held out to choose ``alpha`` when
        ``fit`` gets no ``validation_data``.
    whiten : bool
        Whiten the features (train statistics) before the fit; otherwise
        only centre and scale each feature to unit variance.
    max_iter : int
        L-BFGS iterations per candidate.
    tol : float
        L-BFGS gradient tolerance.
    random_state : int
        Seed of the validation split.
    device : str
        Torch device for the fit.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (n_heads, n_classes, n_features)
    intercept_ : ndarray of shape (n_heads, n_classes)
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

    def __init__(self, alphas=None, val_fraction=0.1, whiten=True, max_iter=500, tol=1e-7, patience=2,
                 random_state=0, device="cpu"):
        self.alphas = alphas
        self.patience = patience
        self.val_fraction = val_fraction
        self.whiten = whiten
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.device = device

    # -- fitting -------------------------------------------------------------
    def fit(self, X, y, validation_data=None):
        """Fit; ``validation_data=(X_val, y_val)`` replaces the carved validation split."""
        X, y = validate_data(self, X, y, multi_output=True, dtype=np.float32, y_numeric=False)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        Y = np.searchsorted(self.classes_, y)
        alphas = sorted(self.alphas or DEFAULT_ALPHAS, reverse=True)
        if validation_data is not None:
            Xv = validate_data(self, validation_data[0], reset=False, dtype=np.float32)
            Yv = self._encode(np.asarray(validation_data[1]))
            Xt, Yt = X, Y
        elif len(alphas) > 1 and len(X) >= 10:
            rng = np.random.default_rng(self.random_state)
            perm = rng.permutation(len(X))
            n_val = max(1, int(round(self.val_fraction * len(X))))
            Xv, Yv, Xt, Yt = X[perm[:n_val]], Y[perm[:n_val]], X[perm[n_val:]], Y[perm[n_val:]]
        else:
            Xv = Yv = None
            Xt, Yt = X, Y
            alphas = alphas[-1:] if len(alphas) > 1 else alphas
        self.mean_, self._P = self._whitening(X)
        n_heads = 1 if Y.ndim == 1 else Y.shape[1]
        W = torch.zeros(self._P.shape[1], n_heads * len(self.classes_), device=self.device)
        b = torch.zeros(n_heads * len(self.classes_), device=self.device)
        self.val_scores_ = {}
        best = (-1.0, alphas[0])
        worse = 0
        if Xv is not None:
            Xt_t, Yt_t = self._tensor(Xt), torch.as_tensor(Yt, device=self.device)
            Xv_t = self._tensor(Xv)
            for alpha in alphas:
                W, b = self._lbfgs(Xt_t, Yt_t, alpha, W, b, n_heads)
                acc = float((self._logits(Xv_t, W, b, n_heads).argmax(-1).cpu().numpy() == Yv.reshape(len(Yv), -1)).mean())
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
        if Xv is not None:  # refit on all rows, warm-started from the chosen solution
            W, b = best_W, best_b
        W, b = self._lbfgs(self._tensor(X), torch.as_tensor(Y, device=self.device), self.alpha_, W, b, n_heads)
        C = len(self.classes_)
        coef = torch.as_tensor(self._P, device=W.device) @ W  # (d, n_heads * C) on centred features
        self.coef_ = coef.t().reshape(n_heads, C, -1).cpu().numpy()  # (n_heads, C, d)
        self.intercept_ = b.reshape(n_heads, C).cpu().numpy()
        del self._P
        self.n_heads_ = n_heads if Y.ndim > 1 else 0
        return self

    def _encode(self, y):
        idx = np.searchsorted(self.classes_, y)
        idx = np.clip(idx, 0, len(self.classes_) - 1)
        if not np.all(self.classes_[idx] == y):
            raise ValueError(f"validation labels must be among the training classes {self.classes_.tolist()}")
        return idx

    def _whitening(self, X):
        """``(mean, P)`` with ``(X - mean) @ P`` white (or standardized when ``whiten=False``)."""
        X64 = X.astype(np.float64)
        mean = X64.mean(0)
        Xc = X64 - mean
        if not self.whiten:
            sd = Xc.std(0)
            return mean.astype(np.float32), np.diag(1.0 / np.where(sd > 1e-12, sd, 1.0)).astype(np.float32)
        cov = Xc.T @ Xc / max(len(X), 1)  # (d, d)
        lam, V = np.linalg.eigh(cov)
        keep = lam > max(lam.max(), 1e-30) * 1e-10
        if not keep.any():  # constant features: nothing to learn from them
            keep = lam >= lam.max()
            lam = np.where(keep, 1.0, lam)
        return mean.astype(np.float32), (V[:, keep] / np.sqrt(lam[keep])).astype(np.float32)  # (d, r)

    def _tensor(self, X):
        return torch.as_tensor((X - self.mean_) @ self._P, dtype=torch.float32, device=self.device)

    @staticmethod
    def _logits(X, W, b, n_heads):
        return (X @ W + b).view(len(X), n_heads, -1)  # (n, n_heads, C)

    def _lbfgs(self, X, Y, alpha, W0, b0, n_heads):
        W = W0.detach().clone().requires_grad_(True)
        b = b0.detach().clone().requires_grad_(True)
        C = len(self.classes_)
        target = Y.reshape(len(Y), -1).long()  # (n, n_heads)
        opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=self.max_iter, tolerance_grad=self.tol,
                                tolerance_change=1e-10, history_size=20, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            logits = self._logits(X, W, b, n_heads)  # (n, n_heads, C)
            loss = F.cross_entropy(logits.reshape(-1, C), target.reshape(-1)) * n_heads
            loss = loss + 0.5 * alpha * (W * W).sum()
            loss.backward()
            return loss

        if C > 1:
            opt.step(closure)
        self.n_iter_ = int(opt.state[opt._params[0]].get("n_iter", 0))
        return W.detach(), b.detach()

    # -- predicting ----------------------------------------------------------
    def predict_proba(self, X):
        """Class probabilities ``(n, n_classes)``; with several heads a list of those, one per head."""
        p = self._proba(X)  # (n, n_heads, C)
        return p[:, 0] if self.n_heads_ == 0 else [p[:, h] for h in range(p.shape[1])]

    def _proba(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float32)
        logits = np.einsum("nd,hcd->nhc", X - self.mean_, self.coef_) + self.intercept_  # (n, n_heads, C)
        logits -= logits.max(-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(-1, keepdims=True)
        return p  # (n, n_heads, C)

    def predict(self, X):
        """Labels ``(n,)``, or ``(n, n_heads)`` with several heads."""
        idx = self._proba(X).argmax(-1)  # (n, n_heads)
        return self.classes_[idx[:, 0] if self.n_heads_ == 0 else idx]

    def score(self, X, y, sample_weight=None):
        """Mean accuracy over rows and heads (each bit counts once)."""
        y = np.asarray(y)
        pred = self.predict(X)
        correct = (pred == y).reshape(len(y), -1).mean(1)
        return float(np.average(correct, weights=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.classifier_tags.multi_label = False
        return tags
