"""Readouts fitted from stored features (scikit-learn estimator contract), and the experiments that run them.

* :class:`LogisticReadout`, :class:`RidgeReadout`: estimators (``fit(X, y)``
  on arrays, or ``fit_chunks`` on a stream of chunks), sharing
  :class:`~reservoir.readouts.base.LinearReadout`.
* :func:`iter_layer`, :func:`load_layer`: one layer of a
  :class:`~reservoir.store.FeatureStore`, as a readout reads it
  (:mod:`reservoir.readouts.features`); streamed statistics and validation
  splits are in :mod:`reservoir.readouts.stats`.
* :func:`fit_linear`, :func:`fit_raw`: a readout per stored layer, or on a
  task's raw inputs, returning :class:`FitResult` objects; the sweep engine
  behind ``fit_linear`` (every layer read once, each over its L2 path) is
  :mod:`reservoir.readouts.sweep`, with :mod:`~reservoir.readouts.lbfgs`
  (batched L-BFGS) and :mod:`~reservoir.readouts.multinomial` (the batched
  objective).
* :mod:`reservoir.readouts.intervals` (95% intervals, paired differences),
  :mod:`reservoir.readouts.probes` (saved readouts applied to other stores),
  :mod:`reservoir.readouts.curves` (learning-curve plots).
"""

from reservoir.readouts.features import iter_layer, load_layer
from reservoir.readouts.logistic import LogisticReadout
from reservoir.readouts.raw import fit_raw
from reservoir.readouts.ridge import RidgeReadout
from reservoir.readouts.run import FitResult, fit_linear

__all__ = ["FitResult", "LogisticReadout", "RidgeReadout", "fit_linear", "fit_raw", "iter_layer", "load_layer"]
