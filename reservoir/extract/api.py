"""The two ways into an extraction: :func:`extract` (a task and a backbone in hand) and :func:`run` (a config).

Both check the output path, join the job this process is part of (one
process, or a rank of a torchrun job: :mod:`reservoir.distributed`), plan the
extraction (:mod:`reservoir.extract.prepare`) and write the store, alone
(:func:`~reservoir.extract.passes.write_store`) or as a rank
(:func:`~reservoir.extract.sharded.write_sharded`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from reservoir import distributed, options
from reservoir.errors import ReservoirError
from reservoir.extract import sharded as sharding
from reservoir.extract.config import ExtractConfig, check_poolings
from reservoir.extract.passes import write_store
from reservoir.extract.prepare import ExtractionPlan, plan_extraction, prepare
from reservoir.store.files import store_path
from reservoir.store.remote import StoreURL

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.backbones.model import ReservoirBackbone
    from reservoir.store import FeatureStore
    from reservoir.tasks import TaskData


def extract(task: TaskData, backbone: ReservoirBackbone, out: str | Path | FeatureStore, *,
            layers: list[int] | int | None = None, pooling: str | list[str] = "last", dtype: str = "float16",
            batch_size: int | None = None, max_tokens: int | None = None, writers: int | None = None,
            device: str = "auto", amp: str = "auto", format: str | None = None, full_seq_layer: int | None = None,
            truncate: bool = False, progress: bool = True, timings: dict[str, float] | None = None,
            sharded: bool = False) -> FeatureStore:
    """Run a task through a frozen backbone once and write (or resume) a feature store at ``out``.

    Parameters
    ----------
    task : TaskData
        A built-in task (:func:`reservoir.get_task`) or one from arrays
        (:meth:`reservoir.TaskData.from_arrays`).
    backbone : ReservoirBackbone
        From :func:`reservoir.load_backbone`, with ``d_in=task.d_in``, its
        weights float32. It is moved to ``device`` when the compute dtype
        (``amp``) is float32; otherwise a copy is moved and cast, and the
        caller's model stays as it was.
    out : str, path or FeatureStore
        The store (``.zarr`` folder or ``.h5`` file, ``format`` overriding the suffix; or a Zarr store URL such
        as ``s3://bucket/prefix/x.zarr``), or a store handle whose store to resume (the handle is closed once
        the arguments are checked; use the store returned).
    layers : int or list of int, optional
        Depth ``K`` (store layers ``0..K``; blocks above ``K`` never run) or
        an explicit list; default every layer of the backbone.
    pooling : str or list of str
        How each layer becomes a row: ``"last"`` (the last real token, or
        the task's last ``n_out_tokens``), ``"first"`` (token 0), ``"mean"``
        (over the real tokens; padding never counts), or several at once
        (``["last", "mean"]`` or ``"last,mean"``), all from one pass.
    dtype, batch_size, max_tokens, writers, device, amp, full_seq_layer, truncate
        As the options of ``reservoir extract``.
    timings : dict, optional
        Receives ``pass_s``, the seconds of the pass with its store writes
        (nothing when the store was complete already: no pass ran).

    With ``sharded=True``, under ``torchrun`` with several processes, every
    rank calls it with the same arguments and writes its share of one Zarr
    store (:mod:`reservoir.extract.sharded`); by default the calling process
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
    from reservoir.backbones.model import ReservoirBackbone
    from reservoir.store import FeatureStore
    from reservoir.tasks import TaskData

    for what, value, kind, hint in (("task", task, TaskData, "reservoir.get_task(name) or TaskData.from_arrays"),
                                    ("backbone", backbone, ReservoirBackbone, "reservoir.load_backbone")):
        if not isinstance(value, kind):
            raise ReservoirError(f"expected {what} a {kind.__name__} (from {hint}); found {options.shown(value)}")
    if not isinstance(out, (FeatureStore, StoreURL, str, os.PathLike)):
        raise ReservoirError(f"expected out a store path (.zarr or .h5), URL or FeatureStore; found "
                             f"{options.shown(out)}")
    target = out.path if isinstance(out, FeatureStore) else out  # a store handle names the store to resume
    info, projection = backbone.info, backbone.projection_info or {}
    config = ExtractConfig(task=task.name, backbone=info.id, init=info.init, layers=layers, out=str(target),
                           format=format, task_params=task.params, seed=info.seed,
                           projection=projection.get("kind", options.PROJECTIONS[0]),
                           projection_gain=projection.get("gain") or options.PROJECTION_GAIN,
                           batch_size=batch_size, max_tokens=max_tokens, writers=writers, dtype=dtype,
                           device=device, amp=amp, revision=info.revision, full_seq_layer=full_seq_layer,
                           truncate=truncate,
                           pooling=check_poolings(pooling))
    where = store_path(target)
    if isinstance(out, FeatureStore):
        out.close()  # an HDF5 file open for reading cannot be opened again to write
    with open_job(where, format, device, sharded) as job:
        if isinstance(job, distributed.Job):
            plan = sharding.prepare_rank(job, config, task, backbone)
        else:
            plan = plan_extraction(config, task, backbone)
        _write(job, plan, where, progress)
    if timings is not None:
        timings.update(plan.timings)
    return FeatureStore.open(where)


def run(config: ExtractConfig, progress: bool = True, task: TaskData | None = None,
        timings: dict[str, float] | None = None) -> Path | StoreURL:
    """Build the task and backbone ``config`` names, extract them into ``config.out`` (what ``reservoir extract`` does).

    Everything is validated (task, backbone, depth, positions, output path)
    before anything is written; an interrupted run leaves a store with
    ``complete = False`` that the same command resumes. ``task`` overrides
    building ``config.task``. ``timings``, when given, receives the seconds
    spent on the task (``task_s``), the model (``model_s``) and the pass
    itself (``pass_s``, store writes included; absent when the store was
    complete already). Under ``torchrun`` with several processes, every rank
    calls it and writes its share of one store
    (:mod:`reservoir.extract.sharded`).

    Examples
    --------
    >>> path = run(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=2,
    ...                          task_params={"n_train": 64, "n_test": 32},
    ...                          out="/tmp/xor.zarr"), progress=False)  # doctest: +SKIP
    """
    out = store_path(config.out or config.default_out())
    with open_job(out, config.format, config.device) as job:
        if isinstance(job, distributed.Job):
            plan = sharding.prepare_rank(job, config, task)
        else:
            plan = prepare(config, task)
        _write(job, plan, out, progress)
    if timings is not None:
        timings.update(plan.timings)
    return out


def open_job(out: Path | StoreURL, fmt: str | None, device: str, sharded: bool | None = None):
    """The job to write ``out`` in, once what the output path alone decides is checked (before the task and the
    model load): a file that is not a store, a ``--format`` that contradicts the store there (or HDF5 on object
    storage), a folder that cannot be written, an output a sharded run cannot share."""
    from reservoir.io import writable_folder
    from reservoir.store import detect_format

    detect_format(out, fmt)
    if isinstance(out, Path):
        writable_folder(out.absolute().parent, for_path=out)
    else:
        out.check_outside_stores()
    if distributed.sharding(sharded):
        sharding.check_out(out, fmt, distributed.world_size())
    return distributed.launch(device, sharded)


def _write(job: distributed.Local, plan: ExtractionPlan, out: Path | StoreURL, progress: bool) -> None:
    """Write the store alone, or this rank's share of it with the job's other ranks."""
    if isinstance(job, distributed.Job) and job.world > 1:
        sharding.write_sharded(job, plan, out, progress)
    else:
        write_store(plan, out, progress)
