"""One pass of a task through a frozen backbone into a feature store.

For each split, rows are processed one store chunk at a time: the chunk's rows
are sorted by length and cut into batches (length bucketing: a batch is padded
only to its own longest sequence), each batch runs blocks ``1..max(layers)``
once under ``inference_mode``, and the hidden states at the last
``n_out_tokens`` real positions of every requested layer are written back by
row index. A chunk's ``done`` flag is set after its rows are written, so a rerun
with the same settings skips finished chunks.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError

DTYPES = ("float16", "float32")


@dataclass
class ExtractConfig:
    """Everything that defines one extraction (saved, in parts, in the store's attrs)."""

    task: str = field(metadata={"help": "registered task name"})
    backbone: str = field(default="minilm", metadata={"help": "backbone name, hub id or folder"})
    init: str = field(default="pretrained", metadata={"help": "pretrained | random | stats"})
    layers: list[int] | int | None = field(
        default=None, metadata={"help": "depth K (store layers 0..K) or an explicit list; default all"}
    )
    out: str | None = field(default=None, metadata={"help": "store path; default cache/<task>-<backbone>-<init>.zarr"})
    format: str | None = field(default=None, metadata={"help": "zarr | hdf5; default from the suffix"})
    task_params: dict[str, Any] = field(default_factory=dict, metadata={"help": "task parameters"})
    seed: int = field(default=0, metadata={"help": "seed of the random/stats inits and the projection"})
    projection_gain: float = field(default=1.41, metadata={"help": "gain of the orthogonal input projection"})
    batch_size: int = field(default=64, metadata={"help": "sequences per forward"})
    dtype: str = field(default="float16", metadata={"help": "store dtype: float16 | float32"})
    device: str = field(default="auto", metadata={"help": "cpu | cuda | cuda:N | auto"})
    amp: str = field(default="auto", metadata={"help": "CUDA autocast: bf16 | fp16 | none | auto"})
    revision: str | None = field(default=None, metadata={"help": "hub revision for hub ids"})
    full_seq_layer: int | None = field(default=None, metadata={
        "help": "also store every position's state at this layer (a split-point store for `train --from-store`)"})
    truncate: bool = field(default=False, metadata={
        "help": "cut sequences longer than the backbone's positions to their first max_positions tokens "
                "(recorded in the store); without it such sequences are an error"})

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ReservoirError(f"unknown store dtype {self.dtype!r}; expected one of: {', '.join(DTYPES)}")
        if self.batch_size < 1:
            raise ReservoirError(f"batch size must be >= 1, found {self.batch_size}")
        if self.amp not in ("auto", "bf16", "fp16", "none"):
            raise ReservoirError(f"unknown amp {self.amp!r}; expected bf16, fp16, none or auto")

    def default_out(self) -> str:
        name = Path(self.backbone).name if os.sep in self.backbone else self.backbone.replace("/", "_")
        return str(Path("cache") / f"{self.task}-{name}-{self.init}.zarr")


def resolve_layers(layers: list[int] | int | None, n_layer: int) -> list[int]:
    """``K`` -> ``[0..K]``; a list is checked, sorted and deduplicated."""
    if layers is None:
        layers = n_layer
    wanted = list(range(layers + 1)) if isinstance(layers, int) else sorted(set(int(k) for k in layers))
    if not wanted or wanted[0] < 0 or wanted[-1] > n_layer:
        found = layers if isinstance(layers, int) else wanted
        raise ReservoirError(f"--layers must be within 0..{n_layer} for this backbone, found {found}")
    return wanted


def resolve_device(device: str) -> "Any":
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ReservoirError(f"device {device!r} asked for, found no CUDA device")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ReservoirError(f"unknown device {device!r}; expected cpu, cuda or cuda:N") from err


def autocast(device, amp: str):
    """CUDA autocast in the asked dtype (auto: bf16 where supported); a no-op on CPU or with amp="none"."""
    import torch

    if device.type != "cuda" or amp == "none":
        return contextlib.nullcontext()
    if amp == "auto":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return torch.autocast("cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def _to_device(arr: np.ndarray, device):
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def extract_rows(backbone, inputs: np.ndarray, lengths: np.ndarray, layers: list[int], n_out_tokens: int,
                 batch_size: int, device, amp: str = "auto", progress=None, full_seq_layer: int | None = None,
                 max_length: int | None = None):
    """Features ``(N, len(layers), n_out_tokens, n_dim)`` float32 for the given rows, bucketed by length.

    With ``full_seq_layer`` also every position's state at that layer,
    ``(N, max_length, n_dim)`` zero-padded, as a second return value.
    """
    import torch

    n = len(inputs)
    out = np.empty((n, len(layers), n_out_tokens, backbone.n_dim), dtype=np.float32)
    full = None
    if full_seq_layer is not None:
        full = np.zeros((n, max_length or inputs.shape[1], backbone.n_dim), dtype=np.float32)
    order = np.argsort(lengths, kind="stable")
    with torch.inference_mode(), autocast(device, amp):
        for lo in range(0, n, batch_size):
            rows = order[lo : lo + batch_size]
            L = int(lengths[rows].max())
            x = _to_device(inputs[rows, :L], device)
            lens = _to_device(lengths[rows].astype(np.int64), device)
            res = backbone.features(x, lens, layers, n_out_tokens, full_seq_layer)
            feats = res if full is None else res[0]  # (b, n_layers, n_out, n_dim)
            out[rows] = feats.float().cpu().numpy()
            if full is not None:
                states = res[1].float().cpu().numpy()  # (b, L, n_dim)
                states *= (np.arange(L)[None, :] < lengths[rows][:, None])[..., None]  # padding stays zero
                full[rows, :L] = states
            if progress is not None:
                progress.update(len(rows))
    return out if full is None else (out, full)


def check_positions(task, backbone, name: str, hint: str = "") -> None:
    """Refuse a task whose sequences are longer than the backbone's position table."""
    if task.max_length > backbone.info.max_positions:
        raise ReservoirError(f"task {task.name!r} has sequences of up to {task.max_length} tokens; backbone {name!r} "
                             f"has {backbone.info.max_positions} positions{hint}")


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


def extract(config: ExtractConfig, progress: bool = True) -> Path:
    """Run ``config.task`` through the backbone once and write (or resume) a feature store.

    Everything is validated (task, backbone, depth, positions, output path)
    before anything is written; an interrupted run leaves a store with
    ``complete = False`` that the same command resumes.

    Examples
    --------
    >>> path = extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=2,
    ...                              task_params={"n_train": 64, "n_test": 32},
    ...                              out="/tmp/xor.zarr"), progress=False)  # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    from reservoir.backbones import load_backbone
    from reservoir.store import FeatureStore
    from reservoir.tasks import get_task

    task = get_task(config.task, **config.task_params)
    device = resolve_device(config.device)
    requested_depth = None
    if config.layers is not None:
        requested_depth = config.layers if isinstance(config.layers, int) else max(config.layers)
    backbone = load_backbone(
        config.backbone,
        init=config.init,
        depth=requested_depth,
        d_in=task.d_in,
        seed=config.seed,
        projection_gain=config.projection_gain,
        revision=config.revision,
    )
    layers = resolve_layers(config.layers, backbone.depth)
    s_layer = config.full_seq_layer
    if s_layer is not None and not 0 <= s_layer < max(layers):
        raise ReservoirError(f"--full-seq-layer must be below the depth {max(layers)} (blocks above it train from the "
                             f"store), found {s_layer}")
    truncated = None
    if task.max_length > backbone.info.max_positions:
        if not config.truncate:
            check_positions(task, backbone, config.backbone,
                            f" (pass --truncate to keep the first {backbone.info.max_positions})")
        truncated = truncate_task(task, backbone.info.max_positions)
    backbone.to(device)
    out = config.out or config.default_out()
    attrs = {
        "backbone": backbone.info.to_dict(),
        "projection": {"kind": "orthogonal", "gain": config.projection_gain, "seed": config.seed, "d_in": task.d_in,
                       "input": task.kind},
        "task": {"name": task.name, "params": task.params, "fingerprint": task.fingerprint,
                 "n_classes": task.n_classes, "label_shape": list(task.label_shape), "vocab": task.vocab,
                 "truncated": truncated},
        "layers": layers,
        "pooling": {"kind": "last_real_token", "n_out_tokens": task.n_out_tokens},
        "dtype": config.dtype,
        "full_seq_layer": s_layer,
    }
    final_norm = None
    if backbone.final_norm is not None:
        final_norm = {k: getattr(backbone.final_norm, k).detach().cpu().float().numpy() for k in ("weight", "bias")}
    store = FeatureStore.create(
        out,
        attrs,
        splits={name: (len(s), task.label_shape) for name, s in task.splits.items()},
        feature_shape=(len(layers), task.n_out_tokens, backbone.n_dim),
        projection_weight=backbone.input.weight.detach().cpu().t().numpy(),
        final_norm=final_norm,
        fmt=config.format,
        states_length=task.max_length if s_layer is not None else None,
    )
    with store:
        if store.complete:
            return Path(out)
        for name, split in task.splits.items():
            r = store.chunk_rows(name)
            todo = np.flatnonzero(~store.done(name))
            n_todo = sum(min(r, len(split) - c * r) for c in todo)
            bar = tqdm(total=n_todo, desc=f"extract {name}", unit="rows", disable=not progress, dynamic_ncols=True)
            with bar:
                for c in todo:
                    lo, hi = c * r, min((c + 1) * r, len(split))
                    res = extract_rows(backbone, split.inputs[lo:hi], split.lengths[lo:hi], layers,
                                       task.n_out_tokens, config.batch_size, device, config.amp, bar,
                                       s_layer, task.max_length)
                    feats, states = res if s_layer is not None else (res, None)
                    store.write_chunk(name, int(c), feats.astype(config.dtype), split.labels[lo:hi],
                                      states=None if states is None else states.astype(config.dtype),
                                      lengths=split.lengths[lo:hi])
        store.mark_complete()
    return Path(out)
