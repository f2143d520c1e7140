"""What both readouts share: parameter checks at fit, per-head class scores turned into labels and accuracy.

A readout predicts one label per row and head (``y`` of shape ``(n,)``, or
``(n, n_heads)`` for several heads over the same features, such as bit XOR's
bits). Subclasses implement ``_class_scores(X) -> (n, n_heads, n_classes)``
(larger is likelier) and declare their parameters' ranges in
``_parameter_checks``; :class:`LinearReadout` gives ``predict``, ``score``, the
scikit-learn tags and the check of every parameter, which ``fit`` runs first
(scikit-learn's convention: ``__init__`` only stores).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from reservoir.errors import ReservoirError

#: A parameter check: a predicate on the value and what it expects, in words.
Check = tuple[Callable[[Any], bool], str]


def _is_int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def integer(low: int) -> Check:
    """An integer ``>= low``."""
    return (lambda v: _is_int(v) and v >= low), f"an integer >= {low}"


def number(low: float, high: float | None = None, open_low: bool = False) -> Check:
    """A finite number ``>= low`` (``> low`` when ``open_low``), and ``< high`` when given."""
    def ok(v) -> bool:
        return _is_real(v) and (v > low if open_low else v >= low) and (high is None or v < high)
    if high is not None:
        return ok, f"a number in {'(' if open_low else '['}{low}, {high})"
    return ok, f"a number {'>' if open_low else '>='} {low}"


def one_of(*options: str) -> Check:
    """One of ``options``."""
    return (lambda v: isinstance(v, str) and v in options), "one of " + ", ".join(map(repr, options))


def grid(low: float, open_low: bool) -> Check:
    """``None`` (a default grid) or a non-empty sequence of numbers as :func:`number` checks them."""
    each, words = number(low, open_low=open_low)

    def ok(v) -> bool:
        return v is None or (not isinstance(v, (str, bytes)) and hasattr(v, "__len__") and len(v) > 0
                             and all(each(a) for a in v))
    return ok, f"None or a non-empty list of numbers {words.removeprefix('a number ')}"


def optional(check: Check) -> Check:
    """``None`` or what ``check`` accepts."""
    ok, words = check
    return (lambda v: v is None or ok(v)), f"None or {words}"


FLAG: Check = (lambda v: isinstance(v, (bool, np.bool_)), "True or False")
RANDOM_STATE: Check = (lambda v: v is None or (_is_int(v) and v >= 0), "None or an integer >= 0")
#: The share of training rows held out to choose the L2 strength.
VAL_FRACTION: Check = number(0, 1, open_low=True)


class LinearReadout(ClassifierMixin, BaseEstimator):
    """Base of the readouts: labels and accuracy from per-head class scores; parameters checked at fit.

    Subclasses set ``classes_`` (sorted labels), ``n_heads_`` (0 for a 1-d
    ``y``, else the number of heads) and ``n_features_in_`` in ``fit``, and
    implement ``_class_scores``. Not meant to be used directly.

    Every readout fits from arrays, ``fit(X, y, validation_data=None)``, or
    from chunks, ``fit_chunks(train_chunks, val_chunks=None)``: each a list of
    ``(X (m, d), y (m,) or (m, n_heads))`` or a callable returning a fresh
    iterable of them (a pass over the data calls it again). Without
    validation data, ``val_fraction`` of the training rows choose the L2
    strength: in ``fit_chunks`` by a seeded hash of the global row index
    (:func:`~reservoir.readouts.stats.holdout_mask`), the same however the
    rows are chunked.

    Raises
    ------
    ReservoirError
        (a ``ValueError``) from ``fit``, before any data is read, for a
        parameter outside its range, naming it, its range and its value:
        ``"LogisticReadout: val_fraction must be a number in (0, 1); found 2.0"``.
    """

    #: Parameter name -> :data:`Check`; :meth:`_check_params` runs them all.
    _parameter_checks: ClassVar[dict[str, Check]] = {}
    #: Feature dtypes ``validate_data`` may keep (others are converted to the first).
    _dtype: Any = np.float32

    def _check_params(self) -> None:
        """Refuse any parameter outside its range with one line naming it, what was expected and what came."""
        for name, (ok, expected) in self._parameter_checks.items():
            value = getattr(self, name)
            if not ok(value):
                raise ReservoirError(f"{type(self).__name__}: {name} must be {expected}; found {value!r}")

    def _validated(self, X) -> np.ndarray:
        """``X`` checked against the fitted estimator (fitted, ``n_features_in_`` columns)."""
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=self._dtype)

    def _class_scores(self, X) -> np.ndarray:
        """``(n, n_heads, n_classes)`` scores of each class per head; the largest is predicted."""
        raise NotImplementedError

    def predict(self, X):
        """Labels ``(n,)``, or ``(n, n_heads)`` with several heads."""
        idx = self._class_scores(X).argmax(-1)  # (n, n_heads)
        return self.classes_[idx[:, 0] if self.n_heads_ == 0 else idx]

    def hits(self, X, y) -> np.ndarray:
        """Which heads of each row are predicted right: bool ``(n, n_heads or 1)``."""
        y = np.asarray(y)
        return (np.asarray(self.predict(X)) == y).reshape(len(y), -1)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy over rows and heads (each bit counts once)."""
        return float(np.average(self.hits(X, y).mean(1), weights=sample_weight))  # (n,) share of heads right

    def save(self, path, **meta):
        """Keep the fitted readout as a probe: ``<path>.safetensors`` + ``<path>.probe.json``
        (:mod:`reservoir.readouts.probes`); ``meta`` (JSON-ready) is recorded beside it. Returns the JSON's path.

        Examples
        --------
        >>> est.save("probes/xor-layer2", note="bit XOR, layer 2")  # doctest: +SKIP
        """
        from reservoir.readouts.probes import save

        return save(self, path, meta)

    @classmethod
    def load(cls, path):
        """The fitted readout saved at ``path`` (see :meth:`save`); one line if it is another kind of readout.

        Examples
        --------
        >>> est = LogisticReadout.load("probes/xor-layer2")  # doctest: +SKIP
        """
        from reservoir.readouts.probes import load

        est, _ = load(path)
        if not isinstance(est, cls):
            raise ReservoirError(f"{path}: expected a saved {cls.__name__}; found a {type(est).__name__}")
        return est

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.classifier_tags.multi_label = False
        return tags
