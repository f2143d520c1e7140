"""Learning curves: test accuracy against training rows, one line per layer, with 95% interval bands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from reservoir.io import save_figure

if TYPE_CHECKING:
    from reservoir.readouts.run import FitResult


def plot_learning_curves(results: list[FitResult], path: str | os.PathLike, title: str = "") -> Path | None:
    """Draw each result's ``learning_curve`` (log x) into a PNG at ``path``; ``None`` when none has one.

    Examples
    --------
    >>> plot_learning_curves(fit_linear(store, train_sizes=[100, 1000, None]), "curve.png")  # doctest: +SKIP
    """
    from matplotlib.figure import Figure

    curves = [(r.config["layer"], r.metrics["learning_curve"]) for r in results if r.metrics.get("learning_curve")]
    if not curves:
        return None
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, (layer, curve) in enumerate(curves):
        x = [p["n_train"] for p in curve]
        y = [100 * p["test_accuracy"] for p in curve]
        lo = [100 * p["test_interval"][0] for p in curve]
        hi = [100 * p["test_interval"][1] for p in curve]
        colour = f"C{i % 10}"
        ax.plot(x, y, marker="o", color=colour, label=f"layer {layer}")
        ax.fill_between(x, lo, hi, color=colour, alpha=0.18, linewidth=0)
    chance = results[0].metrics.get("chance")
    if chance is not None:
        ax.axhline(100 * chance, color="0.5", linestyle=":", label="majority class")
    ax.set_xscale("log")
    ax.set(xlabel="training rows", ylabel="test accuracy (%)", title=title or "learning curve (95% intervals)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    return save_figure(fig, path)
