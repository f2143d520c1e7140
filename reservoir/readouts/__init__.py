"""Readouts fitted from stored features (scikit-learn estimator contract)."""

from reservoir.readouts.features import load_layer
from reservoir.readouts.logistic import LogisticReadout

__all__ = ["LogisticReadout", "load_layer"]
