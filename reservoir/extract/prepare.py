"""Everything an extraction needs, built and checked before anything is written: :class:`ExtractionPlan`.

:func:`prepare` builds the task and the backbone an :class:`ExtractConfig`
names; :func:`plan_extraction` checks a task and a loaded backbone against
each other and the settings (projection width, depth, positions, poolings),
truncates the task where asked, records the store's attributes, and casts
the backbone to its compute dtype on its device.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.extract.config import ExtractConfig, resolve_layers
from reservoir.extract.engine import Engine
from reservoir.extract.plan import resolve_batching
from reservoir.runtime import cast_for_inference, check_positions, compute_dtype, resolve_device

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from reservoir.backbones.model import ReservoirBackbone
    from reservoir.tasks import TaskData


@dataclass
class ExtractionPlan:
    """A validated extraction before anything is written: the task, the backbone on its device, the store's settings."""

    config: ExtractConfig
    task: TaskData  # truncated to the backbone's positions where the config asks for it
    backbone: ReservoirBackbone  # on ``device``, in its compute dtype
    device: torch.device
    layers: list[int]  # the store's layers, sorted
    attrs: dict[str, Any]  # the store's key and provenance (WritableStore.create)
    projection_weight: np.ndarray  # (d_in, n_dim) float32, saved before the cast
    final_norm: dict[str, np.ndarray] | None  # the final norm's float32 arrays, or None (identity)
    context: contextlib.AbstractContextManager  # what forwards run in (autocast for the LSTM baseline, else nothing)
    timings: dict[str, float]  # task_s, model_s, then pass_s and the writer's account (passes.write_splits)
    batching: tuple[int | None, int | None]  # (batch_size, max_tokens) the pass runs with (resolve_batching)

    def engine(self, out_dtype: torch.dtype | None = None) -> Engine:
        """The :class:`Engine` this extraction runs (``out_dtype``: the store dtype by default)."""
        import torch

        dtype = out_dtype or getattr(torch, self.config.dtype)
        s_layer = self.config.full_seq_layer
        return Engine(self.backbone, self.layers, self.task.n_out_tokens, self.device, dtype, s_layer,
                      self.task.max_length if s_layer is not None else None, tuple(self.config.pooling))

    def states_length(self) -> int | None:
        """Positions of the stored full-sequence states (the task's longest sequence), or ``None`` without them."""
        return self.task.max_length if self.config.full_seq_layer is not None else None


def prepare(config: ExtractConfig, task: TaskData | None = None) -> ExtractionPlan:
    """Build and check everything an extraction needs (task, backbone, depth, positions); write nothing.

    ``task`` overrides building ``config.task`` (a :class:`~reservoir.tasks.TaskData` already in memory).
    """
    from reservoir.backbones import load_backbone
    from reservoir.tasks import load_task

    resolve_device(config.device)  # a bad device is refused before any work
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    task = task if task is not None else load_task(config.task, config.task_params)
    timings["task_s"] = time.perf_counter() - t0
    requested_depth = None
    if config.layers is not None:
        requested_depth = config.layers if isinstance(config.layers, int) else max(config.layers)
    t0 = time.perf_counter()
    backbone = load_backbone(config.backbone, init=config.init, depth=requested_depth, d_in=task.d_in,
                             seed=config.seed, projection_gain=config.projection_gain, revision=config.revision,
                             projection=config.projection)
    plan = plan_extraction(config, task, backbone, timings, owned=True)
    timings["model_s"] = time.perf_counter() - t0
    return plan


def plan_extraction(config: ExtractConfig, task: TaskData, backbone: ReservoirBackbone,
                    timings: dict[str, float] | None = None, *, owned: bool = False) -> ExtractionPlan:
    """Check a task and a loaded backbone against each other and the settings; the store's attributes.

    The backbone is moved to the config's device and cast to the compute
    dtype: in place when ``owned`` (loaded for this extraction), else a copy
    is cast, so the caller's float32 weights stay as they were. The caller's
    task stays whole (a truncated copy is planned).
    """
    device = resolve_device(config.device)
    kept = sorted({str(p.dtype).removeprefix("torch.") for p in backbone.parameters() if p.is_floating_point()})
    if not owned and kept != ["float32"]:  # the weights hashed and the compute dtype recorded are float32's
        raise ReservoirError(f"expected a backbone with float32 weights, as reservoir.load_backbone gives (amp= casts "
                             f"a copy for the forward); found {', '.join(kept) or 'no floating weights'}")
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
        if max(layers) == 0:
            raise ReservoirError("--full-seq-layer needs a depth of at least 1 (blocks above it train from the "
                                 "store), found --layers 0")
        raise ReservoirError(f"--full-seq-layer must be within 0..{max(layers) - 1}, below the depth {max(layers)} "
                             f"(blocks above it train from the store), found {s_layer}")
    truncated = None
    if task.max_length > backbone.info.max_positions:
        if not config.truncate:
            check_positions(task, backbone, config.backbone,
                            f" (pass --truncate to keep the first {backbone.info.max_positions})")
        task = dataclasses.replace(task, splits=dict(task.splits))  # the caller's task stays whole
        truncated = truncate_task(task, backbone.info.max_positions)
    computed = compute_dtype(device, config.amp)
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
        # what the forward computed in (a float32 store may hold bf16-computed features): never mixed in one store
        "compute_dtype": str(computed).removeprefix("torch."),
        "full_seq_layer": s_layer,
    }
    # saved in float32 before the weights are cast to the compute dtype
    final_norm = backbone.final_norm_arrays()
    projection_weight = backbone.input.weight.detach().cpu().t().numpy()
    if not owned and computed != next(backbone.parameters()).dtype:
        backbone = copy.deepcopy(backbone)  # the caller's model is not theirs to keep otherwise
    backbone, context = cast_for_inference(backbone, device, config.amp)
    batching = resolve_batching(config.batch_size, config.max_tokens, device, backbone.n_dim)
    # how rows were batched shapes their features (each batch's padding): recorded, and one per store (not its key:
    # a complete store is read whatever batching made it)
    attrs["batching"] = {"batch_size": batching[0], "max_tokens": batching[1]}
    return ExtractionPlan(config, task, backbone, device, layers, attrs, projection_weight, final_norm, context,
                          {} if timings is None else timings, batching)


def truncate_task(task: TaskData, max_tokens: int) -> dict[str, Any]:
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
