"""The settings of a live training run: :class:`TrainConfig`, the bounds of its numbers, its default folder.

Each field carries its option's help, default and constraint
(:mod:`reservoir.options`): ``reservoir train`` builds its options from them,
recipes check their cells against the same constraints (:func:`check_number`),
and a bad value is refused here in one line naming the option.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.options import integer, number, one_of, optional, setting
from reservoir.settings import slug


#: Optimizer steps of a run that gives neither ``steps`` nor ``epochs``.
DEFAULT_STEPS = 2000
#: Most optimizer steps a run may ask for (a run of that many is weeks long; more is a typo).
MAX_STEPS = 10**9


@dataclass
class TrainConfig:
    """One live training run (saved in its checkpoints and results).

    The builder :func:`reservoir.training.run` reads every field; the loop
    :func:`reservoir.training.train` reads the optimization settings (``lr``,
    ``steps``/``epochs``, ``batch_size``, ``eval_every``, ``seed``,
    ``dropout``, ``grad_clip``, ``amp``, ``cuda_graphs``, ``compile``) and the freeze (``finetune``,
    ``split_layer``), and saves :meth:`key` in its checkpoints.

    Examples
    --------
    >>> TrainConfig(task="bit-xor", steps=100).total_steps(n_train=1000)
    100
    >>> TrainConfig(task="bit-xor", epochs=2, batch_size=16).total_steps(n_train=1000)
    124
    """

    task: str = setting("Task name (see `reservoir tasks`); or --data PATH; not needed with --from-store.")
    backbone: str = options.BACKBONE.field()
    init: str = options.INIT.field()
    revision: str | None = options.REVISION.field()
    layers: int | None = setting("Depth K: keep blocks 1..K (default all).", None, optional(integer(0)))
    finetune: str = setting("Groups to train: fpt (input,positions,layernorm,output), all, output, or a comma list of "
                            "input, positions, layernorm, attention, feedforward, recurrent (LSTM), output.", "fpt")
    task_params: dict[str, Any] = setting("Task parameter, repeatable (e.g. -p n_train=4000).", flag="--param",
                                          factory=dict)
    lr: float = setting("Adam learning rate.", 1e-3, number(0, open_low=True), limit=1e3)
    steps: int | None = setting(f"Optimizer steps (default {DEFAULT_STEPS} unless --epochs).", None,
                                optional(integer(1)), limit=MAX_STEPS)
    epochs: float | None = setting("Passes over the training split (instead of --steps).", None,
                                   optional(number(0, open_low=True)), limit=1e6)
    batch_size: int = setting("Sequences per step.", 16, integer(1), limit=1 << 20)
    eval_every: int = setting("Steps between validation passes.", 100, integer(1), limit=MAX_STEPS)
    seed: int = options.SEED.field(help="Seed of inits, projection, head and data order.")
    dropout: float = setting("Dropout inside the backbone in training.", 0.0, number(0, 1))
    grad_clip: float = setting("Gradient-norm clip.", 1.0, number(0, words="a finite number >= 0 (0: no clipping)"),
                               cli=False)
    val_fraction: float = setting("Share of train held out when the task has no validation split.", 0.1,
                                  number(0, 1, open_low=True), cli=False)
    projection_gain: float = options.GAIN.field(cli=False, constraint=number(0, open_low=True))
    projection: str = options.PROJECTION.field()
    split_layer: int = setting("Train only blocks above this layer (what a split-point store at this layer allows).",
                               0, integer(0))
    from_store: str | None = setting("Feature store to train from: a split-point store (extract --full-seq-layer S) "
                                     "runs only blocks S+1..K live, a last-token store trains the output layer alone. "
                                     "Task, task parameters, init and split layer (a last-token store: backbone) are "
                                     "the store's; other values of those options are refused. A split-point store's "
                                     "backbone is loaded by --backbone, default the store's own (checked by its "
                                     "weights). --seed seeds the head, "
                                     "validation carve and batch order (default: the store's seed).", None)
    device: str = options.DEVICE.field()
    amp: str = options.AMP.field()
    cuda_graphs: str = setting("Capture the training step as one CUDA graph (auto: on CUDA when every train row has "
                               "one length).", "auto", one_of(*options.CUDA_GRAPHS))
    compile: bool = setting("Compile the model's forward for the training steps with torch.compile (opt-in: "
                            "compiling costs tens of seconds, which only long runs repay; trains what the eager steps "
                            "train, to float rounding).", False, options.FLAG)
    out: str | None = setting("Run folder (checkpoints, results.json); default results/train/<run>.", None,
                              options.optional(options.PATH))

    def __post_init__(self) -> None:
        """Refuse bad settings before anything is built or written (one line naming the option)."""
        from reservoir.training.freeze import parse_groups

        if isinstance(self.out, os.PathLike):  # a Path as its text (what the run's settings write)
            self.out = os.fspath(self.out)
        options.check_fields(self)
        if self.steps is not None and self.epochs is not None:  # one length of run, as the command line takes
            raise ReservoirError(f"expected steps or epochs, not both; found steps {self.steps} and epochs "
                                 f"{self.epochs:g}")
        options.check_projection(self.projection, self.projection_gain)
        parse_groups(self.finetune)

    def default_out(self, runs: str | None = None) -> str:
        """The run folder when ``out`` is unset: ``results/train/<task>-<backbone>-<init>-<groups>-<runs>``, where
        ``runs`` is ``lr<lr>-seed<s>`` for one run (a sweep passes its own, so that no run shares its folder)."""
        from reservoir.tasks.base import task_label  # a data file's task: data-<file stem>

        from reservoir.training.freeze import parse_groups

        name, task = slug(self.backbone), task_label(self.task, self.task_params)
        groups = "+".join(parse_groups(self.finetune))
        runs = runs or f"lr{self.lr:g}-seed{self.seed}"
        return str(Path("results") / "train" / f"{task}-{name}-{self.init}-{groups}-{runs}")

    def total_steps(self, n_train: int) -> int:
        """Optimizer steps of the run: ``steps``, else ``epochs`` passes over ``n_train`` rows, else 2000."""
        if self.steps is not None:
            return self.steps
        if self.epochs is not None:
            steps = math.ceil(self.epochs * max(1, n_train // self.batch_size))
            if steps > MAX_STEPS:
                raise ReservoirError(f"--epochs {self.epochs:g} over {n_train:,} rows must be at most {MAX_STEPS:,} "
                                     f"steps, found {steps:,}")
            return steps
        return DEFAULT_STEPS

    def key(self) -> dict[str, Any]:
        """Fields that must match to resume a run (everything but device and folder), as plain JSON data.

        Plain data is what a checkpoint may hold (and what ``results.json``
        holds): tuples become lists, numpy scalars floats.
        """
        d = asdict(self)
        for k in ("device", "out", "amp", "eval_every", "cuda_graphs", "compile"):
            d.pop(k)
        if d["projection"] == options.PROJECTIONS[0]:  # what every run did before the choice existed
            d.pop("projection")
        return json.loads(json.dumps(d, default=float))


def comparable(key: Any) -> dict[str, Any]:
    """A run's settings (a :meth:`TrainConfig.key`, a checkpoint's or a results file's ``config``) as two runs are
    compared: the projection a key leaves out at its default filled in, and the groups in their one spelling
    (``fpt`` and ``input,positions,layernorm,output`` are one run). Without it a saved ``projection: normal``
    went unseen by a new run of the default, which took the run up under another input map.

    Examples
    --------
    >>> comparable({"finetune": "output,layernorm"})
    {'finetune': 'layernorm,output', 'projection': 'orthogonal'}
    """
    from reservoir.training.freeze import parse_groups

    out = dict(key) if isinstance(key, dict) else {}
    out.setdefault("projection", options.PROJECTIONS[0])
    if isinstance(out.get("finetune"), str):
        try:
            out["finetune"] = ",".join(parse_groups(out["finetune"]))
        except ReservoirError:
            pass  # not groups of this version: compared as written
    return out


#: The constraint of every number of :class:`TrainConfig` (recipes check their cells against it too).
BOUNDS: dict[str, options.Constraint] = {
    f.name: f.metadata["setting"].constraint for f in dataclasses.fields(TrainConfig)
    if f.metadata["setting"].constraint is not None and f.metadata["setting"].constraint.choices is None
}


def check_number(name: str, value: Any, label: str | None = None) -> None:
    """Refuse a value of the :class:`TrainConfig` number ``name`` outside its constraint (:data:`BOUNDS`), in one line.

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
    if name not in BOUNDS:
        raise KeyError(f"{name} is not a number of TrainConfig")
    found = options.field_setting(TrainConfig, name)
    found.check(value, label or options.label_of(name, found))
