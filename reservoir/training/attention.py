"""Attention maps of a trained model (Lu et al., Figures 3-5).

:func:`attention` runs test inputs through a finished ``reservoir train`` run
(its best checkpoint, reloaded with eager attention so that the weights are
returned) and captures one block's attention probabilities with a forward
hook on that block's attention module (where :data:`ARCHS` says it lives).
:func:`plot_attention` draws, for one example, every head's query x key map,
and below them the readout token's attention per head averaged over the
split: where the head that the output layer reads looks.

Examples
--------
>>> maps = attention("results/train/bit-xor-minilm-pretrained-input+positions+layernorm+output-lr0.001-seed0")
... # doctest: +SKIP
>>> maps["weights"].shape  # (heads, L, L) of the chosen example  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reservoir.errors import ReservoirError
from reservoir.io import save_figure


def capture_attention(model, x: torch.Tensor, lengths: torch.Tensor, layer: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass: block ``layer``'s (1-based) attention probabilities ``(B, heads, L, L)`` and the logits.

    The model's backbone must be loaded with ``attn_implementation="eager"``
    (SDPA does not return weights).
    """
    from reservoir.backbones.arch import get_module

    backbone = model.backbone
    arch = getattr(backbone, "arch", None)
    if arch is None:
        raise ReservoirError(f"backbone {backbone.info.id!r} has no attention (expected a transformer, found "
                             f"{backbone.info.family})")
    if not 1 <= layer <= backbone.depth:
        raise ReservoirError(f"--layer must be within 1..{backbone.depth} (the model's blocks), found {layer}")
    module = get_module(backbone.blocks[layer - 1], arch.attention_weights)
    seen: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise ReservoirError("the attention module returned no weights; load the backbone with "
                                 "attn_implementation='eager'")
        seen.append(weights.detach().float())

    handle = module.register_forward_hook(hook)
    try:
        with torch.inference_mode():
            logits = model(x, lengths)
    finally:
        handle.remove()
    return seen[0], logits


def _tick_labels(inputs: np.ndarray, length: int) -> list[str]:
    """Position (1-based), plus the value for one-number tokens or the id for token tasks."""
    if inputs.ndim == 1:  # token ids
        return [f"{i + 1} (#{int(inputs[i])})" for i in range(length)]
    if inputs.shape[-1] == 1:
        return [f"{i + 1} ({inputs[i, 0]:g})" for i in range(length)]
    return [str(i + 1) for i in range(length)]


def attention(run_dir: str | os.PathLike, layer: int = 1, example: int = 0, split: str = "test",
              max_examples: int = 1000, device: str = "cpu") -> dict[str, Any]:
    """One block's attention in a trained run: one example's maps and the readout token's mean attention.

    Returns a dict with ``weights`` ``(heads, L, L)`` for ``example``,
    ``readout_mean`` ``(heads, L)`` (the last real token's attention, averaged
    over the first ``max_examples`` examples of ``split`` that have the
    example's length), ``ticks``, ``label``, ``prediction``, ``config`` and
    ``n_averaged``.
    """
    from reservoir.training import load_run

    task, model, config = load_run(run_dir, device=device, attn_implementation="eager")
    if split not in task.splits:
        raise ReservoirError(f"unknown split {split!r}; expected one of: {', '.join(task.splits)}")
    sp = task.splits[split]
    if not 0 <= example < len(sp):
        raise ReservoirError(f"--example must be within 0..{len(sp) - 1} ({split} split), found {example}")
    dev = next(model.parameters()).device
    length = int(sp.lengths[example])
    # examples of the same length share positions, so their maps average cleanly (no padding)
    rows = np.flatnonzero(sp.lengths == length)[:max_examples]
    rows = np.concatenate([[example], rows[rows != example]])
    x = torch.as_tensor(np.asarray(sp.inputs[rows])[:, :length], device=dev)
    if x.is_floating_point():
        x = x.float()
    lengths = torch.full((len(rows),), length, device=dev)
    weights, logits = capture_attention(model, x, lengths, layer)  # (n, H, L, L), (n, n_out, heads, classes)
    prediction = logits[0].argmax(-1).reshape(-1).cpu().numpy()
    return {
        "weights": weights[0].cpu().numpy(),
        "readout_mean": weights[:, :, length - 1, :].mean(0).cpu().numpy(),
        "n_averaged": len(rows),
        "ticks": _tick_labels(np.asarray(sp.inputs[example]), length),
        "label": np.asarray(sp.labels[example]).reshape(-1),
        "prediction": prediction,
        "config": config,
        "layer": layer,
        "example": example,
        "split": split,
    }


def figure_path(path: str | os.PathLike) -> Path:
    """Where a figure asked for at ``path`` is written: ``path`` itself, or ``<path>.png`` when it has no suffix;
    a suffix matplotlib cannot write is refused in one line.

    Examples
    --------
    >>> figure_path("maps/att"), figure_path("maps/att.svg")
    (PosixPath('maps/att.png'), PosixPath('maps/att.svg'))
    """
    from matplotlib.backend_bases import FigureCanvasBase

    out = Path(path)
    if out.exists() and not out.is_file():  # a folder or a device: never a figure written beside it
        found = "a folder" if out.is_dir() else "a device or other special file"
        raise ReservoirError(f"--out {out}: expected a figure file path; found {found}")
    if not out.suffix:
        return out.with_name(out.name + ".png")
    kinds = FigureCanvasBase.get_supported_filetypes()
    if out.suffix[1:].lower() not in kinds:
        raise ReservoirError(f"--out {out}: expected a figure file ending in {', '.join('.' + k for k in kinds)} "
                             f"(or no suffix: .png), found {out.suffix!r}")
    return out


def plot_attention(maps: dict[str, Any], path: str | os.PathLike) -> Path:
    """Every head's query x key map for the example, then the readout token's mean attention per head.

    Returns where the figure was written (:func:`figure_path` of ``path``).
    """
    from matplotlib.figure import Figure

    w, mean = maps["weights"], maps["readout_mean"]
    n_heads, L, _ = w.shape
    cols = min(n_heads, 4)
    rows = -(-n_heads // cols)
    size = 2.4 + 0.08 * L
    fig = Figure(figsize=(cols * size, rows * size + 0.35 * n_heads + 1.5), layout="constrained")
    grid = fig.add_gridspec(rows + 1, cols, height_ratios=[size] * rows + [0.35 * n_heads + 0.8])
    ticks = maps["ticks"] if L <= 32 else None
    image = None
    for h in range(n_heads):
        ax = fig.add_subplot(grid[h // cols, h % cols])
        image = ax.imshow(w[h], vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"head {h + 1}", fontsize="small")
        if ticks is not None:
            ax.set_xticks(range(L), ticks, fontsize=6, rotation=90)
            ax.set_yticks(range(L), ticks, fontsize=6)
        if h % cols == 0:
            ax.set_ylabel("query position (value)")
        ax.set_xlabel("key position (value)", fontsize="small")
    fig.colorbar(image, ax=fig.axes, shrink=0.6, label="attention")
    ax = fig.add_subplot(grid[rows, :])
    ax.imshow(mean, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_yticks(range(n_heads), [f"head {h + 1}" for h in range(n_heads)], fontsize=6)
    if ticks is not None:
        ax.set_xticks(range(L), ticks, fontsize=7)
    ax.set_title(f"readout token (position {L}) attention, mean over {maps['n_averaged']} {maps['split']} examples "
                 f"of length {L}", fontsize="small")
    c = maps["config"]
    label = " ".join(str(int(v)) for v in maps["label"])
    pred = " ".join(str(int(v)) for v in maps["prediction"])
    fig.suptitle(f"{c.task}: layer {maps['layer']} attention of {c.backbone} ({c.init}, trained {c.finetune}); "
                 f"{maps['split']} example {maps['example']}, label {label}, predicted {pred}", fontsize="medium")
    out = figure_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out, fmt=out.suffix[1:].lower())


def summary(maps: dict[str, Any], top: int = 2) -> str:
    """Which key positions the readout token attends to most, per head (mean over the split)."""
    lines = []
    for h, row in enumerate(maps["readout_mean"]):
        best = np.argsort(row)[::-1][:top]
        lines.append(f"head {h + 1:>2}: " + ", ".join(f"position {i + 1} ({row[i]:.2f})" for i in best))
    return "\n".join(lines)
