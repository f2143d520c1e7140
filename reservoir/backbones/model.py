"""The reservoir: fixed input projection + positions + the first K frozen blocks.

:class:`Backbone` wraps the pieces of a Hugging Face model that a reservoir
uses and runs them itself, so that

* only blocks ``1..depth`` exist (early exit is structural: the rest were
  dropped at load and can never run),
* every layer's *raw* residual stream is available (Hugging Face's GPT-2
  returns its last hidden state after ``ln_f`` and the others before it),
* a forward can start from stored states at layer ``s`` (split-point stores).

Layer 0 is the embedding output: projected input + position embedding (+ the
token-type-0 embedding and the embedding norm where the architecture has them).
Layer ``k`` is the residual stream after block ``k``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from reservoir.backbones.arch import ArchFacts


def last_token_index(lengths: torch.Tensor, n_out_tokens: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the last ``n_out_tokens`` real positions of each sequence are: ``h[rows, idx]`` reads them.

    Parameters
    ----------
    lengths : torch.Tensor
        Real lengths ``(B,)``, each ``>= n_out_tokens`` (right padding after them).
    n_out_tokens : int
        Positions per sequence, ending at the last real token ``lengths - 1``.

    Returns
    -------
    rows : torch.Tensor
        ``(B, 1)``: ``0..B-1``.
    idx : torch.Tensor
        ``(B, n_out_tokens)``: ``lengths - n_out_tokens .. lengths - 1``, in order.

    Examples
    --------
    >>> h = torch.arange(12.0).view(2, 3, 2)  # (B=2, L=3, D=2)
    >>> rows, idx = last_token_index(torch.tensor([3, 1]))
    >>> h[rows, idx].tolist()  # (B, 1, D): row 0 at position 2, row 1 at position 0
    [[[4.0, 5.0]], [[6.0, 7.0]]]
    """
    offsets = torch.arange(n_out_tokens, device=lengths.device) - n_out_tokens  # (n_out,)
    idx = lengths[:, None] + offsets[None, :]  # (B, n_out), last real token at lengths-1
    rows = torch.arange(len(lengths), device=lengths.device)[:, None]  # (B, 1)
    return rows, idx


@dataclass
class BackboneInfo:
    """Provenance of a loaded backbone, saved in every store and results file."""

    id: str
    family: str
    init: str
    seed: int
    n_layer: int
    n_dim: int
    depth: int
    max_positions: int
    weights_sha256: str
    revision: str | None = None
    final_norm_eps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ReservoirBackbone(nn.Module):
    """What every reservoir shares: the input projection, reading features, the final norm.

    Subclasses set ``input``, ``blocks``, ``final_norm`` and ``info`` and
    implement ``embed(x)`` (layer 0), ``attention_mask(lengths, L, dtype)``
    (whatever their blocks need to ignore padding) and
    ``run_blocks(h, mask, start, stop)``. :func:`~reservoir.backbones.load_backbone`
    also sets ``projection_info`` (``kind``, ``gain``, ``seed``, ``d_in`` of
    the input projection), which a feature store records.
    """

    projection_info: dict | None = None

    @property
    def depth(self) -> int:
        return len(self.blocks)

    @property
    def n_dim(self) -> int:
        return self.info.n_dim

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, L)`` as one-hot, or vectors ``(B, L, d_in)``, to ``(B, L, n_dim)``."""
        if x.dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
            # one-hot @ W^T == row lookup in W^T
            return F.embedding(x.long(), self.input.weight.t()) + self.input.bias  # (B, L, n_dim)
        return self.input(x.to(self.input.weight.dtype))  # (B, L, n_dim)

    def features(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        layers: list[int],
        n_out_tokens: int = 1,
        full_seq_layer: int | None = None,
        padded: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Hidden states at the last ``n_out_tokens`` real positions of every layer asked for.

        Parameters
        ----------
        x : torch.Tensor
            Token ids ``(B, L)`` or vectors ``(B, L, d_in)``, right-padded.
        lengths : torch.Tensor
            Real lengths ``(B,)``.
        layers : list of int
            Sorted layer indices in ``0..depth``. Blocks above ``max(layers)``
            are not run.
        n_out_tokens : int
            Positions read per sequence, ending at the last real token.
        full_seq_layer : int, optional
            Also return every position's state at this layer (for split-point
            stores).
        padded : bool, optional
            Whether any sequence is shorter than ``L``, when the caller knows
            it (saves asking the device; see :meth:`attention_mask`).

        Returns
        -------
        torch.Tensor
            ``(B, len(layers), n_out_tokens, n_dim)``, raw residual stream (no
            final norm); with ``full_seq_layer`` a pair whose second element
            is ``(B, L, n_dim)``.

        Examples
        --------
        >>> from reservoir.backbones import load_backbone
        >>> bb = load_backbone("tiny-gpt2", depth=2, d_in=1)
        >>> bb.features(torch.zeros(3, 10, 1), torch.tensor([10, 7, 4]), [0, 1, 2]).shape
        torch.Size([3, 3, 1, 32])
        """
        L = x.shape[1]
        rows, idx = last_token_index(lengths, n_out_tokens)  # (B, 1), (B, n_out)
        h = self.embed(x)  # (B, L, n_dim)
        mask = self.attention_mask(lengths, L, h.dtype, padded)
        wanted = set(layers)
        out = [h[rows, idx]] if 0 in wanted else []  # each (B, n_out, n_dim)
        full = h if full_seq_layer == 0 else None
        for k, h in self.run_blocks(h, mask, 0, max(max(layers), full_seq_layer or 0)):
            if k in wanted:
                out.append(h[rows, idx])
            if k == full_seq_layer:
                full = h  # (B, L, n_dim)
        feats = torch.stack(out, dim=1)  # (B, n_layers, n_out, n_dim)
        return feats if full_seq_layer is None else (feats, full)

    def apply_final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm a depth-K readout reads through (identity for post-LN models)."""
        return h if self.final_norm is None else self.final_norm(h)


class Backbone(ReservoirBackbone):
    """Input projection, positions and frozen blocks ``1..depth`` of one model.

    Parameters
    ----------
    hf_model : nn.Module
        The bare Hugging Face model (``GPT2Model``, ``BertModel``); only its
        submodules named in ``arch`` are kept.
    arch : ArchFacts
        Where those submodules live.
    depth : int
        Number of blocks to keep (``0 <= depth <= n_layer``).
    projection : nn.Linear
        The input map ``d_in -> n_dim``.
    info : BackboneInfo
        Provenance.
    """

    def __init__(self, hf_model: nn.Module, arch: ArchFacts, depth: int, projection: nn.Linear, info: BackboneInfo):
        super().__init__()
        from reservoir.backbones.arch import get_module

        self.arch = arch
        self.info = info
        self.config = hf_model.config
        self.input = projection
        self.positions = get_module(hf_model, arch.positions)
        self.embed_norm = get_module(hf_model, arch.embed_norm)
        self.embed_dropout = get_module(hf_model, arch.embed_dropout)
        token_type = get_module(hf_model, arch.token_type)
        if token_type is not None:
            # Only type 0 is ever used: keep that one row as a fixed buffer.
            self.register_buffer("token_type0", token_type.weight[0].detach().clone())
        else:
            self.token_type0 = None
        self.blocks = nn.ModuleList(list(get_module(hf_model, arch.blocks))[:depth])
        self.final_norm = get_module(hf_model, arch.final_norm)
        self.attn_implementation = getattr(self.config, "_attn_implementation", "eager") or "eager"

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Layer 0: projected input plus positions (plus embedding norm)."""
        h = self.project(x)  # (B, L, n_dim)
        L = h.shape[1]
        pos = torch.arange(L, device=h.device)
        h = h + self.positions(pos)[None]  # (B, L, n_dim)
        if self.token_type0 is not None:
            h = h + self.token_type0
        if self.embed_norm is not None:
            h = self.embed_norm(h)
        return self.embed_dropout(h)

    def attention_mask(self, lengths: torch.Tensor, L: int, dtype: torch.dtype,
                       padded: bool | None = None) -> torch.Tensor | None:
        """The mask every block gets, in the form its attention implementation reads.

        Keys at positions ``>= lengths`` are hidden from every query; causal
        models also hide keys after the query. SDPA takes a boolean mask (True =
        attend), eager attention an additive one. ``None`` when SDPA needs no
        mask: for causal models always (right padding comes after every real
        position, so ``is_causal`` alone is exact at the positions read, and
        SDPA keeps its fastest kernels), for bidirectional ones when no
        sequence is padded. ``padded`` (any length below ``L``) is computed
        from ``lengths`` when not given, which waits for the device.
        """
        sdpa = self.attn_implementation == "sdpa"
        if self.arch.causal and sdpa:
            return None
        if padded is None:
            padded = bool((lengths < L).any())
        if not padded and (not self.arch.causal or sdpa):
            return None
        keep = torch.arange(L, device=lengths.device)[None, :] < lengths[:, None]  # (B, L) keys
        keep = keep[:, None, None, :]  # (B, 1, 1, L)
        if self.arch.causal:
            causal = torch.ones(L, L, dtype=torch.bool, device=lengths.device).tril()
            keep = keep & causal[None, None]  # (B, 1, L, L)
        else:
            keep = keep.expand(-1, 1, L, L)
        if self.attn_implementation == "sdpa":
            return keep
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)

    def run_blocks(self, h: torch.Tensor, mask: torch.Tensor | None, start: int, stop: int):
        """Yield ``(k, h_k)`` for blocks ``start+1..stop`` applied to layer-``start`` states ``h``."""
        for k in range(start + 1, stop + 1):
            out = self.blocks[k - 1](h, attention_mask=mask)
            h = out[0] if isinstance(out, tuple) else out  # (B, L, n_dim)
            yield k, h
