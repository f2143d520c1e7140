"""The references extraction and training are timed against: the Hugging Face model a backbone is loaded from, its
own forward from input embeddings, and the naive way the official FPT code reads hidden states.

:func:`load_hf_model` loads the model with the backbone's weights recipe;
:func:`hf_forward` runs it from input embeddings (ViT in place of its patch
embedding); :func:`time_naive` times the naive way for ``bench extract``.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch

from reservoir.runtime import synchronize as _sync


def load_hf_model(name: str, init: str, seed: int, revision: str | None = None, depth: int | None = None):
    """The bare Hugging Face model a backbone is loaded from, with the same weights recipe (init, seed, stats draw),
    keeping blocks ``1..depth`` (all with ``None``); on the CPU, in float32, as loaded."""
    from reservoir.backbones.arch import arch_for, get_module
    from reservoir.backbones.load import _load_hf, _stats_init

    model, _, _ = _load_hf(name, init, seed, revision, "sdpa")
    if init == "stats":
        _stats_init(model, seed)
    if depth is not None:
        parent_path, _, attr = arch_for(model.config.model_type).blocks.rpartition(".")
        parent = get_module(model, parent_path) if parent_path else model
        setattr(parent, attr, torch.nn.ModuleList(list(getattr(parent, attr))[:depth]))
        model.config.num_hidden_layers = depth
    return model


def hf_model(prep, full: bool, dtype):
    """The backbone's Hugging Face model, frozen on the device: ``full`` keeps every block, else ``depth``."""
    cfg = prep.config
    model = load_hf_model(cfg.backbone, cfg.init, cfg.seed, cfg.revision, None if full else prep.backbone.depth)
    return model.eval().requires_grad_(False).to(prep.device, dtype=dtype)


#: Rows per batch of the naive way (the official code's batch size).
NAIVE_BATCH = 32


def time_naive(prep, naive_rows: int) -> dict[str, Any]:
    """The official code's way on about ``naive_rows`` rows: full model, all hidden states, padded to the maximum,
    fp32, in batches of :data:`NAIVE_BATCH`."""
    bb, dev, task = prep.backbone, prep.device, prep.task
    if bb.arch is None:
        return {"naive_s": float("nan"), "naive_rows": 0}
    hf = hf_model(prep, full=True, dtype=torch.float32)
    proj = copy.deepcopy(bb.input).float()
    L = task.max_length

    def batch(hf, split, lo: int, n: int) -> int:
        x = np.zeros((n, L, *split.inputs.shape[2:]), dtype=split.inputs.dtype)
        x[:, : split.inputs.shape[1]] = split.inputs[lo : lo + n, :L]
        emb = embed_fp32(proj, torch.from_numpy(x).to(dev))
        hs = hf_forward(hf, emb, None, output_hidden_states=True).hidden_states
        torch.stack([h[:, -1] for h in hs], dim=1).cpu()  # (b, n_layer + 1, n_dim), as the official code reads
        return n

    # The run it stands for: each split in batches of NAIVE_BATCH rows, a partial one last. Every batch has the same
    # padded shape, so a whole batch costs the same in any split: time `k` whole batches and every partial one, and
    # scale the whole ones by their count (rows would overstate a launch-bound GPU's partial batches).
    B = NAIVE_BATCH
    wholes = [(split, lo) for split in task.splits.values() for lo in range(0, len(split) - B + 1, B)]
    partials = [(split, len(split) - len(split) % B) for split in task.splits.values() if len(split) % B]
    k = min(len(wholes), max(1, round(naive_rows / B)))
    with torch.inference_mode():
        first = next(iter(task.splits.values()))
        batch(hf, first, 0, min(B, len(first)))  # untimed warm-up, as the other parts have: one whole batch
        _sync(dev)
        t0 = time.perf_counter()
        for split, lo in wholes[:k]:
            batch(hf, split, lo, B)
        _sync(dev)
        t1 = time.perf_counter()
        for split, lo in partials:
            batch(hf, split, lo, len(split) - lo)
        _sync(dev)
        t2 = time.perf_counter()
    del hf
    whole_s, partial_s = t1 - t0, t2 - t1
    return {"naive_rows": k * B + sum(len(split) - lo for split, lo in partials), "naive_timed_s": whole_s + partial_s,
            "naive_whole_batches_timed": k, "naive_whole_batches": len(wholes), "naive_whole_s": whole_s,
            "naive_partial_s": partial_s, "naive_s": (whole_s / k * len(wholes) if k else 0.0) + partial_s,
            "naive_padded_length": L}


class _GivenEmbeddings(torch.nn.Module):
    """Stands in for ViT's embedding module (ViTModel takes no ``inputs_embeds``): the given embeddings plus the
    patch position rows, then the embedding dropout, as :meth:`~reservoir.backbones.model.Backbone.embed` computes
    layer 0 (no CLS token; the table's CLS row is never read)."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.patch_embeddings = original.patch_embeddings  # ViTModel.forward reads its dtype
        self.position_embeddings = original.position_embeddings  # (1, n + 1, n_dim), the same parameter
        self.dropout = original.dropout

    def forward(self, embeds: torch.Tensor, **kwargs) -> torch.Tensor:
        L = embeds.shape[1]
        return self.dropout(embeds + self.position_embeddings[:, 1 : 1 + L])  # (B, L, n_dim)


def hf_forward(hf, embeds: torch.Tensor, mask: torch.Tensor | None, **kwargs):
    """The Hugging Face model's forward from input embeddings ``(B, L, n_dim)`` (ViT: in place of its patch
    embedding)."""
    if hf.config.model_type != "vit":
        return hf(inputs_embeds=embeds, attention_mask=mask, **kwargs)
    original = hf.embeddings
    hf.embeddings = _GivenEmbeddings(original)
    try:
        return hf(pixel_values=embeds, attention_mask=mask, **kwargs)
    finally:
        hf.embeddings = original


def embed_fp32(proj, x: torch.Tensor) -> torch.Tensor:
    """One-hot token ids or vectors through the projection, in float32."""
    if x.dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
        return torch.nn.functional.embedding(x.long(), proj.weight.t()) + proj.bias
    return proj(x.float())
