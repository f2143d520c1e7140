"""One pass of a task through a frozen backbone into a feature store.

:func:`extract` takes a task object and a loaded backbone (what a notebook
holds); :func:`run` builds both from an :class:`ExtractConfig` (what
``reservoir extract`` and the recipes use) and calls the same pass.

For each split, the unfinished store chunks are grouped into windows
(:mod:`reservoir.batching`): a window's rows go to the device in one transfer,
sorted by length and cut into batches (a batch is padded only to its own
longest sequence, and holds at most ``batch_size`` rows or ``max_tokens``
padded tokens). Each batch runs blocks ``1..max(layers)`` once under
``inference_mode``, in the compute dtype the weights were cast to once
(:func:`reservoir.runtime.cast_for_inference`), and the hidden states at the
last ``n_out_tokens`` real positions of every requested layer stay on the
device until the window ends. The window then goes to the host in one copy
and a background thread (:class:`reservoir.writer.ChunkWriter`) writes its
chunks while the next window computes. A chunk's ``done`` flag is set after
its rows are written, so a rerun with the same settings skips finished chunks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir import distributed, options
from reservoir.batching import Window, check_batching, plan_order, plan_windows
from reservoir.errors import ReservoirError
from reservoir.engine import Engine, extract_rows, to_host  # noqa: F401 (extract_rows re-exported)
from reservoir.settings import slug
from reservoir.runtime import (  # noqa: F401 (autocast, resolve_device re-exported)
    autocast,
    cast_for_inference,
    check_positions,
    resolve_device,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from reservoir.backbones.model import ReservoirBackbone
    from reservoir.tasks import TaskData


DTYPES = ("float16", "float32")


@dataclass
class ExtractConfig:
    """Everything that defines one extraction (saved, in parts, in the store's attrs)."""

    task: str = field(metadata={"help": "registered task name"})
    backbone: str = field(default=options.DEFAULT_BACKBONE, metadata={"help": "backbone name, hub id or folder"})
    init: str = field(default=options.INITS[0], metadata={"help": " | ".join(options.INITS)})
    layers: list[int] | int | None = field(
        default=None, metadata={"help": "depth K (store layers 0..K) or an explicit list; default all"}
    )
    out: str | None = field(default=None, metadata={"help": "store path; default cache/<task>-<backbone>-<init>.zarr"})
    format: str | None = field(default=None, metadata={"help": "zarr | hdf5; default from the suffix"})
    task_params: dict[str, Any] = field(default_factory=dict, metadata={"help": "task parameters"})
    seed: int = field(default=0, metadata={"help": "seed of the random/stats inits and the projection"})
    projection_gain: float = field(default=options.PROJECTION_GAIN,
                                   metadata={"help": "gain of the orthogonal input projection"})
    batch_size: int | None = field(default=None, metadata={
        "help": "most sequences per forward; default 64 without max_tokens, unbounded with it"})
    max_tokens: int | None = field(default=None, metadata={
        "help": "most padded tokens per forward (rows x longest length): batches sized by a token budget"})
    dtype: str = field(default="float16", metadata={"help": "store dtype: float16 | float32"})
    device: str = field(default="auto", metadata={"help": "cpu | cuda | cuda:N | auto"})
    amp: str = field(default=options.AMPS[0], metadata={"help": "CUDA autocast: " + " | ".join(options.AMPS)})
    revision: str | None = field(default=None, metadata={"help": "hub revision for hub ids"})
    full_seq_layer: int | None = field(default=None, metadata={
        "help": "also store every position's state at this layer (a split-point store for `train --from-store`)"})
    pooling: list[str] = field(default_factory=lambda: ["last"], metadata={
        "help": "how each layer becomes a row: last (the last real token), first (token 0), mean (over the real "
                "tokens); several at once, e.g. last,mean"})
    truncate: bool = field(default=False, metadata={
        "help": "cut sequences longer than the backbone's positions to their first max_positions tokens "
                "(recorded in the store); without it such sequences are an error"})

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ReservoirError(f"unknown store dtype {self.dtype!r}; expected one of: {', '.join(DTYPES)}")
        check_batching(self.batch_size, self.max_tokens)
        if self.amp not in options.AMPS:
            raise ReservoirError(f"unknown amp {self.amp!r}; expected one of: {', '.join(options.AMPS)}")
        if not math.isfinite(self.projection_gain) or self.projection_gain <= 0:
            raise ReservoirError(f"--gain must be a finite number above 0, found {self.projection_gain}")
        self.pooling = check_poolings(self.pooling)

    def default_out(self) -> str:
        from reservoir.tasks.base import task_label  # a data file's task: data-<file stem>

        name = slug(self.backbone)
        return str(Path("cache") / f"{task_label(self.task, self.task_params)}-{name}-{self.init}.zarr")


def check_poolings(pooling: str | list[str] | tuple[str, ...]) -> list[str]:
    """``last``, ``first``, ``mean`` or several of them (a list, or ``"last,mean"``), each once; one line if not."""
    from reservoir.backbones.model import POOLINGS

    kinds = [p.strip() for p in pooling.split(",")] if isinstance(pooling, str) else list(pooling)
    bad = [p for p in kinds if p not in POOLINGS]
    if not kinds or bad or len(set(kinds)) != len(kinds):
        raise ReservoirError(f"--pooling must be one or more of {', '.join(POOLINGS)} (each once, e.g. last,mean); "
                             f"found {','.join(map(str, kinds)) or 'nothing'}")
    return kinds


def resolve_layers(layers: list[int] | int | None, n_layer: int) -> list[int]:
    """``K`` -> ``[0..K]``; a list is checked, sorted and deduplicated."""
    if layers is None:
        layers = n_layer
    wanted = list(range(layers + 1)) if isinstance(layers, int) else sorted(set(int(k) for k in layers))
    if not wanted or wanted[0] < 0 or wanted[-1] > n_layer:
        found = layers if isinstance(layers, int) else wanted
        raise ReservoirError(f"--layers must be within 0..{n_layer} for this backbone, found {found}")
    return wanted


def truncate_task(task, max_tokens: int) -> dict[str, Any]:
    """Keep the first ``max_tokens`` positions of every sequence, in place; return what was cut.

    The fingerprint stays that of the full task; the store records the cut
    (``task.truncated``), so a truncated store never passes for a full one.
    """
    from reservoir.tasks import Split

    if task.n_out_tokens > 1:
        raise ReservoirError(f"task {task.name!r} reads its last {task.n_out_tokens} tokens; it cannot be truncated")
    counts = {}
    for name, split in task.splits.items():
        counts[name] = int((split.lengths > max_tokens).sum())
        task.splits[name] = Split(split.inputs[:, :max_tokens], np.minimum(split.lengths, max_tokens), split.labels)
    return {"max_tokens": max_tokens, "rows_cut": counts}


@dataclass
class Prepared:
    """A validated extraction before anything is written: task, backbone on its device, store settings."""

    config: ExtractConfig
    task: TaskData
    backbone: ReservoirBackbone
    device: torch.device
    layers: list[int]
    attrs: dict[str, Any]
    projection_weight: np.ndarray
    final_norm: dict[str, np.ndarray] | None
    context: Any  # what forwards run in (autocast for the LSTM baseline, else nothing)
    timings: dict[str, float]

    def engine(self, out_dtype=None):
        """The :class:`Engine` this extraction runs (``out_dtype``: the store dtype by default)."""
        import torch

        dtype = out_dtype or getattr(torch, self.config.dtype)
        s_layer = self.config.full_seq_layer
        return Engine(self.backbone, self.layers, self.task.n_out_tokens, self.device, dtype, s_layer,
                      self.task.max_length if s_layer is not None else None, tuple(self.config.pooling))


def prepare(config: ExtractConfig, task=None) -> Prepared:
    """Build and check everything an extraction needs (task, backbone, depth, positions); write nothing.

    ``task`` overrides building ``config.task`` (a :class:`~reservoir.tasks.TaskData` already in memory).
    """
    from reservoir.backbones import load_backbone
    from reservoir.tasks import load_task

    timings = {}
    t0 = time.perf_counter()
    task = task if task is not None else load_task(config.task, config.task_params)
    timings["task_s"] = time.perf_counter() - t0
    resolve_device(config.device)  # a bad device is refused before the model loads
    requested_depth = None
    if config.layers is not None:
        requested_depth = config.layers if isinstance(config.layers, int) else max(config.layers)
    t0 = time.perf_counter()
    backbone = load_backbone(config.backbone, init=config.init, depth=requested_depth, d_in=task.d_in,
                             seed=config.seed, projection_gain=config.projection_gain, revision=config.revision)
    prep = _prepared(config, task, backbone, timings)
    timings["model_s"] = time.perf_counter() - t0
    return prep


def _prepared(config: ExtractConfig, task, backbone, timings: dict[str, float]) -> Prepared:
    """Check a task and a loaded backbone against each other and the settings; the store's attributes."""
    device = resolve_device(config.device)
    if backbone.projection_info is None:
        raise ReservoirError("expected a backbone from reservoir.load_backbone (its input projection recorded), "
                             f"found a {type(backbone).__name__} without projection_info")
    if backbone.projection_info["d_in"] != task.d_in:
        raise ReservoirError(f"task {task.name!r} has inputs of size d_in={task.d_in}, the backbone's projection "
                             f"takes d_in={backbone.projection_info['d_in']}; load the backbone with "
                             f"d_in=task.d_in")
    layers = resolve_layers(config.layers, backbone.depth)
    if task.n_out_tokens > 1 and config.pooling != ["last"]:
        raise ReservoirError(f"task {task.name!r} reads its last {task.n_out_tokens} tokens, one row each; expected "
                             f"--pooling last, found {','.join(config.pooling)}")
    s_layer = config.full_seq_layer
    if s_layer is not None and not 0 <= s_layer < max(layers):
        raise ReservoirError(f"--full-seq-layer must be below the depth {max(layers)} (blocks above it train from the "
                             f"store), found {s_layer}")
    truncated = None
    if task.max_length > backbone.info.max_positions:
        if not config.truncate:
            check_positions(task, backbone, config.backbone,
                            f" (pass --truncate to keep the first {backbone.info.max_positions})")
        task = dataclasses.replace(task, splits=dict(task.splits))  # the caller's task stays whole
        truncated = truncate_task(task, backbone.info.max_positions)
    attrs = {
        # the depth a store needs is its top layer, however many blocks the backbone object holds
        "backbone": {**backbone.info.to_dict(), "depth": max(layers)},
        "projection": {**backbone.projection_info, "input": task.kind},
        "task": {"name": task.name, "params": task.params, "fingerprint": task.fingerprint,
                 "n_classes": task.n_classes, "label_shape": list(task.label_shape), "vocab": task.vocab,
                 "truncated": truncated},
        "layers": layers,
        "pooling": {"kinds": list(config.pooling), "n_out_tokens": task.n_out_tokens},
        "dtype": config.dtype,
        "full_seq_layer": s_layer,
    }
    # saved in float32 before the weights are cast to the compute dtype
    final_norm = backbone.final_norm_arrays()
    projection_weight = backbone.input.weight.detach().cpu().t().numpy()
    backbone, context = cast_for_inference(backbone, device, config.amp)
    return Prepared(config, task, backbone, device, layers, attrs, projection_weight, final_norm, context, timings)


def extract(task, backbone, out, *, layers: list[int] | int | None = None, pooling: str | list[str] = "last",
            dtype: str = "float16", batch_size: int | None = None, max_tokens: int | None = None,
            device: str = "auto", amp: str = "auto", format: str | None = None, full_seq_layer: int | None = None,
            truncate: bool = False, progress: bool = True, timings: dict[str, float] | None = None,
            sharded: bool = False):
    """Run a task through a frozen backbone once and write (or resume) a feature store at ``out``.

    Parameters
    ----------
    task : TaskData
        A built-in task (:func:`reservoir.get_task`) or one from arrays
        (:meth:`reservoir.TaskData.from_arrays`).
    backbone : ReservoirBackbone
        From :func:`reservoir.load_backbone`, with ``d_in=task.d_in``. It is
        moved to ``device``, and on CUDA its frozen weights are cast to the
        compute dtype (``amp``) in place.
    out : str, path or FeatureStore
        The store (``.zarr`` folder or ``.h5`` file; ``format`` overrides the suffix), or a store handle whose
        store to resume.
    layers : int or list of int, optional
        Depth ``K`` (store layers ``0..K``; blocks above ``K`` never run) or
        an explicit list; default every layer of the backbone.
    pooling : str or list of str
        How each layer becomes a row: ``"last"`` (the last real token, or
        the task's last ``n_out_tokens``), ``"first"`` (token 0), ``"mean"``
        (over the real tokens; padding never counts), or several at once
        (``["last", "mean"]`` or ``"last,mean"``), all from one pass.
    dtype, batch_size, max_tokens, device, amp, full_seq_layer, truncate
        As the options of ``reservoir extract``.
    timings : dict, optional
        Receives ``pass_s``, the seconds of the pass with its store writes.

    With ``sharded=True``, under ``torchrun`` with several processes, every
    rank calls it with the same arguments and writes its share of one Zarr
    store (:mod:`reservoir.distributed`); by default the calling process
    extracts alone, whatever job it is part of.

    Returns
    -------
    FeatureStore
        The complete store, open for reading (close it, or use it in a ``with``).

    Examples
    --------
    >>> from reservoir import get_task, load_backbone
    >>> task = get_task("digits")
    >>> bb = load_backbone("tiny-bert", d_in=task.d_in)
    >>> with extract(task, bb, "/tmp/doc-digits.zarr", layers=2, progress=False) as store:  # doctest: +SKIP
    ...     store.features("test").shape
    (360, 3, 1, 32)
    """
    from reservoir.store import FeatureStore

    out = out.path if isinstance(out, FeatureStore) else out  # a store handle names the store to resume
    info = backbone.info
    config = ExtractConfig(task=task.name, backbone=info.id, init=info.init, layers=layers, out=str(out),
                           format=format, task_params=task.params, seed=info.seed,
                           projection_gain=(backbone.projection_info or {}).get("gain", options.PROJECTION_GAIN),
                           batch_size=batch_size, max_tokens=max_tokens, dtype=dtype, device=device, amp=amp,
                           revision=info.revision, full_seq_layer=full_seq_layer, truncate=truncate,
                           pooling=check_poolings(pooling))
    _check_out(Path(out), format)
    with distributed.launch(Path(out), format, device, sharded) as job:  # one process, or a rank of a torchrun job
        prep = job.prepare(lambda cfg, t: _prepared(cfg, t, backbone, {}), config, task)
        _write_store(prep, Path(out), progress, job)
    if timings is not None:
        timings.update(prep.timings)
    return FeatureStore.open(out)


def run(config: ExtractConfig, progress: bool = True, task=None, timings: dict[str, float] | None = None) -> Path:
    """Build the task and backbone ``config`` names, extract them into ``config.out`` (what ``reservoir extract`` does).

    Everything is validated (task, backbone, depth, positions, output path)
    before anything is written; an interrupted run leaves a store with
    ``complete = False`` that the same command resumes. ``task`` overrides
    building ``config.task``. ``timings``, when given, receives the seconds
    spent on the task (``task_s``), the model (``model_s``) and the pass
    itself (``pass_s``, store writes included). Under ``torchrun`` with
    several processes, every rank calls it and writes its share of one store
    (:mod:`reservoir.distributed`).

    Examples
    --------
    >>> path = run(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=2,
    ...                          task_params={"n_train": 64, "n_test": 32},
    ...                          out="/tmp/xor.zarr"), progress=False)  # doctest: +SKIP
    """
    out = Path(config.out or config.default_out())
    _check_out(out, config.format)
    with distributed.launch(out, config.format, config.device) as job:  # one process, or a rank of a torchrun job
        prep = job.prepare(prepare, config, task)
        _write_store(prep, out, progress, job)
    if timings is not None:
        timings.update(prep.timings)
    return out


def _check_out(out: Path, fmt: str | None) -> None:
    """What the output path alone decides, refused before the task and the model load: a file that is not a
    store, a ``--format`` that contradicts the store there, a folder that cannot be written."""
    from reservoir.io import writable_folder
    from reservoir.store import detect_format

    detect_format(out, fmt)
    writable_folder(out.absolute().parent, for_path=out)


def _write_store(prep: Prepared, out: Path, progress: bool, job=distributed.LOCAL) -> None:
    """Create (or reopen and repair) the store at ``out`` and write every unfinished chunk; record ``pass_s``.

    A rank of a sharded job (``job``) writes its share of the chunks (:func:`reservoir.distributed.write_sharded`).
    """
    if job.world > 1:
        return distributed.write_sharded(job, prep, out, progress, lambda: _create_store(prep, out, progress),
                                         write_splits)
    fresh = not out.exists()
    store = _create_store(prep, out, progress)
    t0 = time.perf_counter()
    with store:  # closed on the way out; an error already in flight is the one reported
        try:
            if not store.complete:
                write_splits(prep, store, progress)
                store.mark_complete()
        except BaseException:
            if fresh:
                store.discard()  # a store of this run with no chunk written is not left behind
            raise
    prep.timings["pass_s"] = time.perf_counter() - t0


def _create_store(prep: Prepared, out: Path, progress: bool):
    """The store at ``out``, created or reopened (and repaired) with its write lock (``FeatureStore.create``)."""
    from reservoir.store import FeatureStore

    task = prep.task
    return FeatureStore.create(
        out,
        prep.attrs,
        splits={name: (len(s), task.label_shape) for name, s in task.splits.items()},
        feature_shape=(len(prep.layers), task.n_out_tokens, prep.backbone.n_dim),
        projection_weight=prep.projection_weight,
        final_norm=prep.final_norm,
        fmt=prep.config.format,
        states_length=task.max_length if prep.config.full_seq_layer is not None else None,
        progress=progress,
    )


@dataclass
class PlannedWindow:
    """One window of one split as the pass runs it: its rows' length order and batch bounds, and the split's bar."""

    name: str  # the split's name
    split: Any  # the task's Split
    window: Window
    order: np.ndarray  # (n,) positions in window.rows, by increasing length
    bounds: list[tuple[int, int]]  # batch i is order[lo:hi]
    bar: Any  # the split's progress bar


@dataclass
class FinishedWindow:
    """A computed window on its way to the store (what the pass hands the background writer)."""

    planned: PlannedWindow
    feats: Any  # (n, P, n_layers, n_out, n_dim) host tensor, pinned on CUDA
    states: Any  # (n, L, n_dim) host tensor or None
    ready: Any  # the CUDA event that marks the copy to the host done; None on the CPU


def write_splits(prep: Prepared, store, progress: bool = True, job=distributed.LOCAL) -> None:
    """Compute every unfinished chunk of every split and write it (the pass itself; ``job``: this rank's share)."""
    import torch

    from reservoir.writer import ChunkWriter

    engine = prep.engine()

    def write(item: FinishedWindow) -> None:
        name, split, window = item.planned.name, item.planned.split, item.planned.window
        if item.ready is not None:
            item.ready.synchronize()  # the window's device-to-host copy has landed
        feats = item.feats.numpy()  # (n, P, n_layers, n_out, n_dim)
        states = None if item.states is None else item.states.numpy()
        todo = [c for c in window.chunks if c not in window.done]  # done ones ran only to batch rows as before
        rows = window.rows  # the split's rows of window.chunks, chunk after chunk
        if window.done:
            keep = ~np.isin(rows // store.chunk_rows(name), window.done)  # (n,) the rows of chunks still to write
            rows, feats, states = rows[keep], feats[keep], None if states is None else states[keep]
        store.write_chunks(name, todo, {p: feats[:, i] for i, p in enumerate(store.poolings)}, split.labels[rows],
                           lengths=split.lengths[rows], states=states)

    with ChunkWriter(write) as writer, torch.inference_mode(), prep.context:
        for w in iter_windows(prep, store, progress, job=job):
            feats, states = engine.run(w.split.inputs, w.split.lengths, w.window.rows, w.order, w.bounds,
                                       progress=w.bar)
            writer.submit(FinishedWindow(w, *to_host(feats, states)))


def iter_windows(prep: Prepared, store, progress: bool = True, every_chunk: bool = False, job=distributed.LOCAL):
    """Yield a :class:`PlannedWindow` for every unfinished window.

    The one plan both the pass and ``bench extract``'s bare forward follow
    (the latter with ``every_chunk``: the windows of a fresh store). A split
    of varying lengths runs the windows of a fresh store that hold an
    unfinished chunk, so a resumed store equals an uninterrupted one bit for
    bit (:func:`~reservoir.batching.plan_windows` with ``stable``). ``job``
    deals the unfinished chunks (a rank of a sharded run gets its share of
    the windows) and gives the progress bar.
    """
    cfg = prep.config
    for name, split in prep.task.splits.items():
        todo = np.arange(len(store.done(name))) if every_chunk else job.todo(store, name)
        varying = len(split) > 0 and int(split.lengths.min()) != int(split.lengths.max())
        windows = job.deal(todo, lambda chunks: plan_windows(chunks, store.chunk_rows(name), len(split),
                                                             _row_bytes(store, name, split), stable=varying),
                           split.lengths)
        with job.bar(name, sum(len(w.rows) for w in windows), progress) as bar:
            for w in windows:
                yield PlannedWindow(name, split, w, *plan_order(split.lengths[w.rows], cfg.batch_size, cfg.max_tokens),
                                    bar)


def _row_bytes(store, name: str, split) -> int:
    """Host bytes one row of a window takes: its stored features (and states) plus its inputs."""
    itemsize = np.dtype(store.attrs["dtype"]).itemsize
    row = len(store.poolings) * int(np.prod(store.features(name).shape[1:])) * itemsize
    if store.full_seq_layer is not None:
        row += int(np.prod(store.shape(name, "states")[1:])) * itemsize
    return row + int(np.prod(split.inputs.shape[1:])) * split.inputs.dtype.itemsize
