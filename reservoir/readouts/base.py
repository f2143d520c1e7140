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

from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from reservoir import options
from reservoir.errors import ReservoirError

#: The share of training rows held out to choose the L2 strength.
VAL_FRACTION = options.number(0, 1, open_low=True)


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
        ``"LogisticReadout: val_fraction must be a number in (0, 1), found 2.0"``.
    """

    #: Parameter name -> its :class:`~reservoir.options.Constraint`; :meth:`_check_params` runs them all.
    _parameter_checks: ClassVar[dict[str, options.Constraint]] = {}
    #: Feature dtypes ``validate_data`` may keep (others are converted to the first).
    _dtype: Any = np.float32

    def _check_params(self) -> None:
        """Refuse any parameter outside its range with one line naming it, what was expected and what came."""
        for name, constraint in self._parameter_checks.items():
            constraint.check(getattr(self, name), f"{type(self).__name__}: {name}")

    def _validated(self, X) -> np.ndarray:
        """``X`` checked against the fitted estimator (fitted, ``n_features_in_`` columns)."""
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=self._dtype)

    def _class_scores(self, X) -> np.ndarray:
        """``(n, n_heads, n_classes)`` scores of each class per head; the largest is predicted."""
        raise NotImplementedError

    @staticmethod
    def _finite(scores: np.ndarray) -> np.ndarray:
        """``scores``, refused (ValueError) where any is NaN or infinite: weights (or features) beyond float32's
        range overflow the product, and an argmax over NaN predicts class 0 for every row without a word."""
        if not np.isfinite(scores).all():
            raise ValueError("expected finite class scores; found NaN or infinite ones: the readout's weights or "
                             "these features overflow float32 in their product")
        return scores

    def predict(self, X):
        """Labels ``(n,)``, or ``(n, n_heads)`` with several heads."""
        idx = self._class_scores(X).argmax(-1)  # (n, n_heads)
        return self.classes_[idx[:, 0] if self.n_heads_ == 0 else idx]

    def hits(self, X, y) -> np.ndarray:
        """Which heads of each row are predicted right: bool ``(n, n_heads or 1)``. Labels of another shape than
        the predictions (other rows, heads, or a column ``(n, 1)`` for one label a row) are one line, never
        compared by broadcasting."""
        y = np.asarray(y)
        pred = np.asarray(self.predict(X))
        if y.shape != pred.shape:
            if y.ndim == 2 and y.shape[1] == 1 and y.shape[:1] == pred.shape:  # one label a row, as a column
                y = y[:, 0]
            else:
                raise ValueError(f"expected labels of shape {pred.shape}, one per prediction; found {y.shape}")
        return (pred == y).reshape(len(y), -1)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy over rows and heads (each bit counts once); unweighted, the ratio of counts (the same
        float as every other accuracy of the toolkit, whatever order a sum runs in)."""
        hit = self.hits(X, y)  # (n, H)
        if sample_weight is None:
            return int(hit.sum()) / max(hit.size, 1)
        return float(np.average(hit.mean(1), weights=sample_weight))  # (n,) share of heads right

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
