"""Live training: the backbone in the loop, with a freeze scheme deciding what learns.

``reservoir train`` builds the same task, backbone and orthogonal projection as
``reservoir extract`` (same names, inits and seeds, so cached and live results
are comparable), adds a linear head on the final-norm-applied last real token
(the last ``n_out_tokens`` for bit memory), freezes everything but the asked
groups, and trains with Adam and gradient-norm clipping. Validation accuracy
(on the task's ``val`` split, else 10% carved from train) picks the best
checkpoint; the test split is evaluated in full, once, with it. Training
resumes from ``last.pt`` in its output folder.

The package, in the order a run uses it:

- :mod:`~reservoir.training.config`: :class:`TrainConfig`, the bounds of its numbers;
- :mod:`~reservoir.training.classifier`: :class:`ReservoirClassifier` and the loss;
- :mod:`~reservoir.training.data`: :class:`Feeder` (one split's batches), :class:`TrainData`;
- :mod:`~reservoir.training.evaluate`: accuracy on a split, the rows right, steps to converge;
- :mod:`~reservoir.training.loop`: :func:`train` (objects in, :class:`TrainResult` out);
- :mod:`~reservoir.training.builders`: :func:`run` (a config in: what ``reservoir train`` calls), :func:`load_run`;
- :mod:`~reservoir.training.stores`: training from split-point and last-token stores;
- :mod:`~reservoir.training.sweeps`: lr sweeps, :class:`SweepResult`.

Checkpoints (:mod:`reservoir.training.checkpoint`) hold tensors and plain data only
and are read with ``torch.load(..., weights_only=True)``.

Examples
--------
>>> from reservoir.backbones import load_backbone
>>> from reservoir.tasks import load_task
>>> from reservoir.training import ReservoirClassifier, TrainConfig, TrainData, train
>>> task = load_task("bit-xor", {"n_train": 200, "n_test": 100})
>>> model = ReservoirClassifier(load_backbone("tiny-gpt2", d_in=task.d_in), 1, 5, task.n_classes)
>>> r = train(model, TrainData.from_task(task), TrainConfig(task="bit-xor", steps=20), progress=False)
... # doctest: +ELLIPSIS
trainable params: ...
>>> r.metrics["n_test"]
100

Names are imported on first use, so the configuration (what the command line
builds its options from) is read without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module it comes from.
_SOURCES = {
    **dict.fromkeys(("build", "finished_or_run", "load_run", "run", "run_config"), "builders"),
    **dict.fromkeys(("ReservoirClassifier", "heads_per_token", "loss_fn"), "classifier"),
    **dict.fromkeys(("BOUNDS", "TrainConfig", "check_number"), "config"),
    **dict.fromkeys(("Feeder", "TrainData", "batch_rows", "carve_val"), "data"),
    **dict.fromkeys(("TrainResult", "evaluate", "steps_to_converge", "train"), "loop"),
    **dict.fromkeys(("build_from_store", "config_for_store", "train_cached"), "stores"),
    **dict.fromkeys(("SweepResult", "parse_lr_sweep", "sweep"), "sweeps"),
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name in _SOURCES:
        value = getattr(importlib.import_module(f"reservoir.training.{_SOURCES[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'reservoir.training' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
