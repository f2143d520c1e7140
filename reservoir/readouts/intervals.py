"""95% intervals for accuracies over test rows, and paired intervals of the difference of two.

An accuracy is a mean over rows of each row's share of correct heads (one
head for most tasks; bit XOR's bits, bit memory's output tokens x bits are
several heads of one row). The rows are the unit of sampling, so a row with
many heads counts once, as it was drawn once.

* One head per row: the correct rows are binomial, and the interval is
  Wilson's score interval (close to 95% coverage at every accuracy, and not
  degenerate at 0% or 100%, where a bootstrap collapses to a point).
* Several heads: Wilson's interval with the rows' effective number of
  trials (Kish's design effect): ``n_eff = p (1 - p) / var`` for the variance
  ``var`` of the mean of the rows' shares of correct heads. Independent heads
  give ``n_eff`` = rows x heads, heads that always agree within a row
  ``n_eff`` = rows; ``n_eff`` is kept within those two. Near 100%, where a
  few failing rows hold all the spread, a percentile bootstrap over rows
  held the truth in 89-92% of simulated readouts; this interval holds it
  about as often as Wilson's own over independent trials (92-96% there,
  where the count of failures is small). When every row scored alike (all
  heads right on every row), nothing tells how a row's heads fail together,
  and each row is one trial: the cautious end. So the interval is not
  monotone near 100%: one scattered wrong label (evidence that heads fail
  apart) can give a higher lower bound than none.
* A difference of two readouts on the same rows: the paired bootstrap of the
  mean per-row difference (seeded, same draw), so what both get right or wrong
  cancels, and the exact sign test over the rows where the two differ
  (McNemar's exact test when a row has one label). A difference is resolved
  when both say so: its interval excludes zero and the test rejects no
  difference at 5%. The bootstrap alone is not enough on a few rows that
  differ: one row that ``a`` got right and ``b`` wrong gives the interval
  [+1, +1] (every resample alike), and four such rows out of a thousand
  exclude zero as well, where the exact test gives p = 1 and p = 0.125.

Per-row results travel in results files as
:func:`~reservoir.results.encode_rows` (counts of correct heads, base64).

Examples
--------
>>> correct = np.array([1] * 90 + [0] * 10)
>>> [round(v, 3) for v in accuracy_interval(correct, heads=1)]
[0.826, 0.945]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.results import decode_rows, encode_rows  # noqa: F401 - the record's format, with the results files

LEVEL = 0.95
#: Bootstrap resamples of an interval or a paired difference.
RESAMPLES = 4000


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def wilson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval for ``k`` successes in ``n`` trials.

    Examples
    --------
    >>> [round(v, 4) for v in wilson(1000, 1000)]
    [0.9962, 1.0]
    """
    if n <= 0:
        return (math.nan, math.nan)
    return _wilson_p(k / n, n, level)


def _bootstrap_means(values: np.ndarray, seed: int, resamples: int) -> np.ndarray:
    """Means of ``resamples`` bootstrap resamples of ``values`` (rows drawn with replacement), exactly:
    a multinomial draw over the distinct values and their counts."""
    levels, counts = np.unique(values, return_counts=True)
    draws = np.random.default_rng(seed).multinomial(len(values), counts / len(values), size=resamples)
    return draws @ levels / len(values)  # (resamples,)


def accuracy_interval(correct: np.ndarray, heads: int = 1, *, level: float = LEVEL) -> tuple[float, float]:
    """The 95% interval of the accuracy of rows with ``correct[i]`` of ``heads`` heads right.

    Wilson's interval: over the rows for one head, over the rows' effective number of trials for several.

    Examples
    --------
    >>> [round(v, 4) for v in accuracy_interval(np.r_[np.full(999, 5), 4], heads=5)]
    [0.9989, 1.0]
    """
    correct = np.asarray(correct)
    n = len(correct)
    if n == 0:
        return (math.nan, math.nan)
    if heads == 1:
        return wilson(int(correct.sum()), n, level)
    if np.all(correct == correct[0]):  # every row alike (all right, say): no spread to measure; count rows
        return _wilson_p(float(correct[0]) / heads, n, level)
    share = correct / heads  # (n,)
    p = float(share.mean())
    variance = float(share.var(ddof=1)) / n  # of the mean
    n_eff = min(max(p * (1 - p) / variance, n), n * heads) if variance > 0 else n * heads
    return _wilson_p(p, n_eff, level)


def _wilson_p(p: float, n: float, level: float) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``p`` over ``n`` (effective, not necessarily whole) trials."""
    z = _z(level)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = (0.0 if p <= 0 else max(0.0, centre - half)), (1.0 if p >= 1 else min(1.0, centre + half))
    return (min(low, p), max(high, p))


@dataclass(frozen=True)
class Difference:
    """``a - b`` in accuracy over the same rows: its paired 95% interval (``low``, ``high``) and the exact sign
    test's two-sided p-value over the rows where ``a`` and ``b`` differ (``p_value``)."""

    diff: float
    low: float
    high: float
    p_value: float = math.nan
    level: float = LEVEL

    @property
    def excludes_zero(self) -> bool:
        """Whether the paired interval excludes zero."""
        return self.low > 0 or self.high < 0

    @property
    def resolved(self) -> bool:
        """Whether the rows tell ``a`` from ``b``: the interval excludes zero and the sign test rejects no
        difference at ``1 - level`` (module docstring: the interval alone does not suffice on a few rows)."""
        return self.excludes_zero and self.p_value < 1 - self.level


def sign_test(d: np.ndarray) -> float:
    """The exact two-sided sign test of per-row differences ``d``: the rows where they are zero left out, is the
    number of positive rows among the rest what a fair coin gives? McNemar's exact test for one label a row.

    Examples
    --------
    >>> sign_test(np.r_[np.ones(4), np.zeros(996)]), round(sign_test(np.r_[np.ones(9), -1.0]), 4)
    (0.125, 0.0215)
    """
    from scipy.stats import binom

    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    if pos + neg == 0:
        return 1.0
    return min(1.0, 2.0 * float(binom.cdf(min(pos, neg), pos + neg, 0.5)))


def paired_difference(correct_a: np.ndarray, correct_b: np.ndarray, heads: int = 1, *, seed: int = 0,
                      level: float = LEVEL, resamples: int = RESAMPLES) -> Difference:
    """The accuracy of ``a`` minus that of ``b`` on the same rows, with a paired bootstrap interval and the exact
    sign test over the rows where they differ (:class:`Difference`; ``resolved`` needs both).

    Examples
    --------
    >>> a, b = np.ones(500), np.r_[np.ones(450), np.zeros(50)]
    >>> paired_difference(a, b).resolved, paired_difference(a, a).resolved
    (True, False)
    >>> one = paired_difference(np.ones(1), np.zeros(1))  # one row: the interval excludes zero, the test cannot
    >>> (one.low, one.high), one.p_value, one.resolved
    ((1.0, 1.0), 1.0, False)
    """
    a, b = np.asarray(correct_a, np.float64), np.asarray(correct_b, np.float64)
    if a.shape != b.shape:
        raise ReservoirError(f"expected per-row results of the same rows; found {len(a)} and {len(b)} rows")
    d = (a - b) / heads  # (n,)
    if len(d) == 0:
        return Difference(math.nan, math.nan, math.nan, math.nan, level)
    means = _bootstrap_means(d, seed, resamples)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Difference(float(d.mean()), float(lo), float(hi), sign_test(d), level)


def accuracy_metrics(prefix: str, correct: np.ndarray, heads: int, *,
                     accuracy: float | None = None) -> dict[str, float | list[float]]:
    """``{prefix}_accuracy`` and ``{prefix}_interval`` of per-row counts of correct heads (the accuracy computed
    from the counts unless given, e.g. as an estimator's ``score`` computed it).

    Examples
    --------
    >>> accuracy_metrics("test", np.array([1, 1, 0, 1]), 1)["test_accuracy"]
    0.75
    """
    if accuracy is None:
        accuracy = int(correct.sum()) / max(len(correct) * heads, 1) if len(correct) else float("nan")
    return {f"{prefix}_accuracy": accuracy,
            f"{prefix}_interval": list(accuracy_interval(correct, heads))}
