"""Recipe files: validation of ``recipes/*.yaml`` (cells, paper values, the recipe) and its expansion into runs
(:mod:`reservoir.recipes.runs`); see :mod:`reservoir.recipes`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import control_char
from reservoir.recipes.runs import MAX_OUTPUTS, MAX_RUNS, Run, expand, n_outputs, n_runs
from reservoir.recipes.values import as_list, check_id, choices, integer, mapping, number, once, takes, unknown_keys

KINDS = ("fit-linear", "train", "fit-raw", "bench")
#: The kinds of run whose report rows measure each paper metric (a benchmark measures no test accuracy).
METRIC_KINDS = {"test_accuracy": ("fit-linear", "train", "fit-raw"), "steps_to_converge": ("train",),
                "speedup": ("bench",)}
TOP_KEYS = ("name", "description", "defaults", "cells", "paper")
COMMON_KEYS = ("kind", "task", "task_params", "seeds", "tag")
KIND_KEYS = {
    "fit-linear": COMMON_KEYS + ("backbone", "init", "layers", "fit_layers", "readout", "dtype", "amp",
                                 "batch_size", "projection"),
    "train": COMMON_KEYS + ("backbone", "init", "layers", "finetune", "lr", "lr_sweep", "steps", "epochs",
                            "batch_size", "eval_every", "dropout", "amp", "projection"),
    "fit-raw": COMMON_KEYS + ("readout",),
    "bench": COMMON_KEYS + ("backbone", "init", "layers", "batch_size", "split_layer", "max_live_rows"),
}
ALL_CELL_KEYS = tuple(dict.fromkeys(k for keys in KIND_KEYS.values() for k in keys))
PAPER_KEYS = ("match", "value", "source", "metric")
#: What a paper entry's ``value`` is: test accuracy in percent (the default), the steps to converge of a
#: train row (Table 6), or the per-epoch speedup of cached over live training of a bench row (Table 10).
METRICS = ("test_accuracy", "steps_to_converge", "speedup")
#: Cell keys whose ``null`` means their default (``steps: null`` with ``epochs``: train by epochs).
NULLABLE = ("steps", "epochs", "batch_size", "split_layer")
#: Deepest store or model a recipe may ask for (the deepest checkpoints have about a hundred blocks).
MAX_DEPTH = 1_000
#: Keys of a report row's label (what ``paper: match:`` may name).
LABEL_KEYS = ("kind", "task", "tag", "backbone", "init", "layer", "readout", "finetune", "lr")


@dataclass
class Cell:
    """One cell of a recipe (defaults merged in), validated on construction."""

    kind: str
    task: list[str]
    where: str = "cells[0]"
    task_params: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    tag: str | None = None
    backbone: list[str] = field(default_factory=lambda: [options.DEFAULT_BACKBONE])
    init: list[str] = field(default_factory=lambda: ["pretrained"])
    layers: list[int | None] = field(default_factory=lambda: [None])
    fit_layers: str | list[int] = "all"
    readout: list[str] = field(default_factory=lambda: ["logistic"])
    dtype: str = "float16"
    amp: str = options.AMP.default
    batch_size: int | None = None
    finetune: list[str] = field(default_factory=lambda: ["fpt"])
    lr: list[float] = field(default_factory=lambda: [1e-3])
    lr_sweep: str | None = None
    steps: int | None = None
    epochs: float | None = None
    eval_every: int = 100
    dropout: float = 0.0
    split_layer: int | None = None
    max_live_rows: int = 1024
    projection: str = options.PROJECTIONS[0]
    #: A data file's ``path`` as the recipe wrote it (``task_params`` holds it resolved): what a run's settings record.
    written_path: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from reservoir.tasks import TASKS
        from reservoir.tasks.base import check_params
        from reservoir.training import BOUNDS, check_number, parse_lr_sweep
        from reservoir.training.freeze import parse_groups

        w = self.where
        choices([self.kind], KINDS, "kind", w)
        self.task = [str(t) for t in as_list(self.task)]
        if not self.task or not all(self.task):
            raise ReservoirError(f"{w} needs a task (e.g. task: bit-xor)")
        self.task_params = mapping(self.task_params, f"task_params in {w}")
        self.seeds = [integer(s, f"seeds in {w}") for s in as_list(self.seeds)]
        for axis in ("backbone", "finetune"):
            if any(v is None for v in as_list(getattr(self, axis))):
                raise ReservoirError(f"{axis} in {w}: expected a value, found null")
        self.backbone = [str(b) for b in as_list(self.backbone)]
        self.finetune = [str(f) for f in as_list(self.finetune)]
        self.tag = None if self.tag is None else check_id(self.tag, f"tag in {w}")
        self.init = choices(as_list(self.init), options.INITS, "init", w)
        self.readout = choices(as_list(self.readout), options.READOUTS, "readout", w)
        once(self.readout, "readout", w)
        choices([self.dtype], options.DTYPES, "dtype", w)
        choices([self.amp], options.AMPS, "amp", w)
        choices([self.projection], options.PROJECTIONS, "projection", w)
        self.layers = [None if v in (None, "all") else integer(v, f"layers in {w}")
                       for v in as_list(self.layers)]
        self.lr = [number(v, f"lr in {w}") for v in as_list(self.lr)]
        for axis in ("seeds", "backbone", "init", "readout", "layers", "finetune", "lr"):
            if not getattr(self, axis):
                raise ReservoirError(f"{axis} in {w}: expected at least one value, found an empty list")
        for name, key, values in (("seed", "seeds", self.seeds), ("layers", "layers", self.layers),
                                  ("lr", "lr", self.lr)):
            for v in values:  # the bounds `reservoir train` checks, named by the recipe's key
                check_number(name, v, f"{key} in {w}")
                if name == "layers" and v is not None and v > MAX_DEPTH:
                    raise ReservoirError(f"layers in {w} must be a depth of at most {MAX_DEPTH:,}, found "
                                         f"{v if v < 10**12 else f'a number of {len(str(v)):,} digits'}")
        self._check_backbones()
        if self.kind == "bench" and (len(self.layers) != 1 or self.layers[0] == 0):
            raise ReservoirError(f"layers in {w} must be one depth of at least 1 for bench (its split-point part "
                                 f"trains the top block), found {self.layers}")
        if self.kind == "fit-linear":
            if len(self.layers) != 1 or self.layers[0] is None:
                found = "none given" if self.layers == [None] else str(self.layers)
                raise ReservoirError(f"layers in {w} must be one store depth K for fit-linear (choose the fitted "
                                     f"layers with fit_layers), found {found}")
            if self.fit_layers != "all":
                self.fit_layers = [integer(v, f"fit_layers in {w}") for v in as_list(self.fit_layers)]
                once(self.fit_layers, "fit_layers", w)
                if any(not 0 <= k <= self.layers[0] for k in self.fit_layers):
                    raise ReservoirError(f"fit_layers in {w} must be within 0..{self.layers[0]}, found "
                                         f"{self.fit_layers}")
            if not self.fit_layers:
                raise ReservoirError(f"fit_layers in {w}: expected 'all' or at least one layer, found "
                                     f"{self.fit_layers!r}")
        for name, whole in (("steps", True), ("batch_size", True), ("eval_every", True), ("epochs", False),
                              ("dropout", False), ("split_layer", True), ("max_live_rows", True)):
            if getattr(self, name) is None:
                if name not in NULLABLE:
                    raise ReservoirError(f"{name} in {w} must be a number, found null (leave the key out for its "
                                         "default)")
                continue  # None: the default
            setattr(self, name, number(getattr(self, name), f"{name} in {w}", whole))
            if name in BOUNDS:
                check_number(name, getattr(self, name), f"{name} in {w}")
        if self.kind == "bench" and self.split_layer is not None and self.layers[0] is not None \
                and not 0 <= self.split_layer < self.layers[0]:
            raise ReservoirError(f"split_layer in {w} must be within 0..{self.layers[0] - 1} (below the depth "
                                 f"{self.layers[0]}), found {self.split_layer}")
        if self.max_live_rows < 1:
            raise ReservoirError(f"max_live_rows in {w} must be an integer >= 1, found {self.max_live_rows}")
        trained: dict[tuple[str, ...], str] = {}
        for f in self.finetune if self.kind == "train" else ():
            try:
                groups = parse_groups(f)
            except ReservoirError as err:
                raise ReservoirError(f"finetune in {w}: {err}") from None
            if groups in trained:  # two spellings of one run: its work and its report row twice
                raise ReservoirError(f"finetune in {w}: expected each set of groups once; found {f!r}, which "
                                     f"trains what {trained[groups]!r} does")
            trained[groups] = f
        if self.lr_sweep is not None:
            parse_lr_sweep(str(self.lr_sweep))
            if self.seeds != list(range(self.seeds[0], self.seeds[0] + len(self.seeds))):
                raise ReservoirError(f"an lr_sweep in {w} runs consecutive seeds; found seeds {self.seeds}")
        for t in choices(self.task, tuple(sorted(TASKS)), "task", w):
            bad = next((k for k in self.task_params if k not in TASKS[t].defaults), None)
            if bad is not None:
                raise ReservoirError(f"task_params in {w}: task {t!r} has no parameter {bad!r}; expected one of: "
                                     f"{', '.join(sorted(TASKS[t].defaults))}")
            try:  # every value as the task's builder checks it, before anything runs (no file read)
                check_params(t, self.task_params)
            except ReservoirError as err:
                raise ReservoirError(f"task_params in {w}: {err}") from None
            if self.task_params.get("download") and self.task_params.get("data_dir") is not None:
                raise ReservoirError(f"task_params in {w}: expected download only into the data cache (leave "
                                     f"data_dir out), found download with data_dir {self.task_params['data_dir']!r}; "
                                     f"a recipe writes nowhere else")
            if t == "data" and not self.task_params.get("path"):
                raise ReservoirError(f"task_params in {w}: task 'data' needs path, the data file (relative to the "
                                     f"recipe's folder); found {self.task_params!r}")

    def _check_backbones(self) -> None:
        """What can be known of each backbone without loading it: an LSTM has no pretrained weights, and a built-in
        backbone's depth bounds ``layers`` (a folder's or a hub model's is checked when it loads)."""
        from reservoir.backbones.names import builtin_layers, lstm_spec

        for bb in self.backbone:
            try:
                lstm = lstm_spec(bb) is not None
            except ReservoirError as err:
                raise ReservoirError(f"backbone in {self.where}: {err}") from None
            if lstm and self.kind != "fit-raw" and self.init != ["random"]:
                raise ReservoirError(f"init in {self.where}: backbone {bb!r} has no pretrained weights; expected "
                                     f"init: random, found {self.init}")
            n = builtin_layers(bb)
            deepest = max((k for k in self.layers if k is not None), default=0)
            if n is not None and self.kind != "fit-raw" and deepest > n:
                raise ReservoirError(f"layers in {self.where} must be within 1..{n} for backbone {bb!r} ({n} "
                                     f"blocks), found {deepest}")

    @classmethod
    def from_dict(cls, raw: Any, defaults: dict[str, Any], where: str) -> Cell:
        if not isinstance(raw, dict):
            raise ReservoirError(f"{where} must be a mapping, found {raw!r}")
        if "kind" not in raw:
            raise ReservoirError(f"{where} needs a kind; expected one of: {', '.join(KINDS)}")
        kind = raw["kind"]
        if kind not in KINDS:
            raise ReservoirError(f"unknown kind {kind!r} in {where}; expected one of: {', '.join(KINDS)}")
        allowed = KIND_KEYS[kind]
        unknown_keys(raw, allowed, f"{where} (kind {kind})")
        merged = {k: v for k, v in defaults.items() if k in allowed}
        if raw.keys() & {"steps", "epochs"}:  # a cell's own length replaces the defaults' (steps or epochs)
            merged.pop("steps", None), merged.pop("epochs", None)
        merged.update(raw)
        if "lr" in raw and merged.get("lr_sweep") is not None:  # the CLI refuses --lr with --lr-sweep alike
            raise ReservoirError(f"{where}: expected lr or lr_sweep, not both (the sweep chooses the rate); found lr "
                                 f"{raw['lr']!r} and lr_sweep {merged['lr_sweep']!r}")
        if "task" not in merged:
            raise ReservoirError(f"{where} needs a task (e.g. task: bit-xor)")
        bad = next((t for t in as_list(merged["task"]) if not isinstance(t, str)), None)
        if bad is not None:
            raise ReservoirError(f"task in {where}: expected a task name or a list of them, found {bad!r}")
        if merged.get("steps") is not None and merged.get("epochs") is not None:
            source = "" if raw.keys() >= {"steps", "epochs"} else " (with defaults)"
            raise ReservoirError(f"{where}{source}: expected steps or epochs, found both (steps "
                                 f"{merged['steps']!r}, epochs {merged['epochs']!r})")
        shared = mapping(defaults.get("task_params"), "task_params in defaults")
        own = mapping(raw.get("task_params"), f"task_params in {where}")
        tasks = as_list(merged["task"])
        for key in shared.keys() - own.keys():  # one task_params serves the cell's every task: a default for some
            takers = [t for t in tasks if takes(t, key)]  # of them only would change what the others build
            if takers and len(takers) < len(tasks):
                others = [t for t in tasks if t not in takers]
                raise ReservoirError(f"task_params {key!r} in defaults: expected a parameter every task of {where} "
                                     f"takes, or none; found it taken by {', '.join(takers)}, not by "
                                     f"{', '.join(others)} (split the cell by task)")
        merged["task_params"] = {**{k: v for k, v in shared.items() if takes(merged["task"], k)}, **own}
        return cls(where=where, **merged)


@dataclass
class PaperValue:
    """A number from a paper (percent) for the rows whose label matches ``match``."""

    match: dict[str, Any]
    value: float
    source: str = ""
    metric: str = "test_accuracy"
    where: str = "paper[0]"

    def __post_init__(self) -> None:
        if not isinstance(self.match, dict) or not self.match:
            raise ReservoirError(f"{self.where}.match must be a non-empty mapping, found {self.match!r}")
        unknown_keys(self.match, LABEL_KEYS, f"{self.where}.match")
        self.value = number(self.value, f"{self.where}.value")
        self.source = str(self.source or "")
        choices([self.metric], METRICS, "metric", self.where)
        lo, hi, what = {"test_accuracy": (0, 100, "a percentage in [0, 100]"),
                        "steps_to_converge": (0, 1e12, "a number of steps in [0, 1e12]"),
                        "speedup": (0, 1e12, "a ratio in (0, 1e12]")}[self.metric]
        if not (lo <= self.value <= hi) or (self.metric == "speedup" and self.value == 0):
            raise ReservoirError(f"{self.where}.value: expected {what} for {self.metric}, found {self.value:g}")
        if any(control_char(c) for c in self.source):
            raise ReservoirError(f"{self.where}.source: expected one line of text, found control characters in "
                                 f"{options.shown(self.source)}")

    def format(self) -> str:
        """The value as the report prints it (``38.4%``, ``500 steps``, ``500x``)."""
        return {"test_accuracy": f"{self.value:g}%", "steps_to_converge": f"{self.value:g} steps",
                "speedup": f"{self.value:g}x"}[self.metric]

    def matches(self, label: dict[str, Any]) -> bool:
        return all(_same(label.get(k), v) for k, v in self.match.items())

    def fits(self, label: dict[str, Any]) -> bool:
        """Whether the entry belongs beside the report row ``label``: its ``match`` fits and the row's kind measures
        the entry's metric (steps to converge only beside trainings, a speedup only beside benchmarks)."""
        return label.get("kind") in METRIC_KINDS[self.metric] and self.matches(label)


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


@dataclass
class Recipe:
    """A validated recipe; :meth:`runs` expands it."""

    name: str
    cells: list[Cell]
    description: str = ""
    paper: list[PaperValue] = field(default_factory=list)
    path: Path | None = None
    text: str = ""  # the file as written (kept for the copy in the results folder)
    folder: Path | None = None  # where its relative data paths were taken from (what the results folder records)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<recipe>", text: str = "", folder: Path | None = None) -> Recipe:
        """A validated recipe from parsed YAML; a relative data ``path`` in task_params is taken from ``folder``
        (the recipe file's folder; default the working directory) and kept absolute."""
        try:
            if not isinstance(data, dict):
                raise ReservoirError(f"expected a mapping at the top level, found {type(data).__name__}")
            unknown_keys(data, TOP_KEYS, "the top level")
            defaults = data.get("defaults") or {}
            if not isinstance(defaults, dict):
                raise ReservoirError(f"defaults must be a mapping, found {defaults!r}")
            unknown_keys(defaults, tuple(k for k in ALL_CELL_KEYS if k != "kind"), "defaults")
            cells_raw = data.get("cells")
            if not isinstance(cells_raw, list) or not cells_raw:
                raise ReservoirError("expected a non-empty list under 'cells'")
            cells = [Cell.from_dict(c, defaults, f"cells[{i}]") for i, c in enumerate(cells_raw)]
            _check_defaults_used(defaults)
            for cell in cells:  # a data file beside the recipe, wherever it is run from
                path = cell.task_params.get("path")
                if "data" in cell.task and isinstance(path, str) and path:
                    cell.written_path = path
                    cell.task_params["path"] = str((Path(folder or ".") / os.path.expanduser(path)).resolve())
            paper = []
            if not isinstance(data.get("paper") or [], list):
                raise ReservoirError(f"paper must be a list of entries, found {data['paper']!r}")
            for i, p in enumerate(data.get("paper") or []):
                if not isinstance(p, dict):
                    raise ReservoirError(f"paper[{i}] must be a mapping, found {p!r}")
                unknown_keys(p, PAPER_KEYS, f"paper[{i}]")
                if "match" not in p or "value" not in p:
                    raise ReservoirError(f"paper[{i}] needs 'match' and 'value'")
                paper.append(PaperValue(where=f"paper[{i}]", **p))
            given = data.get("name") not in (None, "")
            what = "name" if given else "name (the file's stem; set name: in the recipe)"
            name = check_id(data["name"] if given else Path(source).stem, what)
            description = str(data.get("description") or "").strip()
            if any(control_char(c) and c not in "\n\t" for c in description):  # a terminal's escapes, say
                raise ReservoirError(f"description: expected text, found control characters in "
                                     f"{options.shown(description)}")
            recipe = cls(name=name, cells=cells, description=description, paper=paper, text=text, raw=data,
                         folder=Path(folder or ".").resolve())
            runs = recipe.runs()  # id collisions are a recipe error
            recipe._check_rows(runs)
            labels = [label for run in runs for label, _ in run.outputs()]
            for p in paper:  # an entry that fits no row is a typo, not a number to drop silently
                if not any(p.fits(lab) for lab in labels):
                    what = "run" if p.metric == "test_accuracy" else f"{METRIC_KINDS[p.metric][0]} run"
                    raise ReservoirError(f"{p.where}.match {p.match} fits no {what} of this recipe")
            return recipe
        except ReservoirError as err:
            raise ReservoirError(f"recipe {source}: {err}") from None

    def runs(self) -> list[Run]:
        """Every concrete run, in recipe order; ids are unique."""
        total = sum(n_runs(cell) for cell in self.cells)
        if total > MAX_RUNS:
            raise ReservoirError(f"expected at most {MAX_RUNS:,} runs, found a grid of {total:,}; split the recipe")
        files = sum(n_outputs(cell) for cell in self.cells)
        if files > MAX_OUTPUTS:
            raise ReservoirError(f"expected at most {MAX_OUTPUTS:,} results files (runs x readouts x fitted "
                                 f"layers), found a grid of {files:,}; split the recipe or fit fewer layers")
        runs: list[Run] = []
        for cell in self.cells:
            runs.extend(expand(cell))
        seen: dict[str, str] = {}
        for r in runs:
            if len(r.id.encode()) > 255:
                raise ReservoirError(f"{r.cell.where}: run id {r.id[:60]}... is {len(r.id.encode())} bytes, longer "
                                     "than a folder name may be (255); shorten its tag, backbone or values")
            if r.id in seen:
                advice = ("give one a 'tag'" if seen[r.id] != r.cell.where else
                          "two of its values give one id (a value listed twice, or lrs equal to 6 digits)")
                raise ReservoirError(f"{r.cell.where} and {seen[r.id]} both give run {r.id!r}; {advice}")
            seen[r.id] = r.cell.where
        return runs

    def _check_rows(self, runs: list[Run]) -> None:
        """Refuse runs that differ in more than their seed but feed one report row (which would average them as if
        they were seeds): two fit-linear depths, two sweep ranges, two dtypes of one task without a tag."""
        from reservoir.settings import describe_difference, first_difference

        seen: dict[str, tuple[str, dict[str, Any]]] = {}
        for run in runs:
            base = {k: v for k, v in run.settings().items() if k not in ("seed", "seeds")}
            for label, _ in run.outputs():
                key = json.dumps(label, sort_keys=True, default=str)
                where, first = seen.setdefault(key, (run.cell.where, base))
                diff = first_difference(first, base)
                if diff is not None:
                    raise ReservoirError(f"{where} and {run.cell.where} feed one report row ({key}) from runs of "
                                         f"other settings ({describe_difference(diff)}); give one a 'tag'")

    def paper_value(self, label: dict[str, Any], metric: str = "test_accuracy") -> PaperValue | None:
        """The first paper entry for ``metric`` whose ``match`` fits ``label``."""
        return next((p for p in self.paper if p.metric == metric and p.fits(label)), None)


def _check_defaults_used(defaults: dict[str, Any]) -> None:
    """Refuse (one line) a task parameter in ``defaults`` that no task takes (a misspelling): defaults apply only
    to the cells whose tasks take them, so it would be dropped without a word, and every run made without it."""
    from reservoir.tasks import TASKS

    for key in mapping(defaults.get("task_params"), "task_params in defaults"):
        if not any(key in task.defaults for task in TASKS.values()):
            raise ReservoirError(f"task_params in defaults: no task has a parameter {key!r}; expected one of: "
                                 f"{', '.join(sorted({k for t in TASKS.values() for k in t.defaults}))}")
