"""The settings of a live training run: :class:`TrainConfig`, the bounds of its numbers, its default folder."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.settings import slug
from reservoir.training.freeze import parse_groups


class _Bound(NamedTuple):
    """The values one number of :class:`TrainConfig` may take."""

    integer: bool
    ok: Callable[[float], bool]
    expected: str
    optional: bool = False  # None is allowed (it means the default)
    option: bool = True  # `reservoir train` has an option for it (errors name --the-option, else the field)


#: The range of every number in :class:`TrainConfig` (recipes check their cells against it too).
BOUNDS: dict[str, _Bound] = {
    "layers": _Bound(True, lambda v: v >= 0, "an integer >= 0", optional=True),
    "lr": _Bound(False, lambda v: v > 0, "a finite number > 0"),
    "steps": _Bound(True, lambda v: v >= 1, "an integer >= 1", optional=True),
    "epochs": _Bound(False, lambda v: v > 0, "a finite number > 0", optional=True),
    "batch_size": _Bound(True, lambda v: v >= 1, "an integer >= 1"),
    "eval_every": _Bound(True, lambda v: v >= 1, "an integer >= 1"),
    "seed": _Bound(True, lambda v: 0 <= v < 2**32, "an integer in 0..4294967295"),  # what numpy and sklearn take
    "dropout": _Bound(False, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "grad_clip": _Bound(False, lambda v: v >= 0, "a finite number >= 0 (0: no clipping)", option=False),
    "val_fraction": _Bound(False, lambda v: 0 < v < 1, "a number in (0, 1)", option=False),
    "projection_gain": _Bound(False, lambda v: v > 0, "a finite number > 0", option=False),
    "split_layer": _Bound(True, lambda v: v >= 0, "an integer >= 0"),
}

#: Optimizer steps of a run that gives neither ``steps`` nor ``epochs``.
DEFAULT_STEPS = 2000


def check_number(name: str, value: Any, label: str | None = None) -> None:
    """Refuse a value of the :class:`TrainConfig` number ``name`` outside :data:`BOUNDS`, in one line.

    ``label`` names the value in the message; by default the ``reservoir
    train`` option (``--batch-size``), else the field's name.

    Examples
    --------
    >>> check_number("steps", 0)
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: --steps must be an integer >= 1, found 0
    >>> check_number("lr", -1.0, label="lr in cells[0]")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: lr in cells[0] must be a finite number > 0, found -1.0
    """
    bound = BOUNDS[name]
    if value is None and bound.optional:
        return
    finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not (finite and (not bound.integer or value == int(value)) and bound.ok(value)):
        label = label or ("--" + name.replace("_", "-") if bound.option else name)
        raise ReservoirError(f"{label} must be {bound.expected}, found {value!r}")


@dataclass
class TrainConfig:
    """One live training run (saved in its checkpoints and results).

    The builder :func:`reservoir.training.run` reads every field; the loop
    :func:`reservoir.training.train` reads the optimization settings (``lr``,
    ``steps``/``epochs``, ``batch_size``, ``eval_every``, ``seed``,
    ``dropout``, ``grad_clip``, ``amp``, ``cuda_graphs``) and the freeze (``finetune``,
    ``split_layer``), and saves :meth:`key` in its checkpoints.

    Examples
    --------
    >>> TrainConfig(task="bit-xor", steps=100).total_steps(n_train=1000)
    100
    >>> TrainConfig(task="bit-xor", epochs=2, batch_size=16).total_steps(n_train=1000)
    124
    """

    task: str = field(metadata={"help": "registered task name"})
    backbone: str = field(default=options.DEFAULT_BACKBONE, metadata={"help": "backbone name, hub id or folder"})
    init: str = field(default=options.INITS[0], metadata={"help": " | ".join(options.INITS)})
    layers: int | None = field(default=None, metadata={"help": "depth K: blocks 1..K; default all"})
    finetune: str = field(default="fpt", metadata={"help": "groups to train: fpt, all, output or a comma list"})
    task_params: dict[str, Any] = field(default_factory=dict, metadata={"help": "task parameters"})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    steps: int | None = field(default=None, metadata={"help": "optimizer steps (default: epochs, else 2000)"})
    epochs: float | None = field(default=None, metadata={"help": "passes over train (alternative to steps)"})
    batch_size: int = field(default=16, metadata={"help": "sequences per step"})
    eval_every: int = field(default=100, metadata={"help": "steps between validation passes"})
    seed: int = field(default=0, metadata={"help": "seed of inits, projection, head, data order"})
    dropout: float = field(default=0.0, metadata={"help": "dropout inside the backbone while training"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    val_fraction: float = field(default=0.1, metadata={"help": "train share held out when the task has no val"})
    projection_gain: float = field(default=options.PROJECTION_GAIN, metadata={"help": "gain of the orthogonal input projection"})
    split_layer: int = field(default=0, metadata={"help": "train only blocks above this layer (split point)"})
    from_store: str | None = field(default=None, metadata={"help": "split-point store to start from"})
    device: str = field(default="auto", metadata={"help": "cpu | cuda | cuda:N | auto"})
    amp: str = field(default=options.AMPS[0], metadata={"help": "CUDA autocast: " + " | ".join(options.AMPS)})
    cuda_graphs: str = field(default="auto", metadata={
        "help": "capture the training step as one CUDA graph: auto (on CUDA when every train row has one length), "
                "on (refuse where it cannot), off"})
    out: str | None = field(default=None, metadata={"help": "run folder (checkpoints, results.json)"})

    def __post_init__(self) -> None:
        """Refuse bad settings before anything is built or written (one line naming the option)."""
        for name in BOUNDS:
            check_number(name, getattr(self, name))
        parse_groups(self.finetune)
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise ReservoirError(f"--cuda-graphs must be auto, on or off, found {self.cuda_graphs!r}")

    def default_out(self) -> str:
        """The run folder when ``out`` is unset: ``results/train/<task>-<backbone>-<init>-<groups>-lr<lr>-seed<s>``."""
        from reservoir.tasks.base import task_label  # a data file's task: data-<file stem>

        name, task = slug(self.backbone), task_label(self.task, self.task_params)
        groups = "+".join(parse_groups(self.finetune))
        return str(Path("results") / "train" / f"{task}-{name}-{self.init}-{groups}-lr{self.lr:g}-seed{self.seed}")

    def total_steps(self, n_train: int) -> int:
        """Optimizer steps of the run: ``steps``, else ``epochs`` passes over ``n_train`` rows, else 2000."""
        if self.steps is not None:
            return self.steps
        if self.epochs is not None:
            return math.ceil(self.epochs * max(1, n_train // self.batch_size))
        return DEFAULT_STEPS

    def key(self) -> dict[str, Any]:
        """Fields that must match to resume a run (everything but device and folder), as plain JSON data.

        Plain data is what a checkpoint may hold (and what ``results.json``
        holds): tuples become lists, numpy scalars floats.
        """
        d = asdict(self)
        for k in ("device", "out", "amp", "eval_every", "cuda_graphs"):
            d.pop(k)
        return json.loads(json.dumps(d, default=float))
