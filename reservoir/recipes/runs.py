"""A recipe's runs: each cell expanded over its axes (tasks, backbones, inits, depths, ...) into runs with ids,
settings and the results files they write."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reservoir import options
from reservoir.settings import slug

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.recipes.schema import Cell

#: Most runs one recipe may expand to (the bundled recipes have a few hundred at most).
MAX_RUNS = 10_000
#: The most results files a recipe may ask for (runs x readouts x fitted layers): a few kilobytes of YAML could
#: otherwise ask for millions, whose labels alone take minutes and gigabytes to check.
MAX_OUTPUTS = 100_000


def n_outputs(c: Cell) -> int:
    """How many results files ``c`` asks for (before expanding it): a fit-linear run's readouts x fitted layers
    (``all``: its depth + 1), a fit-raw run's readouts, one otherwise."""
    n = n_runs(c)
    if c.kind == "fit-linear":
        layers = (c.layers[0] or 0) + 1 if c.fit_layers == "all" else len(c.fit_layers)
        return n * len(c.readout) * layers
    return n * len(c.readout) if c.kind == "fit-raw" else n


def n_runs(c: Cell) -> int:
    """How many runs ``c`` expands to (before expanding it)."""
    n = len(c.task) * len(c.seeds)
    if c.kind == "fit-raw":
        return n
    n *= len(c.backbone) * len(c.init)
    if c.kind == "train":
        n *= len(c.layers) * len(c.finetune) * (1 if c.lr_sweep else len(c.lr))
        n //= len(c.seeds) if c.lr_sweep else 1
    return n


def expand(c: Cell) -> list[Run]:
    """The runs of cell ``c``, in the order of its axes (the ids name every axis with more than one value)."""
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


def fitted_layers(cell: Cell) -> list[int]:
    """The layers a fit-linear cell fits (``all``: 0..K, what a depth-K store holds)."""
    if isinstance(cell.fit_layers, list):
        return list(cell.fit_layers)
    depth = cell.layers[0]
    assert depth is not None  # a fit-linear cell has one store depth (Cell checks it)
    return list(range(depth + 1))
