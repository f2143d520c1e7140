"""The model live training trains: a backbone and a linear head on its last real tokens, and the loss."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reservoir.backbones.model import last_token_index


def heads_per_token(label_shape: tuple[int, ...], n_out_tokens: int) -> int:
    """Label heads each output token predicts, from one row's label shape.

    ``()`` -> 1, ``(bits,)`` -> bits, ``(n_out_tokens, bits)`` -> bits.

    Examples
    --------
    >>> heads_per_token((), 1), heads_per_token((5,), 1), heads_per_token((20, 50), 20)
    (1, 5, 50)
    """
    shape = tuple(label_shape)[1:] if n_out_tokens > 1 else tuple(label_shape)
    return int(np.prod(shape)) if shape else 1


class ReservoirClassifier(nn.Module):
    """Backbone + linear head on the final-norm-applied last ``n_out_tokens`` positions.

    Output logits have shape ``(B, n_out_tokens, n_heads, n_classes)``. The
    head is initialized from ``seed`` alone (the global RNG is left as it
    was), so that live and cached training start from the same head.

    Examples
    --------
    >>> from reservoir.backbones import load_backbone
    >>> model = ReservoirClassifier(load_backbone("tiny-gpt2", d_in=4), n_out_tokens=1, n_heads=1, n_classes=2)
    >>> model(torch.randn(3, 5, 4), torch.tensor([5, 2, 4])).shape
    torch.Size([3, 1, 1, 2])
    """

    def __init__(self, backbone: nn.Module, n_out_tokens: int, n_heads: int, n_classes: int, seed: int = 0):
        super().__init__()
        self.backbone = backbone
        self.n_out_tokens, self.n_heads, self.n_classes = n_out_tokens, n_heads, n_classes
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = nn.Linear(backbone.n_dim, n_heads * n_classes)

    def _read(self, h: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        B = h.shape[0]
        rows, idx = last_token_index(lengths, self.n_out_tokens)  # (B, 1), (B, n_out)
        h = self.backbone.apply_final_norm(h[rows, idx])  # (B, n_out, n_dim)
        return self.head(h).view(B, self.n_out_tokens, self.n_heads, self.n_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, start: int | None = None, padded: bool | None = None
                ) -> torch.Tensor:
        """Logits from inputs (token ids ``(B, L)`` or vectors ``(B, L, d_in)``), or from layer-``start`` states.

        ``start`` None: ``x`` are inputs, embedded first. ``start`` >= 0: ``x``
        are the states ``(B, L, n_dim)`` at layer ``start`` (a split-point
        store's; layer 0 is the embedding's output), and blocks
        ``start+1..K`` run.
        ``padded`` says whether any row is shorter than ``L`` when the caller
        knows it from host-side lengths; otherwise the mask asks the device
        (a host synchronisation, and nothing a CUDA graph can capture).
        """
        if start is None:
            x, start = self.backbone.embed(x), 0  # (B, L, n_dim)
        return self.forward_from(x, lengths, start, padded)

    def forward_from(self, h: torch.Tensor, lengths: torch.Tensor, start: int, padded: bool | None = None
                     ) -> torch.Tensor:
        """Logits from layer-``start`` states ``h`` ``(B, L, n_dim)`` (a split-point store's)."""
        mask = self.backbone.attention_mask(lengths, h.shape[1], h.dtype, padded)
        for _, after in self.backbone.run_blocks(h, mask, start, self.backbone.depth):
            h = after  # (B, L, n_dim) after each block, up to block K
        return self._read(h, lengths)


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every label element; ``y`` is reshaped to the logits' heads."""
    C = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, C), y.reshape(-1))
