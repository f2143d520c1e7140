"""The multinomial logistic objective of several readouts over the same rows, evaluated in one pass.

:class:`Multinomial` is what :class:`~reservoir.readouts.LogisticReadout`
hands to :func:`~reservoir.readouts.lbfgs.lbfgs`: ``k`` problems (one per L2
strength) sharing the rows, the whitening ``P`` and the classes, each a row of
``theta``. A call reads the rows once for all of them: one wide product into
the logits, one back into the gradient.
"""

from __future__ import annotations

import numpy as np
import torch


class Multinomial:
    """The objective of ``k`` logistic readouts over the same rows: one per L2 strength, evaluated together.

    ``f_i(V, b) = sum_h mean_rows CE(softmax(Xc P V_h + b_h), y_h) + alpha_i/2 * sum_j w_j ||V_j||^2`` for
    ``theta_i = [vec V (r, n_heads*C), b (n_heads*C)]``; the penalty weights ``w`` ``(r,)`` of the rows of ``V``
    are ones (the penalty on the whitened weights) unless ``weights`` is given. ``blocks()`` yields centred
    float32 rows ``(m, d)`` and their class indices ``(m, n_heads)`` on the device; the rows may come in any number of blocks (one in memory, store
    chunks when streaming), and every call reads them once for all ``k`` problems.
    """

    def __init__(self, blocks, n: int, P: torch.Tensor, n_heads: int, n_classes: int, alphas: torch.Tensor,
                 weights: torch.Tensor | None = None):
        self.blocks, self.n, self.P, self.w = blocks, n, P, weights  # P (d, r), weights (r,)
        self.H, self.C = n_heads, n_classes
        self.alphas = alphas  # (problems,)
        self.r = P.shape[1]
        self.size = self.r * n_heads * n_classes + n_heads * n_classes  # D

    def unpack(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``V (k, r, HC)`` and ``b (k, HC)`` of ``theta (k, D)`` (views)."""
        HC = self.H * self.C
        return theta[:, : self.r * HC].view(len(theta), self.r, HC), theta[:, self.r * HC:]

    def weights(self, theta: torch.Tensor) -> torch.Tensor:
        """``U = P V`` as one matrix ``(d, k * HC)``: the weights on centred features of every problem."""
        V, _ = self.unpack(theta)
        U = torch.matmul(self.P, V)  # (k, d, HC)
        return U.permute(1, 0, 2).reshape(self.P.shape[0], -1)

    def logits_t(self, Xc: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Logits ``(k, n_heads, C, m)``: rows last, so the softmax runs along contiguous memory."""
        k, m = len(theta), len(Xc)
        U = self.weights(theta)  # (d, k*HC)
        if U.shape[1] >= 32:  # a wide product straight into the transposed layout
            Lt = U.t() @ Xc.t()  # (k*HC, m)
        else:  # a narrow one is faster row-major, then transposed
            Lt = (Xc @ U).t().contiguous()
        _, b = self.unpack(theta)
        return Lt.view(k, self.H, self.C, m).add_(b.reshape(k, self.H, self.C, 1))

    def __call__(self, theta: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Objective ``(k,)`` float64 and gradient ``(k, D)`` of the problems ``idx`` at ``theta``."""
        k, H, C = len(theta), self.H, self.C
        loss = torch.zeros(k, dtype=torch.float64, device=theta.device)
        gX = torch.zeros(k * H * C, self.P.shape[0], device=theta.device)  # (k*HC, d)
        gb = torch.zeros(k, H * C, device=theta.device)
        for Xc, Y in self.blocks():
            m = len(Xc)
            logp = torch.log_softmax(self.logits_t(Xc, theta), 2)  # (k, H, C, m)
            at = Y.t().reshape(1, H, 1, m).expand(k, H, 1, m)
            loss -= torch.gather(logp, 2, at).sum((1, 2, 3), dtype=torch.float64)
            G = logp.exp_()  # softmax
            G.scatter_add_(2, at, torch.full((), -1.0, device=G.device).expand(k, H, 1, m))  # - one-hot
            gb += G.sum(3).reshape(k, H * C)
            gX.addmm_(G.view(k * H * C, m), Xc)
        V, _ = self.unpack(theta)
        gV = torch.matmul(self.P.t(), gX.view(k, H * C, -1).transpose(1, 2)) / self.n  # (k, r, HC)
        MV = V if self.w is None else V * self.w[:, None]
        a = self.alphas[idx]
        loss = loss / self.n + 0.5 * a.double() * (V * MV).sum((1, 2), dtype=torch.float64)
        gV += a.view(k, 1, 1) * MV
        return loss, torch.cat([gV.reshape(k, -1), gb / self.n], 1)

    def correct(self, blocks, theta: torch.Tensor) -> np.ndarray:
        """Correct heads of every row over ``blocks()`` for each problem: ``(k, rows)`` counts."""
        parts = []
        for Xc, Y in blocks():
            pred = self.logits_t(Xc, theta).argmax(2)  # (k, H, m)
            parts.append((pred == Y.t()[None]).sum(1).cpu().numpy())  # (k, m)
        return np.concatenate(parts, 1) if parts else np.zeros((len(theta), 0), np.int64)

    def curvature(self) -> torch.Tensor:
        """``(k, D)`` an estimate of each coordinate's inverse curvature: ``1 / (c + alpha_i w_j)`` for the
        weights, ``1 / c`` for the biases, with ``c = 1 / C`` the cross-entropy's curvature along a whitened
        direction at near-uniform predictions (what :func:`~reservoir.readouts.lbfgs.lbfgs` takes as ``precond``)."""
        c = 1.0 / self.C
        w = torch.ones(self.r, device=self.P.device) if self.w is None else self.w
        HC = self.H * self.C
        pv = (1.0 / (c + self.alphas[:, None] * w[None, :]))[:, :, None].expand(-1, -1, HC)  # (k, r, HC)
        pb = torch.full((len(self.alphas), HC), 1.0 / c, device=self.P.device)
        return torch.cat([pv.reshape(len(self.alphas), -1), pb], 1)
