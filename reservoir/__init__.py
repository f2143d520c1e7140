"""reservoir: frozen pretrained transformers as fixed feature machines.

Run a dataset through a frozen backbone once, store the hidden states of every
layer, and fit readouts from the store in seconds; train live with the same
objects when gradients must reach inside the model.

The core takes objects and returns typed results::

    from reservoir import extract, fit_linear, get_task, load_backbone

    task = get_task("digits")                                  # or TaskData.from_arrays(...)
    backbone = load_backbone("minilm", d_in=task.d_in)         # frozen, with its input projection
    with extract(task, backbone, "cache/digits.zarr", layers=6) as store:
        for r in fit_linear(store, layers="all"):              # FitResult objects
            print(r.config["layer"], r.metrics["test_accuracy"])

Names are imported on first use, so ``import reservoir`` stays light (no
torch until a name that needs it is used).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0.dev0"

from reservoir.errors import ReservoirError  # noqa: E402

#: Each public name and the module it comes from.
_SOURCES = {
    # tasks
    "get_task": "reservoir.tasks",
    "load_task": "reservoir.tasks",
    "TaskData": "reservoir.tasks",
    "Task": "reservoir.tasks",
    "Split": "reservoir.tasks",
    # backbones
    "load_backbone": "reservoir.backbones",
    # extraction and stores (``extract`` is the package reservoir.extract, which calls reservoir.extract.extract)
    "ExtractConfig": "reservoir.extract",
    "FeatureStore": "reservoir.store",
    # readouts
    "LogisticReadout": "reservoir.readouts",
    "RidgeReadout": "reservoir.readouts",
    "fit_linear": "reservoir.readouts",
    "fit_raw": "reservoir.readouts",
    "load_layer": "reservoir.readouts",
    "FitResult": "reservoir.readouts",
    # live training
    "train": "reservoir.training",
    "sweep": "reservoir.training",
    "TrainConfig": "reservoir.training",
    "TrainData": "reservoir.training",
    "Feeder": "reservoir.training",
    "ReservoirClassifier": "reservoir.training",
    "TrainResult": "reservoir.training",
    "SweepResult": "reservoir.training",
    # benchmarks
    "BenchResult": "reservoir.bench",
}

__all__ = ["__version__", "ReservoirError", "extract", *_SOURCES]


def __getattr__(name: str) -> Any:
    if name == "extract":  # the package, callable as its function: the same object however it was first reached
        return importlib.import_module("reservoir.extract")
    if name in _SOURCES:
        value = getattr(importlib.import_module(_SOURCES[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'reservoir' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
