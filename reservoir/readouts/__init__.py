"""Readouts fitted from stored features (scikit-learn estimator contract)."""

from reservoir.readouts.features import iter_layer, load_layer
from reservoir.readouts.logistic import LogisticReadout
from reservoir.readouts.ridge import RidgeReadout

__all__ = ["LogisticReadout", "RidgeReadout", "iter_layer", "load_layer"]
