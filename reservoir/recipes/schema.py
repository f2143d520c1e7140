"""Recipe files: validation of ``recipes/*.yaml`` and expansion of cells into runs (see :mod:`reservoir.recipes`)."""


from __future__ import annotations

import decimal
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import control_char
from reservoir.settings import slug

KINDS = ("fit-linear", "train", "fit-raw", "bench")
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
#: Most runs one recipe may expand to (the bundled recipes have a few hundred at most).
MAX_RUNS = 10_000
#: Deepest store or model a recipe may ask for (the deepest checkpoints have about a hundred blocks).
MAX_DEPTH = 1_000
#: Longest recipe name or tag: each is part of folder names, which the file system bounds.
MAX_ID = 64
#: Keys of a report row's label (what ``paper: match:`` may name).
LABEL_KEYS = ("kind", "task", "tag", "backbone", "init", "layer", "readout", "finetune", "lr")


def _unknown(d: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in d:
        if key not in allowed:
            raise ReservoirError(f"unknown key {key!r} in {where}; expected one of: {', '.join(allowed)}")


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


#: A number as YAML 1.1 leaves it a string (``1e-3``, ``1e4``): digits, a point, an exponent; no ``_``, no words.
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _number(value: Any, what: str, integer: bool = False) -> float | int:
    """YAML reads ``1e-3`` as a string; accept it (and ``1e4`` steps) as a number, written as a number is (not
    ``1_0``); an integer exactly (``4294967295.0000001`` is no integer, though it rounds to one as a float)."""
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 400 or not _NUMBER_TEXT.fullmatch(text):
            raise ReservoirError(f"{what} must be a number, found {options.shown(value)}")
        if integer:
            exact = decimal.Decimal(text)
            if exact != exact.to_integral_value():
                raise ReservoirError(f"{what} must be an integer, found {options.shown(value)}")
            if abs(exact.adjusted()) > 400:
                raise ReservoirError(f"{what} must be an integer of at most 400 digits, found {options.shown(value)}")
            return int(exact)
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReservoirError(f"{what} must be a number, found {value!r}")
    if isinstance(value, int):  # of any size: the bounds checked later say whether it is too large
        return value if integer else _float(value, what)
    if integer:
        if not math.isfinite(value):  # (a real number's bounds say why it is refused)
            raise ReservoirError(f"{what} must be a finite number, found {value!r}")
        if not value.is_integer():
            raise ReservoirError(f"{what} must be an integer, found {value!r}")
        return int(value)
    return value


def _float(value: int, what: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ReservoirError(f"{what} must be a finite number, found an integer of {len(str(abs(value))):,} "
                             "digits") from None


def _choices(values: list, allowed: tuple[str, ...], what: str, where: str) -> list[str]:
    for v in values:
        if v not in allowed:
            raise ReservoirError(f"unknown {what} {v!r} in {where}; expected one of: {', '.join(allowed)}")
    return [str(v) for v in values]


def _takes(tasks: Any, param: str) -> bool:
    """Whether every task named takes ``param`` (defaults' task_params apply only there)."""
    from reservoir.tasks import TASKS

    return all(t not in TASKS or param in TASKS[t].defaults for t in _as_list(tasks))


_ID = re.compile(r"[A-Za-z0-9._-]+")


def _check_id(value: Any, what: str) -> str:
    """A recipe name or a cell tag: it names a results folder, so one safe folder name (no ``/``, not ``..``),
    written as text (YAML reads ``no`` as false, ``010`` as 8 and ``12:30`` as 750: quoted, they stay as written)."""
    if not isinstance(value, str):
        raise ReservoirError(f"{what}: expected text; found {options.shown(value)}, which YAML read as a "
                             f"{type(value).__name__} (quote it to keep it as written)")
    text = value
    if len(text) > MAX_ID:
        raise ReservoirError(f"{what}: expected at most {MAX_ID} characters (it names a folder), found "
                             f"{len(text):,}")
    if not _ID.fullmatch(text) or text in (".", ".."):
        raise ReservoirError(f"{what}: expected letters, digits, '.', '_' or '-' (one folder name, not '.' or '..'), "
                             f"found {text!r}")
    return text


def _mapping(value: Any, what: str) -> dict[str, Any]:
    """A mapping from YAML (absent: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReservoirError(f"{what} must be a mapping, found {value!r}")
    return value


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
        _choices([self.kind], KINDS, "kind", w)
        self.task = [str(t) for t in _as_list(self.task)]
        if not self.task or not all(self.task):
            raise ReservoirError(f"{w} needs a task (e.g. task: bit-xor)")
        self.task_params = _mapping(self.task_params, f"task_params in {w}")
        self.seeds = [_number(s, f"seeds in {w}", integer=True) for s in _as_list(self.seeds)]
        for axis in ("backbone", "finetune"):
            if any(v is None for v in _as_list(getattr(self, axis))):
                raise ReservoirError(f"{axis} in {w}: expected a value, found null")
        self.backbone = [str(b) for b in _as_list(self.backbone)]
        self.finetune = [str(f) for f in _as_list(self.finetune)]
        self.tag = None if self.tag is None else _check_id(self.tag, f"tag in {w}")
        self.init = _choices(_as_list(self.init), options.INITS, "init", w)
        self.readout = _choices(_as_list(self.readout), options.READOUTS, "readout", w)
        _once(self.readout, "readout", w)
        _choices([self.dtype], options.DTYPES, "dtype", w)
        _choices([self.amp], options.AMPS, "amp", w)
        _choices([self.projection], options.PROJECTIONS, "projection", w)
        self.layers = [None if v in (None, "all") else _number(v, f"layers in {w}", True)
                       for v in _as_list(self.layers)]
        self.lr = [_number(v, f"lr in {w}") for v in _as_list(self.lr)]
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
                raise ReservoirError(f"layers in {w} must be one store depth K for fit-linear (choose the fitted "
                                     f"layers with fit_layers), found {self.layers}")
            if self.fit_layers != "all":
                self.fit_layers = [_number(v, f"fit_layers in {w}", True) for v in _as_list(self.fit_layers)]
                _once(self.fit_layers, "fit_layers", w)
                if any(not 0 <= k <= self.layers[0] for k in self.fit_layers):
                    raise ReservoirError(f"fit_layers in {w} must be within 0..{self.layers[0]}, found "
                                         f"{self.fit_layers}")
            if not self.fit_layers:
                raise ReservoirError(f"fit_layers in {w}: expected 'all' or at least one layer, found "
                                     f"{self.fit_layers!r}")
        for name, integer in (("steps", True), ("batch_size", True), ("eval_every", True), ("epochs", False),
                              ("dropout", False), ("split_layer", True), ("max_live_rows", True)):
            if getattr(self, name) is None:
                if name not in NULLABLE:
                    raise ReservoirError(f"{name} in {w} must be a number, found null (leave the key out for its "
                                         "default)")
                continue  # None: the default
            setattr(self, name, _number(getattr(self, name), f"{name} in {w}", integer))
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
        for t in _choices(self.task, tuple(sorted(TASKS)), "task", w):
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
        from reservoir.backbones.load import builtin_layers, lstm_spec

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
        _unknown(raw, allowed, f"{where} (kind {kind})")
        merged = {k: v for k, v in defaults.items() if k in allowed}
        if raw.keys() & {"steps", "epochs"}:  # a cell's own length replaces the defaults' (steps or epochs)
            merged.pop("steps", None), merged.pop("epochs", None)
        merged.update(raw)
        if "task" not in merged:
            raise ReservoirError(f"{where} needs a task (e.g. task: bit-xor)")
        bad = next((t for t in _as_list(merged["task"]) if not isinstance(t, str)), None)
        if bad is not None:
            raise ReservoirError(f"task in {where}: expected a task name or a list of them, found {bad!r}")
        if merged.get("steps") is not None and merged.get("epochs") is not None:
            source = "" if raw.keys() >= {"steps", "epochs"} else " (with defaults)"
            raise ReservoirError(f"{where}{source}: expected steps or epochs, found both (steps "
                                 f"{merged['steps']!r}, epochs {merged['epochs']!r})")
        shared = _mapping(defaults.get("task_params"), "task_params in defaults")
        own = _mapping(raw.get("task_params"), f"task_params in {where}")
        merged["task_params"] = {**{k: v for k, v in shared.items() if _takes(merged["task"], k)}, **own}
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
        _unknown(self.match, LABEL_KEYS, f"{self.where}.match")
        self.value = _number(self.value, f"{self.where}.value")
        self.source = str(self.source or "")
        _choices([self.metric], METRICS, "metric", self.where)
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


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


@dataclass
class Run:
    """One concrete run of a cell: what to compute and where its results go."""

    id: str
    kind: str
    cell: Cell
    task: str
    seed: int
    backbone: str | None = None
    init: str | None = None
    layers: int | None = None
    finetune: str | None = None
    lr: float | None = None

    def label(self, **extra: Any) -> dict[str, Any]:
        """The report row this run feeds (everything but the seed)."""
        from reservoir.tasks.base import task_label

        c = self.cell
        layer = self.layers if self.layers is not None or self.kind not in ("train", "bench") else "all"
        lab = {"kind": self.kind, "task": task_label(self.task, c.task_params), "tag": c.tag,
               "backbone": self.backbone, "init": self.init, "layer": layer, "readout": None, "finetune": self.finetune,
               "lr": "sweep" if c.lr_sweep else self.lr}
        lab.update(extra)
        return lab

    def settings(self) -> dict[str, Any]:
        """Everything that decides this run's results, as JSON gives it back: its results files record it, and a
        rerun of an edited recipe redoes a run whose recorded settings differ."""
        c = self.cell
        params = c.task_params if c.written_path is None else {**c.task_params, "path": c.written_path}
        out: dict[str, Any] = {"kind": self.kind, "task": self.task, "task_params": params}  # wherever it is run
        out["seeds" if c.lr_sweep else "seed"] = c.seeds if c.lr_sweep else self.seed  # a sweep: all its seeds
        if self.kind != "fit-raw":
            out.update(backbone=self.backbone, init=self.init, layers=self.layers)
        if self.kind == "fit-linear":  # what the store's key holds (a layer's fit is the same whichever others are
            out.update(dtype=c.dtype, amp=c.amp)  # fitted beside it)
        elif self.kind == "train":
            out.update(finetune=self.finetune, lr=self.lr, lr_sweep=c.lr_sweep, steps=c.steps, epochs=c.epochs,
                       batch_size=c.batch_size, eval_every=c.eval_every, dropout=c.dropout, amp=c.amp)
        elif self.kind == "bench":
            out.update(batch_size=c.batch_size, split_layer=c.split_layer, max_live_rows=c.max_live_rows)
        if c.projection != options.PROJECTIONS[0]:  # (results written before the choice existed record none)
            out["projection"] = c.projection
        return json.loads(json.dumps(out, default=str))

    def outputs(self) -> list[tuple[dict[str, Any], str]]:
        """``(row label, result file name)`` for each result this run writes (fit-linear: per readout and layer)."""
        c = self.cell
        if self.kind == "fit-linear":
            return [(self.label(layer=k, readout=r), f"{r}-layer{k}.json") for r in c.readout
                    for k in fitted_layers(c)]
        if self.kind == "fit-raw":
            return [(self.label(readout=r), f"{r}.json") for r in c.readout]
        name = {"bench": "speedup.json"}.get(self.kind, "sweep.json" if c.lr_sweep else "results.json")
        return [(self.label(), name)]


def _once(values: list[Any], key: str, where: str) -> None:
    """Refuse a value listed twice under ``key`` (one run's results files would be read twice, as two seeds)."""
    twice = options.repeated(values)
    if twice is not None:
        raise ReservoirError(f"{key} in {where}: expected each value once, found {twice!r} twice")


def fitted_layers(cell: Cell) -> list[int]:
    """The layers a fit-linear cell fits (``all``: 0..K, what a depth-K store holds)."""
    return list(range(cell.layers[0] + 1)) if cell.fit_layers == "all" else list(cell.fit_layers)


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
            _unknown(data, TOP_KEYS, "the top level")
            defaults = data.get("defaults") or {}
            if not isinstance(defaults, dict):
                raise ReservoirError(f"defaults must be a mapping, found {defaults!r}")
            _unknown(defaults, tuple(k for k in ALL_CELL_KEYS if k != "kind"), "defaults")
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
                _unknown(p, PAPER_KEYS, f"paper[{i}]")
                if "match" not in p or "value" not in p:
                    raise ReservoirError(f"paper[{i}] needs 'match' and 'value'")
                paper.append(PaperValue(where=f"paper[{i}]", **p))
            given = data.get("name") not in (None, "")
            what = "name" if given else "name (the file's stem; set name: in the recipe)"
            name = _check_id(data["name"] if given else Path(source).stem, what)
            description = str(data.get("description") or "").strip()
            if any(control_char(c) and c not in "\n\t" for c in description):  # a terminal's escapes, say
                raise ReservoirError(f"description: expected text, found control characters in "
                                     f"{options.shown(description)}")
            recipe = cls(name=name, cells=cells, description=description, paper=paper, text=text, raw=data,
                         folder=Path(folder or ".").resolve())
            runs = recipe.runs()  # id collisions are a recipe error
            recipe._check_rows(runs)
            labels = [label for run in runs for label, _ in run.outputs()]
            kinds = {"steps_to_converge": ("train",), "speedup": ("bench",), "test_accuracy": KINDS}
            for p in paper:  # an entry that fits no row is a typo, not a number to drop silently
                if not any(p.matches(lab) and lab["kind"] in kinds[p.metric] for lab in labels):
                    what = "run" if p.metric == "test_accuracy" else f"{kinds[p.metric][0]} run"
                    raise ReservoirError(f"{p.where}.match {p.match} fits no {what} of this recipe")
            return recipe
        except ReservoirError as err:
            raise ReservoirError(f"recipe {source}: {err}") from None

    def runs(self) -> list[Run]:
        """Every concrete run, in recipe order; ids are unique."""
        total = sum(_size(cell) for cell in self.cells)
        if total > MAX_RUNS:
            raise ReservoirError(f"expected at most {MAX_RUNS:,} runs, found a grid of {total:,}; split the recipe")
        files = sum(_outputs(cell) for cell in self.cells)
        if files > MAX_OUTPUTS:
            raise ReservoirError(f"expected at most {MAX_OUTPUTS:,} results files (runs x readouts x fitted "
                                 f"layers), found a grid of {files:,}; split the recipe or fit fewer layers")
        runs: list[Run] = []
        for cell in self.cells:
            runs.extend(_expand(cell))
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
        return next((p for p in self.paper if p.metric == metric and p.matches(label)), None)


def _check_defaults_used(defaults: dict[str, Any]) -> None:
    """Refuse (one line) a task parameter in ``defaults`` that no task takes (a misspelling): defaults apply only
    to the cells whose tasks take them, so it would be dropped without a word, and every run made without it."""
    from reservoir.tasks import TASKS

    for key in _mapping(defaults.get("task_params"), "task_params in defaults"):
        if not any(key in task.defaults for task in TASKS.values()):
            raise ReservoirError(f"task_params in defaults: no task has a parameter {key!r}; expected one of: "
                                 f"{', '.join(sorted({k for t in TASKS.values() for k in t.defaults}))}")


#: The most results files a recipe may ask for (runs x readouts x fitted layers): a few kilobytes of YAML could
#: otherwise ask for millions, whose labels alone take minutes and gigabytes to check.
MAX_OUTPUTS = 100_000


def _outputs(c: Cell) -> int:
    """How many results files ``c`` asks for (before expanding it): a fit-linear run's readouts x fitted layers
    (``all``: its depth + 1), a fit-raw run's readouts, one otherwise."""
    n = _size(c)
    if c.kind == "fit-linear":
        layers = (c.layers[0] or 0) + 1 if c.fit_layers == "all" else len(c.fit_layers)
        return n * len(c.readout) * layers
    return n * len(c.readout) if c.kind == "fit-raw" else n


def _size(c: Cell) -> int:
    """How many runs ``c`` expands to (before expanding it)."""
    n = len(c.task) * len(c.seeds)
    if c.kind == "fit-raw":
        return n
    n *= len(c.backbone) * len(c.init)
    if c.kind == "train":
        n *= len(c.layers) * len(c.finetune) * (1 if c.lr_sweep else len(c.lr))
        n //= len(c.seeds) if c.lr_sweep else 1
    return n


def _expand(c: Cell) -> list[Run]:
    from reservoir.tasks.base import task_label

    tag = [c.tag] if c.tag else []
    out = []
    name = {t: task_label(t, c.task_params) for t in c.task}  # a data file's task: data-<file stem>
    if c.kind == "fit-raw":
        for task, seed in itertools.product(c.task, c.seeds):
            out.append(Run("__".join(["fit-raw", name[task], *tag, f"seed{seed}"]), c.kind, c, task, seed))
        return out
    if c.kind == "bench":
        for task, bb, init, seed in itertools.product(c.task, c.backbone, c.init, c.seeds):
            d = "dall" if c.layers[0] is None else f"d{c.layers[0]}"
            rid = "__".join(["bench", name[task], *tag, slug(bb), init, d, f"seed{seed}"])
            out.append(Run(rid, c.kind, c, task, seed, bb, init, c.layers[0]))
        return out
    if c.kind == "fit-linear":
        for task, bb, init, seed in itertools.product(c.task, c.backbone, c.init, c.seeds):
            rid = "__".join(["fit-linear", name[task], *tag, slug(bb), init, f"d{c.layers[0]}", f"seed{seed}"])
            out.append(Run(rid, c.kind, c, task, seed, bb, init, c.layers[0]))
        return out
    seeds = [c.seeds[0]] if c.lr_sweep else c.seeds
    lrs = [None] if c.lr_sweep else c.lr
    for task, bb, init, depth, ft, lr, seed in itertools.product(c.task, c.backbone, c.init, c.layers, c.finetune,
                                                                 lrs, seeds):
        d = "dall" if depth is None else f"d{depth}"
        if c.lr_sweep:
            lo, hi, n = str(c.lr_sweep).split(":")
            tail = [f"sweep{float(lo):g}-{float(hi):g}x{int(n)}", f"seeds{seed}-{seed + len(c.seeds) - 1}"]
        else:
            tail = [f"lr{lr:g}", f"seed{seed}"]
        rid = "__".join(["train", name[task], *tag, slug(bb), init, d, slug(ft), *tail])
        out.append(Run(rid, c.kind, c, task, seed, bb, init, depth, ft, lr))
    return out


# -- finding and loading -------------------------------------------------------
