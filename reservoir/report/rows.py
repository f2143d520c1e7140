"""A recipe's results as report rows: each run's results files read back and checked, grouped by label (everything
but the seed), and the rows' markdown table beside the paper's numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import check_inside, control_char, read_json
from reservoir.pairs import Scored, markdown_text as _text
from reservoir.readouts.intervals import accuracy_interval, decode_rows
from reservoir.recipes import METRICS, PaperValue, Recipe


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
    settings: dict[str, Any] = field(default_factory=dict)  # its runs' settings but the seed (one per row: recipes)

    @property
    def paper(self) -> PaperValue | None:
        """The paper's test accuracy for this row, if the recipe gives one."""
        return self.papers.get("test_accuracy")

    def more(self, key: str, value: float | None) -> None:
        if value is not None:
            self.extra.setdefault(key, []).append(float(value))

    def scored(self) -> Scored | None:
        """Per-row results summed over seeds, when every seed kept them on one task's test rows."""
        if self.unscored() is not None or not self.per_row:
            return None
        total = np.sum([c for c, _ in self.per_row], axis=0)
        return Scored(self.label, next(iter(self.fingerprints)), total, self.per_row[0][1] * len(self.per_row),
                      self.settings, tuple(sorted(self.seeds)))

    def unscored(self) -> str | None:
        """Why a row whose seeds kept per-row results cannot be compared with another, in a few words; ``None``
        when it can, or when no seed kept them (results written before per-row results were kept)."""
        if not self.per_row:
            return None
        if len(self.per_row) != len(self.accs):
            return f"{len(self.per_row)} of its {len(self.accs)} seeds kept which test rows they got right"
        if len(self.fingerprints) != 1 or len({(len(c), h) for c, h in self.per_row}) != 1:
            return "its seeds were scored on different test rows"
        return None

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
    if isinstance(value, (int, float)) and not 0 <= value <= 1e15:  # (NaN fails it; an int of any size compares)
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
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float's range
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
    rerun: :func:`~reservoir.recipes.state.file_state`), counts as not run; ``outdated`` gets a line for each.
    """
    from reservoir.bench import BenchResult
    from reservoir.readouts import FitResult
    from reservoir.recipes.state import file_state
    from reservoir.training import SweepResult, TrainResult
    from reservoir.training.evaluate import steps_to_converge
    from reservoir.training.sweeps import run_name

    rows: dict[tuple, Row] = {}
    curves, sweeps = [], []

    def add(label: dict[str, Any], acc: float | None = None, seed: int | None = None) -> Row:
        key = tuple(label.items())
        if key not in rows:  # its settings but the seed, once (one per row: recipes refuse two)
            rows[key] = Row(label, settings={k: v for k, v in run.settings().items() if k not in ("seed", "seeds")})
        row = rows[key]
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
                    lrs, vals = _check_sweep(sweep, accs, len(run.cell.seeds), path)
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
                    if _an_interval(pooled):  # sweeps written before intervals have none
                        row.pooled.append(_numbers(pooled, path, "metrics.test_interval"))
                    sweeps.append({"label": label, "lrs": lrs, "val": vals, "best_lr": sweep.best_lr})
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


def _an_interval(value: Any) -> bool:
    """Whether a result's ``test_interval`` (checked when read: :func:`~reservoir.results.check_accuracies`) holds
    one: ``null``, ``[null, null]`` or ``[NaN, NaN]`` is none (no test rows; results written before intervals)."""
    return isinstance(value, list) and not any(v is None or (isinstance(v, float) and math.isnan(v)) for v in value)


def _check_sweep(sweep, accs: list[float], n_seeds: int, path: Path) -> tuple[list[float], list[float]]:
    """A sweep's learning rates and their mean validation accuracies; numbers that do not fit together are one
    line: one test accuracy per seed of the recipe's, a mean validation accuracy in [0, 1] per positive learning
    rate, the best rate among them."""
    if len(accs) != n_seeds:
        raise ReservoirError(f"{path}: expected metrics.test_accuracies to hold one accuracy per seed ({n_seeds}); "
                             f"found {len(accs)}")
    by_lr = sweep.mean_val_by_lr
    lrs = _numbers(by_lr, path, "the keys of mean_val_by_lr", 1)
    vals = _numbers(by_lr.values(), path, "mean_val_by_lr")
    if not all(lr > 0 for lr in lrs) or not all(0 <= v <= 1 for v in vals):
        raise ReservoirError(f"{path}: expected mean_val_by_lr to map learning rates > 0 to accuracies in [0, 1]; "
                             f"found {options.shown(by_lr)}")
    if not any(math.isclose(lr, sweep.best_lr, rel_tol=1e-9) for lr in lrs):
        raise ReservoirError(f"{path}: expected best_lr to be one of the swept rates ({', '.join(map(str, by_lr))}); "
                             f"found {options.shown(sweep.best_lr)}")
    return lrs, vals


def _keep_rows(row: Row, res, path: Path) -> None:
    """A result's 95% interval and per-row results (files written before intervals existed have neither)."""
    interval = res.metrics.get("test_interval")
    if _an_interval(interval):
        row.intervals.append(_numbers(interval, path, "metrics.test_interval"))
    record = (res.rows or {}).get("test") if isinstance(res.rows, dict) else None
    task = res.task if isinstance(res.task, dict) and res.task else \
        res.store.get("task") if isinstance(res.store, dict) else None
    fingerprint = task.get("fingerprint") if isinstance(task, dict) else None
    if record is not None and fingerprint is not None:
        row.per_row.append(decode_rows(record, str(path)))
        row.fingerprints.add(str(fingerprint))


def row_name(label: dict[str, Any]) -> str:
    """A report row in a few words: its label's values, the seed aside.

    Examples
    --------
    >>> row_name({"kind": "fit-linear", "task": "bit-xor", "tag": None, "backbone": "gpt2", "init": "random",
    ...           "layer": 2, "readout": "logistic", "finetune": None, "lr": None})
    'fit-linear bit-xor gpt2 random layer 2 logistic'
    """
    said = [str(label[k]) for k in ("kind", "task", "tag", "backbone", "init") if label.get(k) is not None]
    if label.get("layer") is not None:
        said.append(f"layer {label['layer']}")
    said += [str(label[k]) for k in ("readout", "finetune") if label.get(k) is not None]
    if label.get("lr") is not None:
        said.append(f"lr {label['lr']}")
    return " ".join(said)


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
