"""What defines one extraction: :class:`ExtractConfig`, its checks, and the layers and poolings it resolves to."""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.options import check_fields, integer, one_of, optional, setting
from reservoir.extract.plan import check_batching
from reservoir.settings import slug


DTYPES = options.DTYPES
#: Most writer threads a pass takes (each holds a window in host memory).
MAX_WRITERS = 16


@dataclass
class ExtractConfig:
    """Everything that defines one extraction (saved, in parts, in the store's attrs).

    Each field carries its option's help, default and constraint
    (:mod:`reservoir.options`): ``reservoir extract`` builds its options from
    them, and a bad value is refused here in one line naming the option.
    """

    task: str = setting("Task name (see `reservoir tasks`); or --data PATH.")
    backbone: str = options.BACKBONE.field()
    init: str = options.INIT.field()
    layers: list[int] | int | None = setting(
        "Depth K (store layers 0..K; blocks above K never run), a list like 0,3,6, or 'all' (the default).", None)
    out: str | None = setting("Store path (.zarr folder or .h5 file). Default: cache/<task>-<backbone>-<init>.zarr "
                              "(--data: data-<file stem> as the task).", None, optional(options.PATH))
    format: str | None = setting("Store backend; default from the suffix.", None, optional(one_of(*options.FORMATS)))
    task_params: dict[str, Any] = setting("Task parameter, repeatable (e.g. -p n_train=4000 -p max_length=300).",
                                          flag="--param", factory=dict)
    seed: int = options.SEED.field(help="Seed of the random/stats inits and the input projection.")
    projection_gain: float = options.GAIN.field()
    projection: str = options.PROJECTION.field()
    batch_size: int | None = setting("Most sequences per forward pass (default: 64 on the CPU, none on CUDA, where "
                                     "--max-tokens has a default; no row cap with --max-tokens unless given).", None)
    max_tokens: int | None = setting("Token budget per forward pass (rows x longest length): short sequences travel "
                                     "in large batches (default on CUDA: 2^26 / the model's width; none on the CPU).",
                                     None)
    writers: int | None = setting("Threads writing finished windows into the store while the next computes "
                                  "(default: 3 on CUDA, where a GPU outruns one thread's writes; 1 on the CPU).", None,
                                  optional(integer(1, MAX_WRITERS)))
    dtype: str = setting("Stored feature dtype.", "float16", one_of(*options.DTYPES))
    device: str = options.DEVICE.field()
    amp: str = options.AMP.field()
    revision: str | None = options.REVISION.field()
    full_seq_layer: int | None = setting("Also store every position's state at this layer: a split-point store for "
                                         "`train --from-store`.", None, options.optional(options.integer(0)))
    pooling: list[str] = setting("How each layer becomes a row: the last real token, the first token, the mean over "
                                 "real tokens; several in one pass, e.g. last,mean (read with fit-linear --pooling).",
                                 factory=lambda: ["last"])
    truncate: bool = setting("Keep the first max-positions tokens of longer sequences (recorded in the store) instead "
                             "of failing.", False, options.FLAG)

    def __post_init__(self) -> None:
        if isinstance(self.out, os.PathLike):  # a Path as its text (what the store's attributes write)
            self.out = os.fspath(self.out)
        if isinstance(self.layers, str) and self.layers == "all":  # what the command line and recipes write
            self.layers = None
        if isinstance(self.layers, np.ndarray) and self.layers.ndim == 1:  # a list of layers as an array
            self.layers = self.layers.tolist()
        layers = self.layers
        if not (layers is None or options.is_int(layers)
                or (isinstance(layers, (list, tuple)) and layers and all(options.is_int(k) for k in layers))):
            raise ReservoirError(f"--layers must be a depth K, a list of layers or 'all', found {layers!r}")
        if isinstance(layers, (list, tuple)):  # numpy integers as ints (what JSON, the store's attributes, can write)
            self.layers = [int(k) for k in layers]
            twice = options.repeated(self.layers)
            if twice is not None:  # not dropped without a word (fit-linear's --layer refuses it too)
                raise ReservoirError(f"--layers: expected each layer once; found layer {twice} twice in "
                                     f"{','.join(map(str, self.layers))}")
        elif layers is not None:
            self.layers = operator.index(layers)
        check_fields(self)
        options.check_projection(self.projection, self.projection_gain)
        check_batching(self.batch_size, self.max_tokens)
        if self.batch_size is not None:  # numpy integers as ints (what the store's attributes write)
            self.batch_size = operator.index(self.batch_size)
        if self.max_tokens is not None:
            self.max_tokens = operator.index(self.max_tokens)
        self.pooling = check_poolings(self.pooling)

    def default_out(self) -> str:
        from reservoir.tasks.base import task_label  # a data file's task: data-<file stem>

        name = slug(self.backbone)
        return str(Path("cache") / f"{task_label(self.task, self.task_params)}-{name}-{self.init}.zarr")


def check_poolings(pooling: str | list[str] | tuple[str, ...]) -> list[str]:
    """``last``, ``first``, ``mean`` or several of them (a list, or ``"last,mean"``), each once; one line if not."""
    if not isinstance(pooling, (str, list, tuple)):
        raise ReservoirError(f"--pooling must be one or more of {', '.join(options.POOLINGS)} (a name, a list or "
                             f"\"last,mean\"); found {options.shown(pooling)}")
    kinds = [p.strip() for p in pooling.split(",")] if isinstance(pooling, str) else list(pooling)
    bad = [p for p in kinds if p not in options.POOLINGS]
    if not kinds or bad or len(set(kinds)) != len(kinds):
        raise ReservoirError(f"--pooling must be one or more of {', '.join(options.POOLINGS)} (each once, e.g. "
                             "last,mean); "
                             f"found {','.join(map(str, kinds)) or 'nothing'}")
    return kinds


def resolve_layers(layers: list[int] | int | None, n_layer: int) -> list[int]:
    """``K`` -> ``[0..K]``; a list is checked, sorted and deduplicated."""
    if layers is None:
        layers = n_layer
    if not isinstance(layers, (list, tuple)):
        layers = operator.index(layers)  # a numpy integer as an int
    wanted = list(range(layers + 1)) if isinstance(layers, int) else sorted(set(int(k) for k in layers))
    if not wanted or wanted[0] < 0 or wanted[-1] > n_layer:
        found = layers if isinstance(layers, int) else wanted
        raise ReservoirError(f"--layers must be within 0..{n_layer} for this backbone, found {found}")
    return wanted


