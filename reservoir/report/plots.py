"""The report's figures (matplotlib, Agg, no pyplot state): test accuracy vs layer, validation curves, lr sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir.io import save_figure
from reservoir.pairs import settings_key

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.report.rows import Row

def _figure(n_panels: int):
    from matplotlib.figure import Figure

    cols = min(n_panels, 3)
    rows = -(-n_panels // cols)
    fig = Figure(figsize=(5 * cols, 3.6 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def _task_name(label: dict[str, Any]) -> str:
    return label["task"] + (f" ({label['tag']})" if label.get("tag") else "")


def _error_bars(rows: list[Row]) -> np.ndarray:
    """``(2, n)`` distances below and above each row's mean: its 95% interval, else the std over seeds."""
    bars = []
    for r in rows:
        ci = r.interval()
        bars.append((100 * (r.mean - ci[0]), 100 * (ci[1] - r.mean)) if ci else (100 * r.std, 100 * r.std))
    return np.maximum(np.array(bars).T, 0.0)


def depth_lines(rows: list[Row], task: str) -> dict[str, list[Row]]:
    """The lines of ``task``'s depth panel by legend text, each its rows in layer order: one line per backbone,
    init, readout and store (a store's settings: its depth, dtype, ...), never the layers of two stores joined.

    The legend names backbone and init, the readout when not logistic, and any store setting that differs between
    the panel's lines (``store depth 2``, ``dtype float32``).
    """
    lines: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.label["kind"] == "fit-linear" and r.accs and _task_name(r.label) == task:
            key = (r.label["backbone"], r.label["init"], r.label["readout"], settings_key(r.settings))
            lines.setdefault(key, []).append(r)
    firsts = [rs[0].settings for rs in lines.values()]
    apart = _varying(firsts, tuple(dict.fromkeys(k for f in firsts for k in f if k not in ("init", "backbone"))))
    out = {}
    for (bb, init, readout, _), rs in lines.items():
        also = "".join(f", {_SETTING_NAMES.get(k, k)} {rs[0].settings.get(k)}" for k in apart)
        legend = f"{bb} {init}" + ("" if readout == "logistic" else f" ({readout})") + also
        out[legend] = sorted(rs, key=lambda r: r.label["layer"])
    return out


#: Store settings as a depth panel's legend names them.
_SETTING_NAMES = {"layers": "store depth"}


def plot_depth(rows: list[Row], path: Path) -> Path | None:
    """Test accuracy vs layer (bars: 95% intervals), one panel per task, one line per backbone/init/readout and
    store (:func:`depth_lines`)."""
    from matplotlib.ticker import MaxNLocator

    fl = [r for r in rows if r.label["kind"] == "fit-linear" and r.accs]
    # a panel per task whose readouts span several layers (a single depth is a table row, not a curve)
    tasks = [t for t in dict.fromkeys(_task_name(r.label) for r in fl)
             if len({r.label["layer"] for r in fl if _task_name(r.label) == t}) > 1]
    if not tasks:
        return None
    fig, axes = _figure(len(tasks))
    styles = {"pretrained": "-", "random": "--", "stats": ":"}
    for ax, task in zip(axes, tasks):
        for i, (legend, rs) in enumerate(depth_lines(fl, task).items()):
            init, colour = rs[0].label["init"], f"C{i % 10}"
            ax.errorbar([r.label["layer"] for r in rs], [100 * r.mean for r in rs], yerr=_error_bars(rs),
                        marker="o", capsize=3, color=colour, linestyle=styles.get(init, "-"), label=legend)
            paper = [(r.label["layer"], r.paper.value) for r in rs if r.paper]
            if paper:
                px, py = zip(*paper)
                ax.scatter(px, py, marker="x" if init == "pretrained" else "+", s=70, color=colour,
                           label=f"paper, {init}")
        ax.set(title=task, xlabel="layer (depth of the readout)", ylabel="test accuracy (%)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path)  # through a temporary file: a full disk is one line, no half-written PNG
    return path


def _varying(labels: list[dict[str, Any]], keys: tuple[str, ...]) -> list[str]:
    """The keys whose values differ across ``labels`` (what a legend needs to tell lines apart)."""
    return [k for k in keys if len({str(lab.get(k)) for lab in labels}) > 1]


def _legend_text(lab: dict[str, Any], keys: list[str]) -> str:
    names = {"finetune": "train", "layer": "depth"}
    return " ".join(str(lab[k]) if k in ("backbone", "init") else f"{names.get(k, k)} {lab[k]}" for k in keys) or "run"


def plot_curves(curves: list[dict], path: Path) -> Path | None:
    """Validation accuracy vs step of every train run, one panel per task.

    Colour tells the trained groups (and other settings) apart, line style the
    init (solid pretrained, dashed random, dotted stats); the legend names only
    what differs between the panel's runs, below the axes.
    """
    if not curves:
        return None
    tasks = list(dict.fromkeys(_task_name(c["label"]) for c in curves))
    fig, axes = _figure(len(tasks))
    fig.set_figheight(fig.get_figheight() + 0.9)
    styles = {"pretrained": "-", "random": "--", "stats": ":"}
    for ax, task in zip(axes, tasks):
        mine = [c for c in curves if _task_name(c["label"]) == task]
        labs = [{**c["label"], "seed": c["seed"]} for c in mine]
        keys = _varying(labs, ("backbone", "init", "finetune", "lr", "layer", "seed"))
        colour_keys = [k for k in keys if k != "init"]
        colours: dict[str, Any] = {}
        for c, lab in zip(mine, labs):
            ckey = _legend_text(lab, colour_keys)
            colour = colours.setdefault(ckey, f"C{len(colours) % 10}")
            steps = [p["step"] for p in c["curve"]]
            ax.plot(steps, [100 * p["val_accuracy"] for p in c["curve"]], marker=".", color=colour,
                    linestyle=styles.get(lab["init"], "-"), label=_legend_text(lab, keys))
        ax.set(title=task, xlabel="step", ylabel="validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    save_figure(fig, path)
    return path


def plot_sweeps(sweeps: list[dict], path: Path) -> Path | None:
    """Mean validation accuracy vs learning rate per swept variant (log x)."""
    if not sweeps:
        return None
    tasks = list(dict.fromkeys(_task_name(s["label"]) for s in sweeps))
    fig, axes = _figure(len(tasks))
    for ax, task in zip(axes, tasks):
        for s in sweeps:
            if _task_name(s["label"]) != task:
                continue
            lab = s["label"]
            line = ax.plot(s["lrs"], [100 * v for v in s["val"]], marker="o",
                           label=f"{lab['backbone']} {lab['init']} {lab['finetune']}")
            best = s["lrs"].index(min(s["lrs"], key=lambda v: abs(v - s["best_lr"])))
            ax.scatter([s["lrs"][best]], [100 * s["val"][best]], s=90, facecolors="none",
                       edgecolors=line[0].get_color())
        ax.set_xscale("log")
        ax.set(title=task, xlabel="learning rate", ylabel="mean validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path)
    return path
