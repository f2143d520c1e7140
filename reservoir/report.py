"""``reservoir report``: a recipe's results as a markdown table beside the paper's numbers, plus plots.

The results folder written by :func:`reservoir.recipes.run_recipe` holds the
recipe (``recipe.yaml``) and one folder per run. The recipe is expanded again
to find each run's result files; runs are grouped into rows by their label
(task, tag, backbone, init, layer, readout or finetune and lr: everything but
the seed). A row shows the test accuracy (mean ± population std over seeds
when there are several; an lr sweep's row is its chosen lr's test accuracy
over the sweep's seeds), the number of seeds, and the first ``paper:`` entry of
the recipe whose ``match`` fits the row's label.

Plots (matplotlib, Agg, no pyplot state): ``depth.png`` test accuracy vs layer
per task, one line per backbone/init/readout, when fit-linear results span more
than one layer (paper values as crosses); ``curves.png`` validation accuracy vs
step of every train run; ``lr_sweep.png`` mean validation accuracy vs lr per
swept variant (log x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import atomic_write, check_inside, check_name, control_char, read_json, save_figure
from reservoir.pairs import Scored, compare, markdown_pairs, markdown_text as _text
from reservoir.readouts.intervals import accuracy_interval, decode_rows
from reservoir.recipes import METRICS, PaperValue, Recipe, load_recipe


@dataclass
class Row:
    """One table row: a label and the accuracies of its seeds."""

    label: dict[str, Any]
    accs: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    best_lr: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)  # steps_to_converge, speedup, layernorm_speedup
    papers: dict[str, PaperValue] = field(default_factory=dict)  # by metric
    intervals: list[list[float]] = field(default_factory=list)  # each seed's 95% test interval, when recorded
    pooled: list[list[float]] = field(default_factory=list)  # an lr sweep's interval of its seeds' mean, when recorded
    per_row: list[tuple[np.ndarray, int]] = field(default_factory=list)  # each seed's correct heads per test row
    fingerprints: set[str] = field(default_factory=set)  # the task(s) whose test rows were scored
    unsettled: int = 0  # train seeds whose last validation ended more than 1 point below their best
    expected: int = 0  # seeds the recipe asks of this row

    @property
    def paper(self) -> PaperValue | None:
        """The paper's test accuracy for this row, if the recipe gives one."""
        return self.papers.get("test_accuracy")

    def more(self, key: str, value: float | None) -> None:
        if value is not None:
            self.extra.setdefault(key, []).append(float(value))

    def scored(self) -> Scored | None:
        """Per-row results summed over seeds, when every seed kept them on one task's test rows."""
        if not self.per_row or len(self.per_row) != len(self.accs) or len(self.fingerprints) != 1:
            return None
        if len({(len(c), h) for c, h in self.per_row}) != 1:
            return None
        total = np.sum([c for c, _ in self.per_row], axis=0)
        return Scored(self.label, next(iter(self.fingerprints)), total, self.per_row[0][1] * len(self.per_row))

    def interval(self) -> list[float] | None:
        """The 95% interval of the row's test accuracy (of the mean over seeds: rows resampled, seeds summed)."""
        if len(self.accs) == 1 and self.intervals:
            return self.intervals[0]
        scored = self.scored()
        if scored is None:  # an lr sweep's own interval of the mean over its seeds (its runs' rows not all found)
            return self.pooled[0] if len(self.pooled) == 1 else None
        return list(accuracy_interval(scored.correct, scored.heads))

    @property
    def mean(self) -> float:
        return float(np.mean(self.accs)) if self.accs else float("nan")

    @property
    def std(self) -> float:
        return float(np.std(self.accs)) if self.accs else float("nan")


@dataclass
class Report:
    """The rendered markdown and every file written (``report.md`` first)."""

    markdown: str
    files: list[Path]
    rows: list[Row]
    comparisons: list = field(default_factory=list)

    def __str__(self) -> str:
        return self.markdown


def _load(path: Path) -> dict[str, Any] | None:
    """The results JSON object at ``path``, ``None`` when the run has none yet; anything else is one line."""
    if not path.is_file():
        return None
    res = read_json(path, "a results JSON object")
    if not isinstance(res, dict):
        raise ReservoirError(f"{path}: expected a results JSON object; found a JSON {type(res).__name__}")
    return res


def _typed(cls, res: dict[str, Any], path: Path):
    """The typed result (:class:`~reservoir.results.Result`) a results file holds; a file it refuses is one line."""
    try:
        return cls.from_dict(res)
    except ReservoirError as err:
        raise ReservoirError(f"{path}: {err}") from None


def _field(res: dict[str, Any], path: Path, dotted: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    """``res["a"]["b"]`` for ``dotted="a.b"``, checked to be ``kind``; a missing or mistyped field is one line."""
    value: Any = res
    for depth, key in enumerate(dotted.split(".")):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(dotted.split(".")[:depth]) or "the top level"
            raise ReservoirError(f"{path}: expected a results JSON with {dotted}; found no {key!r} in {where}")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ReservoirError(f"{path}: expected {dotted} to be {names}; found {type(value).__name__} {value!r:.40}")
    if isinstance(value, (int, float)) and not (math.isfinite(value) and 0 <= value <= 1e15):
        # accuracies, steps, learning rates, speedups: none is negative, none astronomic
        raise ReservoirError(f"{path}: expected {dotted} to be a number in [0, 1e15]; found {options.shown(value)}")
    return value


def _numbers(values, path: Path, what: str, at_least: int = 0) -> list[float]:
    """``values`` as floats, at least ``at_least`` of them; anything but finite numbers is one line naming the file
    and ``what``."""
    values = list(values)
    try:
        if not any(isinstance(v, bool) for v in values):
            numbers = [float(v) for v in values]
            if len(numbers) >= at_least and all(math.isfinite(v) for v in numbers):
                return numbers
    except (TypeError, ValueError):
        pass
    some = f"at least {at_least} " if at_least else ""
    raise ReservoirError(f"{path}: expected {what} to hold {some}finite numbers; found {values!r:.60}")


def _curve(res: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """A train result's validation curve: a list of ``{"step": ..., "val_accuracy": ...}``, checked."""
    curve = _field(res, path, "curve", list)
    for point in curve:
        values = [point.get(k) for k in ("step", "val_accuracy")] if isinstance(point, dict) else [None]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e15 for v in values):
            raise ReservoirError(f"{path}: expected curve to be a list of {{step, val_accuracy}} numbers >= 0; "
                                 f"found an entry {point!r:.60}")
    return curve


def collect(results_dir: Path, recipe: Recipe,
            outdated: list[str] | None = None) -> tuple[list[Row], list[dict], list[dict]]:
    """Rows (in recipe order), train curves and lr sweeps found under ``results_dir``.

    A results file of another run, or of this run with settings other than the recipe's (an edited recipe not yet
    rerun: :func:`~reservoir.recipes.runner.file_state`), counts as not run; ``outdated`` gets a line for each.
    """
    from reservoir.bench import BenchResult
    from reservoir.readouts import FitResult
    from reservoir.recipes.runner import file_state
    from reservoir.training import SweepResult, TrainResult
    from reservoir.training.loop import steps_to_converge
    from reservoir.training.sweeps import run_name

    rows: dict[tuple, Row] = {}
    curves, sweeps = [], []

    def add(label: dict[str, Any], acc: float | None = None, seed: int | None = None) -> Row:
        key = tuple(label.items())
        row = rows.setdefault(key, Row(label))
        row.expected += len(run.cell.seeds) if run.cell.lr_sweep else 1
        if acc is not None:
            row.accs.append(float(acc))
            row.seeds.append(seed)
        return row

    for run in recipe.runs():
        for label, name in run.outputs():
            path = results_dir / run.id / name
            check_inside(path, results_dir, "results files")
            state, why = file_state(run, path, read_data=False)  # nothing outside the results folder is read
            if state in ("foreign", "stale") and outdated is not None:
                outdated.append(f"{run.id}/{name} ({why})")
            res = None if state in ("foreign", "stale") else _load(path)
            if run.kind == "bench":
                row = add(label)
                if res is not None:
                    _field(res, path, "output_only.speedup"), _field(res, path, "layernorm_top.speedup")
                    bench = _typed(BenchResult, res, path)
                    row.seeds.append(run.seed)
                    row.more("speedup", bench["output_only"]["speedup"])
                    row.more("layernorm_speedup", bench["layernorm_top"]["speedup"])
            elif run.cell.lr_sweep:
                row = add(label)
                if res is not None:
                    accs = _numbers(_field(res, path, "metrics.test_accuracies", list), path, "metrics.test_accuracies")
                    _field(res, path, "best_lr"), _field(res, path, "mean_val_by_lr", dict)
                    sweep = _typed(SweepResult, res, path)
                    row.accs += accs
                    row.seeds += list(range(run.seed, run.seed + len(accs)))
                    row.best_lr.append(sweep.best_lr)
                    for s in range(run.seed, run.seed + len(accs)):  # the chosen lr's runs: their test rows
                        seed_path = path.parent / run_name(sweep.best_lr, s) / "results.json"
                        check_inside(seed_path, results_dir, "results files")
                        seed_res = _load(seed_path)
                        if seed_res is not None:
                            _keep_rows(row, _typed(TrainResult, seed_res, seed_path), seed_path)
                    pooled = sweep.metrics.get("test_interval")
                    if pooled is not None and None not in pooled:  # sweeps written before intervals have none
                        row.pooled.append(_numbers(pooled, path, "metrics.test_interval"))
                    by_lr = sweep.mean_val_by_lr
                    sweeps.append({"label": label, "lrs": _numbers(by_lr, path, "the keys of mean_val_by_lr", 1),
                                   "val": _numbers(by_lr.values(), path, "mean_val_by_lr"), "best_lr": sweep.best_lr})
            else:  # fit-linear, fit-raw, train: one test accuracy per seed
                if res is not None:
                    _field(res, path, "metrics.test_accuracy")
                    res = _typed(TrainResult if run.kind == "train" else FitResult, res, path)
                row = add(label, None if res is None else res.metrics["test_accuracy"], run.seed)
                if res is not None:
                    _keep_rows(row, res, path)
                if run.kind == "train" and res is not None:
                    if res.curve:  # from the curve: one definition, whichever version wrote the file
                        curve = _curve(res.to_dict(), path)
                        curves.append({"label": label, "seed": run.seed, "curve": curve})
                        settled = steps_to_converge(curve)
                        row.more("steps_to_converge", settled)
                        row.unsettled += settled is None
                    elif res.metrics.get("steps_to_converge") is not None:
                        row.more("steps_to_converge", _field(res.metrics, path, "steps_to_converge"))
    out = list(rows.values())
    for row in out:
        row.papers = {m: p for m in METRICS if (p := recipe.paper_value(row.label, m)) is not None}
    return out, curves, sweeps


def _keep_rows(row: Row, res, path: Path) -> None:
    """A result's 95% interval and per-row results (files written before intervals existed have neither)."""
    interval = res.metrics.get("test_interval")
    if interval is not None and None not in interval:  # null: no interval (no test rows)
        row.intervals.append(_numbers(interval, path, "metrics.test_interval"))
    record = (res.rows or {}).get("test") if isinstance(res.rows, dict) else None
    task = res.task if isinstance(res.task, dict) and res.task else \
        res.store.get("task") if isinstance(res.store, dict) else None
    fingerprint = task.get("fingerprint") if isinstance(task, dict) else None
    if record is not None and fingerprint is not None:
        row.per_row.append(decode_rows(record, str(path)))
        row.fingerprints.add(str(fingerprint))


def _setting(label: dict[str, Any], row: Row) -> str:
    kind = label["kind"]
    if kind == "fit-linear":
        return f"linear readout ({label['readout']})"
    if kind == "fit-raw":
        return f"raw inputs, {label['readout']}"
    if kind == "bench":
        return "cached vs live training, per epoch"
    if label["lr"] == "sweep":
        best = f", best {row.best_lr[0]:.1e}" if len(set(row.best_lr)) == 1 else ""
        return f"train {label['finetune']}, lr sweep{best}"
    return f"train {label['finetune']}, lr {label['lr']:g}"


def _pct(row: Row) -> str:
    if row.label["kind"] == "bench":
        return "—" if row.seeds else "not run"
    if not row.accs:
        return "not run"
    ci = row.interval()
    within = "" if ci is None else f" [{100 * ci[0]:.2f}, {100 * ci[1]:.2f}]"
    if len(row.accs) == 1:
        return f"{100 * row.mean:.2f}%{within}"
    return f"{100 * row.mean:.2f} ± {100 * row.std:.2f}%{within}"


def _measured(row: Row) -> str:
    """What a row measured besides test accuracy (means over seeds)."""
    ex = {k: float(np.mean(v)) for k, v in row.extra.items()}
    if "speedup" in ex:
        return (f"{ex['speedup']:.0f}x faster cached (output only); "
                f"{ex.get('layernorm_speedup', float('nan')):.1f}x from a split-point store (top layernorm)")
    said = []
    if "steps_to_converge" in ex:
        n = len(row.extra["steps_to_converge"])
        of = f" (mean of {n} seeds)" if n > 1 else ""
        said.append(f"within 1 point of best from step {ex['steps_to_converge']:.0f}{of}")
    if row.unsettled:
        said.append("last validation more than 1 point below its best" if len(row.seeds) == 1 else
                    f"{row.unsettled} of {len(row.seeds)} seeds ended more than 1 point below their best")
    return "; ".join(said)


def _cell(text: str) -> str:
    """A Markdown table cell: ``|`` escaped, line breaks and other control characters as spaces (one row a
    line)."""
    return "".join(" " if control_char(c) else c for c in text).replace("|", "\\|")


def markdown_table(rows: list[Row]) -> str:
    """The results table (one line per row)."""
    head = ["task", "backbone", "init", "layer", "setting", "test accuracy", "seeds", "also measured", "paper",
            "paper source"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        lab = row.label
        task = lab["task"] + (f" ({lab['tag']})" if lab.get("tag") else "")
        layer = "—" if lab["layer"] is None else str(lab["layer"])
        papers = [row.papers[m] for m in METRICS if m in row.papers]
        seeds = str(len(row.seeds)) + (f" of {row.expected}" if len(row.seeds) < row.expected else "")
        cells = [_text(task), _text(lab["backbone"] or "—"), lab["init"] or "—", layer,
                 _setting(lab, row), _pct(row), seeds, _measured(row) or "—",
                 " · ".join(p.format() for p in papers) or "—",
                 _text("; ".join(dict.fromkeys(p.source for p in papers)))]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


# -- plots -----------------------------------------------------------------------
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


def plot_depth(rows: list[Row], path: Path) -> Path | None:
    """Test accuracy vs layer (bars: 95% intervals), one panel per task, one line per backbone/init/readout."""
    from matplotlib.ticker import MaxNLocator

    fl = [r for r in rows if r.label["kind"] == "fit-linear" and r.accs]
    # a panel per task whose readouts span several layers (a single depth is a table row, not a curve)
    tasks = [t for t in dict.fromkeys(_task_name(r.label) for r in fl)
             if len({r.label["layer"] for r in fl if _task_name(r.label) == t}) > 1]
    if not tasks:
        return None
    fig, axes = _figure(len(tasks))
    for ax, task in zip(axes, tasks):
        lines: dict[tuple, list[Row]] = {}
        for r in fl:
            if _task_name(r.label) == task:
                lines.setdefault((r.label["backbone"], r.label["init"], r.label["readout"]), []).append(r)
        colours: dict[tuple, str] = {}
        styles = {"pretrained": "-", "random": "--", "stats": ":"}
        for (bb, init, readout), rs in lines.items():
            rs = sorted(rs, key=lambda r: r.label["layer"])
            x = [r.label["layer"] for r in rs]
            colour = colours.setdefault((bb, init, readout), f"C{len(colours) % 10}")
            ax.errorbar(x, [100 * r.mean for r in rs], yerr=_error_bars(rs), marker="o", capsize=3,
                        color=colour, linestyle=styles.get(init, "-"),
                        label=f"{bb} {init}" + ("" if readout == "logistic" else f" ({readout})"))
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


def report(results_dir: str | Path, plots: bool = True) -> Report:
    """Render ``results_dir`` (a ``reservoir recipe run`` output): write ``report.md`` and the PNGs.

    Examples
    --------
    >>> r = report("results/quickstart")  # doctest: +SKIP
    >>> print(r.markdown); print(r.files)  # doctest: +SKIP
    """
    d = Path(results_dir)
    check_name(d)
    if not d.is_dir():
        raise ReservoirError(f"{d}: expected a results folder (written by `reservoir recipe run`), found "
                             f"{'a file' if d.exists() else 'no such folder'}")
    if not (d / "recipe.yaml").is_file():
        raise ReservoirError(f"{d}: expected a results folder with recipe.yaml (written by `reservoir recipe run`), "
                             "found none")
    check_inside(d / "recipe.yaml", d, "the recipe's copy")
    from reservoir.recipes.runner import recipe_folder

    recipe = load_recipe(d / "recipe.yaml", folder=recipe_folder(d))  # relative data paths as the run took them
    outdated: list[str] = []
    rows, curves, sweeps = collect(d, recipe, outdated)
    figures = []
    if plots:
        for fn, data, name in ((plot_depth, rows, "depth.png"), (plot_curves, curves, "curves.png"),
                               (plot_sweeps, sweeps, "lr_sweep.png")):
            written = fn(data, d / name)
            if written is not None:
                figures.append(written)
            elif (d / name).is_file() or (d / name).is_symlink():  # an earlier render's figure of rows gone since
                (d / name).unlink()
    parts = [f"# {recipe.name}", ""]
    if recipe.description:  # as text: a table, a link or HTML in it is shown, not rendered
        parts += [_text(recipe.description).replace("|", "\\|"), ""]
    note = ("Test accuracy on the full test split with its 95% interval over the test rows; with several seeds, "
            "mean ± std (population) over seeds and the interval of that mean. Paper values are from the recipe's "
            "`paper:` entries.")
    parts += [markdown_table(rows), "", note, ""]
    if outdated:
        parts += [f"**Not current:** {len(outdated)} results file(s) hold another run's results, or this recipe's "
                  "with other settings (the recipe was edited since), and show as not run; `reservoir recipe run` "
                  f"redoes them. First: {_text(outdated[0])}.", ""]
    unpaired: list[str] = []
    comparisons = compare([sc for r in rows if (sc := r.scored()) is not None], unpaired)
    if comparisons:
        parts += ["## Paired differences", "",
                  "Rows scored on the same test rows: pretrained against each other init, each layer against "
                  "the one below, and training everything against the FPT groups, in points of test accuracy "
                  "with the 95% paired bootstrap interval over test rows; "
                  "`yes` where the interval excludes zero.", "", markdown_pairs(comparisons), ""]
    if unpaired:
        parts += [f"Not compared: {len(unpaired)} pair(s) of rows on the same test rows but with different numbers "
                  f"of seeds, e.g. {_text(unpaired[0])}; give both rows the same seeds to compare them.", ""]
    parts += [f"![{p.stem}]({p.name})" for p in figures]
    md = "\n".join(parts).rstrip() + "\n"
    with atomic_write(d / "report.md", "the report", text=True) as f:
        f.write(md)
    return Report(md, [d / "report.md", *figures], rows, comparisons)
