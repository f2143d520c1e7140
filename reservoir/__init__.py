"""reservoir: frozen pretrained transformers as fixed feature machines.

Run a dataset through a frozen backbone once, store the hidden states of every
layer, and fit readouts from the store in seconds.
"""

__version__ = "0.1.0.dev0"

from reservoir.errors import ReservoirError  # noqa: E402

__all__ = ["__version__", "ReservoirError"]
