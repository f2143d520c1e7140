"""L-BFGS over a batch of independent problems, each with its own history, step and stopping point.

The readouts fit one model per L2 strength (and per layer). Fitted one after
another, each strength costs its own passes over the rows; here every
strength is a row of one parameter matrix ``theta (k, D)``, and one call of
the objective evaluates all problems still running against a single pass over
the data (:class:`~reservoir.readouts.multinomial.Multinomial` turns the ``k``
weight matrices into one wide matrix product). The problems share nothing
else: each keeps its own curvature pairs, step length and convergence test,
so problem ``i`` follows the iterates it would follow alone (up to the
rounding of a wider matrix product).

The line search is backtracking with the Armijo condition (quadratic
interpolation, clamped to ``[0.1, 0.5]`` of the failed step). The objectives
here are convex, so every accepted step has ``sᵀy >= 0`` and the two-loop
recursion gives a descent direction; a pair with ``sᵀy`` at rounding level is
skipped, and a direction that is not one of descent falls back to the
steepest descent.

A diagonal ``precond`` (an estimate of each coordinate's inverse curvature,
per problem) is L-BFGS's initial inverse Hessian, scaled at every step by
``sᵀy / yᵀ(precond y)``: where the curvature of the coordinates differs by
orders of magnitude and is known in advance (an L2 penalty that weighs
directions unequally), the iterates converge as on a well-conditioned problem.

A problem stops when an accepted step lowers its objective by less than
``ftol * max(1, |f|)``, when its largest gradient entry is at most ``gtol``,
when its step falls below ``1e-10`` or after ``max_iter`` accepted steps; and,
with a ``watch`` (what the readouts pass: predictions on validation rows), when
what it watches has not changed over ``stable`` checks ``every`` rounds apart:
a tolerance matched to what those predictions can resolve, which ends the
weakly regularized problems that would otherwise crawl for hundreds of
iterations along directions that change no prediction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

#: ``fg(theta (k, D), problems (k,)) -> (f (k,) float64, g (k, D))`` for the problems with those indices.
Objective = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class LBFGSResult:
    """Where each problem stopped."""

    theta: torch.Tensor  # (k, D)
    f: torch.Tensor  # (k,) float64
    n_iter: torch.Tensor  # (k,) accepted steps
    rounds: int  # objective calls after the first (each one pass over the data)


def lbfgs(fg: Objective, theta: torch.Tensor, *, max_iter: int = 500, ftol: float = 1e-7, gtol: float = 1e-6,
          history: int = 10, c1: float = 1e-4, watch: Callable[[torch.Tensor], torch.Tensor] | None = None,
          every: int = 5, stable: int = 3, precond: torch.Tensor | None = None) -> LBFGSResult:
    """Minimize ``k`` independent objectives from ``theta`` (``(k, D)``, not modified).

    ``precond`` ``(k, D)``, positive: the diagonal initial inverse Hessian of each problem (default the identity).

    ``watch(theta (b, D)) -> (b, ...)`` gives, for some problems' parameters, what must stop changing (e.g.
    validation predictions); checked every ``every`` rounds, a problem whose watched values are the same at
    ``stable`` checks in a row stops.

    Examples
    --------
    >>> A = torch.tensor([[1.0, 0.0], [0.0, 10.0]])
    >>> def fg(theta, idx):  # f_i(x) = (x - i)ᵀ A (x - i) / 2
    ...     r = theta - idx[:, None].float()
    ...     return 0.5 * ((r @ A) * r).sum(1).double(), r @ A
    >>> out = lbfgs(fg, torch.zeros(3, 2), gtol=1e-7, ftol=0)
    >>> out.theta.round(decimals=4).tolist()
    [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    """
    k, D = theta.shape
    dev, dt = theta.device, theta.dtype
    m = history
    theta = theta.clone()
    H0 = torch.ones_like(theta) if precond is None else precond.to(dev, dt).expand(k, D)  # (k, D)
    S = torch.zeros(k, m, D, device=dev, dtype=dt)  # steps s = x_new - x
    Yd = torch.zeros(k, m, D, device=dev, dtype=dt)  # gradient changes y = g_new - g
    rho = torch.zeros(k, m, device=dev, dtype=dt)  # 1 / sᵀy, 0 for an empty slot
    count = torch.zeros(k, dtype=torch.long, device=dev)  # pairs stored (the newest at (count - 1) % m)
    n_iter = torch.zeros(k, dtype=torch.long, device=dev)
    everyone = torch.arange(k, device=dev)
    f, g = fg(theta, everyone)
    active = torch.ones(k, dtype=torch.bool, device=dev)
    active &= g.abs().amax(1) > gtol

    def direction(ix: torch.Tensor) -> torch.Tensor:
        """The two-loop recursion for problems ``ix`` (slots not yet filled have rho 0 and count for nothing)."""
        q = g[ix].clone()  # (b, D)
        c = count[ix]
        alphas = []
        for back in range(m):  # newest to oldest
            j = (c - 1 - back) % m
            r = rho[ix, j] * (back < c)
            a = r * (S[ix, j] * q).sum(1)
            alphas.append(a)
            q -= a[:, None] * Yd[ix, j]
        newest = (c - 1) % m
        y_new = Yd[ix, newest]
        sy, yHy = (S[ix, newest] * y_new).sum(1), (y_new * H0[ix] * y_new).sum(1)
        gamma = torch.where(c > 0, sy / yHy.clamp_min(1e-30), torch.ones_like(sy))  # initial Hessian scale
        r_ = q * gamma[:, None] * H0[ix]
        for back in reversed(range(m)):  # oldest to newest
            j = (c - 1 - back) % m
            b = rho[ix, j] * (back < c) * (Yd[ix, j] * r_).sum(1)
            r_ += S[ix, j] * (alphas[back] - b)[:, None]
        return -r_

    d = torch.zeros_like(theta)
    gd = torch.zeros(k, device=dev, dtype=dt)
    step = torch.ones(k, device=dev, dtype=dt)
    d[everyone] = -H0 * g
    gd[everyone] = (g * d).sum(1)
    step[everyone] = torch.clamp(1.0 / d.abs().sum(1).clamp_min(1e-30), max=1.0)  # a cautious first step
    rounds = 0
    seen: torch.Tensor | None = None  # the watched values at the last check, per problem
    unchanged = torch.zeros(k, dtype=torch.long, device=dev)
    while bool(active.any()) and rounds < 20 * max_iter:
        rounds += 1
        if watch is not None and rounds % every == 0:
            ix = active.nonzero().squeeze(1)
            now = watch(theta[ix])
            if seen is None:
                seen = torch.zeros((k, *now.shape[1:]), dtype=now.dtype, device=dev)
                unchanged[:] = -1  # the first check only records
            same = (now == seen[ix]).reshape(len(ix), -1).all(1)
            unchanged[ix] = torch.where(same, unchanged[ix] + 1, 0)
            seen[ix] = now
            active[ix[unchanged[ix] >= stable - 1]] = False
            if not bool(active.any()):
                break
        ix = active.nonzero().squeeze(1)
        trial = theta[ix] + step[ix, None] * d[ix]
        f_new, g_new = fg(trial, ix)
        ok = f_new <= f[ix] + c1 * (step[ix] * gd[ix]).double()
        if not bool(ok.all()):  # backtrack: the minimum of the quadratic through f, f' and f(t), within [0.1t, 0.5t]
            bad, t, slope = ix[~ok], step[ix[~ok]], gd[ix[~ok]]
            excess = (f_new[~ok] - f[bad]).to(dt) - slope * t
            t_new = -slope * t * t / (2 * excess).clamp_min(1e-30)
            step[bad] = torch.minimum(torch.maximum(t_new, 0.1 * t), 0.5 * t)
            active[bad[step[bad] < 1e-10]] = False
        good = ix[ok]
        if len(good):
            s, y = trial[ok] - theta[good], g_new[ok] - g[good]
            sy = (s * y).sum(1)
            keep = sy > 1e-10 * s.norm(dim=1) * y.norm(dim=1)
            slot = count[good] % m
            S[good[keep], slot[keep]] = s[keep]
            Yd[good[keep], slot[keep]] = y[keep]
            rho[good[keep], slot[keep]] = 1.0 / sy[keep]
            count[good[keep]] += 1
            decrease = f[good] - f_new[ok]
            theta[good], f[good], g[good] = trial[ok], f_new[ok], g_new[ok]
            n_iter[good] += 1
            done = ((g[good].abs().amax(1) <= gtol) | (decrease <= ftol * f[good].abs().clamp_min(1.0))
                    | (n_iter[good] >= max_iter))
            active[good[done]] = False
            going = good[~done]
            if len(going):
                d[going] = direction(going)
                gd[going] = (g[going] * d[going]).sum(1)
                uphill = going[gd[going] >= 0]
                if len(uphill):  # lost curvature information: restart from the steepest descent
                    count[uphill] = 0
                    rho[uphill] = 0
                    d[uphill] = -H0[uphill] * g[uphill]
                    gd[uphill] = (g[uphill] * d[uphill]).sum(1)
                step[going] = 1.0
    return LBFGSResult(theta, f, n_iter, rounds)
