"""The LSTM baseline of Lu et al. (Table 1's LSTM row, Table 3's frozen random 3-layer LSTM).

:class:`LSTMBackbone` has the duck-typed interface of
:class:`reservoir.backbones.model.Backbone`, so extraction, stores, readouts,
live training and split-point stores use it unchanged. Names ``lstm-<L>x<D>``
(``lstm-3x768``) are built by :func:`reservoir.backbones.load.load_backbone`.

Layer 0 is the fixed orthogonal projection of the input (an LSTM has no
position embeddings: order is in the recurrence). Block ``k`` is pre-norm
residual, like GPT-2::

    h_k = h_{k-1} + LSTM_k(LayerNorm_k(h_{k-1}))

with a single-layer unidirectional ``nn.LSTM(D, D)`` whose initial states are
zero, and a final LayerNorm read by the head (as GPT-2's ``ln_f``). The
residual path and the norms make the features of a deep random stack neither
vanish nor saturate, and give the ``layernorm`` group something to train
(Table 3: input, output and layernorm trained). The recurrence is causal, so
with right padding the states at real positions never see the padding.
"""

from __future__ import annotations

import torch
from torch import nn

from reservoir.backbones.model import BackboneInfo, ReservoirBackbone

#: An LSTM has no position table; this stands in for "no limit" in ``BackboneInfo.max_positions``.
LSTM_MAX_POSITIONS = 1_000_000


class LSTMBlock(nn.Module):
    """``h + LSTM(LayerNorm(h))`` over ``(B, L, D)``, zero initial state."""

    def __init__(self, n_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(n_dim)
        self.lstm = nn.LSTM(n_dim, n_dim, batch_first=True)

    def forward(self, h: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``lengths`` is accepted for the blocks' common call and unused: right padding comes after
        every real position, so a forward recurrence never carries it into them."""
        out, _ = self.lstm(self.norm(h))  # (B, L, D)
        return h + out


class LSTMStack(nn.Module):
    """All ``n_layer`` blocks and the final norm: the "checkpoint" whose weights are hashed."""

    def __init__(self, n_layer: int, n_dim: int):
        super().__init__()
        self.blocks = nn.ModuleList(LSTMBlock(n_dim) for _ in range(n_layer))
        self.final_norm = nn.LayerNorm(n_dim)


class LSTMBackbone(ReservoirBackbone):
    """Input projection and frozen LSTM blocks ``1..depth`` with :class:`Backbone`'s interface.

    Parameters
    ----------
    stack : LSTMStack
        Every block and the final norm; blocks above ``depth`` are dropped.
    depth : int
        Blocks to keep (``0 <= depth <= n_layer``).
    projection : nn.Linear
        The input map ``d_in -> n_dim``.
    info : BackboneInfo
        Provenance (``family="lstm"``).
    """

    #: No architecture-table entry: :func:`reservoir.training.freeze.parameter_groups` asks :meth:`parameter_groups`.
    arch = None

    def __init__(self, stack: LSTMStack, depth: int, projection: nn.Linear, info: BackboneInfo):
        super().__init__()
        self.info = info
        self.input = projection
        self.positions = None
        self.embed_norm = None
        self.blocks = nn.ModuleList(list(stack.blocks)[:depth])
        self.final_norm = stack.final_norm

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Layer 0: the projected input (no positions, no norm)."""
        return self.project(x)  # (B, L, n_dim)

    def attention_mask(self, lengths: torch.Tensor, L: int, dtype: torch.dtype,
                       padded: bool | None = None) -> torch.Tensor:
        """What the blocks get in place of a mask: the real lengths ``(B,)`` themselves."""
        return lengths

    def run_blocks(self, h: torch.Tensor, mask: torch.Tensor | None, start: int, stop: int):
        """Yield ``(k, h_k)`` for blocks ``start+1..stop`` applied to layer-``start`` states ``h``."""
        for k in range(start + 1, stop + 1):
            h = self.blocks[k - 1](h, mask)  # (B, L, n_dim)
            yield k, h

    def parameter_groups(self, first_block: int = 0) -> dict[str, list[nn.Parameter]]:
        """Freeze groups: ``input`` (projection), ``layernorm`` (block norms + final norm),
        ``recurrent`` (the LSTM weights); ``positions``, ``attention`` and ``feedforward`` are empty.

        ``first_block`` > 0 keeps only blocks ``first_block+1..depth`` (and the
        final norm) and leaves ``input`` empty: what a split-point store at that
        layer can train.
        """
        blocks = list(self.blocks)[first_block:]
        return {
            "input": [] if first_block > 0 else list(self.input.parameters()),
            "positions": [],
            "layernorm": [p for b in blocks for p in b.norm.parameters()] + list(self.final_norm.parameters()),
            "attention": [],
            "feedforward": [],
            "recurrent": [p for b in blocks for p in b.lstm.parameters()],
        }
