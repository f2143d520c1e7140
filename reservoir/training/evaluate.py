"""Scoring a model on a split: its accuracy, which rows it got right (in the split's order), their intervals, and
the step from which a training run's validation stayed at its best."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from reservoir.runtime import attention_backends, autocast
from reservoir.training.classifier import ReservoirClassifier
from reservoir.training.data import Feeder

__all__ = ["evaluate", "evaluate_rows", "scored_metrics", "steps_to_converge"]


def scored_metrics(test: tuple[np.ndarray, int], val: tuple[np.ndarray, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """From the per-row counts of correct heads (and heads per row) of the test and validation splits:
    ``test_accuracy``, ``test_interval`` and ``best_val_interval``, and the ``rows`` record of the test rows."""
    from reservoir.readouts.intervals import accuracy_interval, accuracy_metrics, encode_rows

    metrics = accuracy_metrics("test", *test)
    metrics["best_val_interval"] = list(accuracy_interval(*val))
    return metrics, {"test": encode_rows(*test)}


def evaluate(model: ReservoirClassifier, data: Feeder, device, batch_size: int = 64, amp: str = "auto") -> float:
    """Accuracy over the whole split (each label element once), in a fixed order."""
    correct, heads = evaluate_rows(model, data, device, batch_size, amp)
    return int(correct.sum()) / max(len(correct) * heads, 1)


def evaluate_rows(model: ReservoirClassifier, data: Feeder, device, batch_size: int = 64,
                  amp: str = "auto") -> tuple[np.ndarray, int]:
    """Correct label elements of every row ``(N,)`` (in the split's order) and the elements per row."""
    was = model.training
    model.eval()
    order = np.argsort(data.lengths, kind="stable")
    correct = np.zeros(len(data), np.int64)
    heads = 1
    hits = []
    with torch.inference_mode(), autocast(device, amp), attention_backends(device):
        for lo in range(0, len(data), batch_size):
            x, lengths, y = data.batch(order[lo : lo + batch_size], device)
            pred = model(x, lengths, data.start).argmax(-1).reshape(len(y), -1)
            right = pred == y.reshape(len(y), -1)  # (b, heads)
            heads = right.shape[1]
            hits.append(right.sum(1))  # kept on the device: one copy back at the end
    model.train(was)
    if hits:
        correct[order] = torch.cat(hits).cpu().numpy()
    return correct, heads


def steps_to_converge(curve: list[dict[str, float]], tolerance: float = 0.01) -> int | None:
    """The step from which validation accuracy stays within ``tolerance`` of its best (Lu et al. Table 6): the
    first validated step after which no validation falls further below the best. ``None`` when the last validation
    is itself further below (the run ended off its best: not converged).

    Examples
    --------
    >>> steps_to_converge([{"step": 10, "val_accuracy": 0.5}, {"step": 20, "val_accuracy": 0.995},
    ...                    {"step": 30, "val_accuracy": 1.0}])
    20
    >>> steps_to_converge([{"step": 10, "val_accuracy": 0.995}, {"step": 20, "val_accuracy": 0.9},
    ...                    {"step": 30, "val_accuracy": 1.0}])  # reached at step 10, left at 20: from step 30
    30
    >>> print(steps_to_converge([{"step": 10, "val_accuracy": 1.0}, {"step": 20, "val_accuracy": 0.5}]))
    None
    """
    if not curve:
        return None
    best = max(p["val_accuracy"] for p in curve)
    settled = None
    for p in reversed(curve):
        if p["val_accuracy"] < best - tolerance:
            break
        settled = int(p["step"])
    return settled
