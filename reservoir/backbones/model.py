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

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reservoir import options
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


#: How a layer's hidden states become a store row: the last real token(s), the first token, the mean over real ones.
POOLINGS = options.POOLINGS


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
    #: ``"rms"`` for an RMSNorm final norm; ``None`` for a LayerNorm (or no final norm).
    final_norm_kind: str | None = None

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

    # set by every subclass's __init__ (declared here for type checkers: nn.Module's __getattr__ types them loosely)
    info: BackboneInfo
    input: nn.Linear
    blocks: nn.ModuleList
    projection_info: dict | None = None
    #: Added to the final norm's weight to give the scale it applies (Gemma's ``1 + w``).
    norm_offset: float = 0.0

    @property
    def depth(self) -> int:
        return len(self.blocks)

    @property
    def n_dim(self) -> int:
        return self.info.n_dim

    def cast(self, dtype: torch.dtype) -> ReservoirBackbone:
        """Weights and buffers cast to the compute ``dtype`` (:func:`~reservoir.runtime.cast_for_inference`)."""
        return self.to(dtype=dtype)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, L)`` as one-hot, or vectors ``(B, L, d_in)``, to ``(B, L, n_dim)``."""
        if x.dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
            # one-hot @ W^T == row lookup in W^T
            return F.embedding(x.long(), self.input.weight.t()) + self.input.bias  # (B, L, n_dim)
        with torch.autocast(x.device.type, enabled=False):  # one small product: exact in float32 under CPU autocast
            return self.input(x.to(self.input.weight.dtype))  # (B, L, n_dim)

    def features(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        layers: list[int],
        n_out_tokens: int = 1,
        full_seq_layer: int | None = None,
        padded: bool | None = None,
        poolings: tuple[str, ...] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Hidden states at the last ``n_out_tokens`` real positions of every layer asked for (or other poolings).

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
        poolings : tuple of str, optional
            Read each layer several ways in one pass (:data:`POOLINGS`):
            ``"last"`` (the last ``n_out_tokens`` real positions), ``"first"``
            (position 0) and ``"mean"`` (the mean over the real positions;
            padding never counts). ``first`` and ``mean`` need
            ``n_out_tokens == 1``.

        Returns
        -------
        torch.Tensor
            ``(B, len(layers), n_out_tokens, n_dim)``, raw residual stream (no
            final norm); with ``poolings``, ``(B, len(poolings), len(layers),
            n_out_tokens, n_dim)``; with ``full_seq_layer`` a pair whose
            second element is ``(B, L, n_dim)``.

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
        if poolings is None:
            def read(h):
                return h[rows, idx]  # (B, n_out, n_dim)
        else:
            if n_out_tokens != 1 and set(poolings) != {"last"}:
                raise ValueError(f"poolings {poolings} need one output token; found n_out_tokens={n_out_tokens}")
            weights = (torch.arange(L, device=lengths.device)[None] < lengths[:, None]) / lengths[:, None]  # (B, L)

            def read(h):  # (B, P, n_out, n_dim)
                # the mean (padding weighs 0) summed in float32: a bmm would run in bf16 under the CPU's autocast
                pooled = {"last": lambda: h[rows, idx], "first": lambda: h[:, :1],
                          "mean": lambda: (h.float() * weights[..., None]).sum(1, keepdim=True).to(h.dtype)}
                return torch.stack([pooled[p]() for p in poolings], dim=1)
        out = [read(h)] if 0 in wanted else []
        full = h if full_seq_layer == 0 else None
        for k, h in self.run_blocks(h, mask, 0, max(max(layers), full_seq_layer or 0)):
            if k in wanted:
                out.append(read(h))
            if k == full_seq_layer:
                full = h  # (B, L, n_dim)
        feats = torch.stack(out, dim=1 if poolings is None else 2)  # (B, n_layers, n_out, n_dim) or (B, P, ...)
        return feats if full_seq_layer is None else (feats, full)

    def apply_final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm a depth-K readout reads through (identity for post-LN models)."""
        return h if self.final_norm is None else self.final_norm(h)

    def final_norm_arrays(self) -> dict[str, np.ndarray] | None:
        """The final norm as a store keeps it: float32 ``weight`` and ``bias`` ``(n_dim,)``, or ``None``.

        The weight is the scale the norm applies (Gemma's ``1 + w``); an
        RMSNorm has a zero bias. With ``info.final_norm_kind`` and
        ``info.final_norm_eps`` this is all a readout needs to apply it to
        stored features (:func:`reservoir.readouts.features.apply_final_norm`).
        """
        norm = self.final_norm
        if norm is None:
            return None
        weight = getattr(norm, "weight", None)  # None without an elementwise affine
        weight = torch.ones(self.n_dim) if weight is None else weight.detach().cpu().float()
        weight = weight + self.norm_offset
        bias = getattr(norm, "bias", None)
        bias = torch.zeros_like(weight) if bias is None else bias.detach().cpu().float()
        return {"weight": weight.numpy(), "bias": bias.numpy()}


class Backbone(ReservoirBackbone):
    """Input projection, positions and frozen blocks ``1..depth`` of one model.

    Parameters
    ----------
    hf_model : nn.Module
        The bare Hugging Face model (``GPT2Model``, ``LlamaModel``, ...); only
        its submodules named in ``arch`` are kept.
    arch : ArchFacts
        Where those submodules live.
    depth : int
        Number of blocks to keep (``0 <= depth <= n_layer``).
    projection : nn.Linear
        The input map ``d_in -> n_dim``, in place of the token (or patch) embedding.
    info : BackboneInfo
        Provenance.
    """

    def __init__(self, hf_model: nn.Module, arch: ArchFacts, depth: int, projection: nn.Linear, info: BackboneInfo):
        super().__init__()
        from reservoir.backbones.arch import block_windows, get_module

        self.arch = arch
        self.info = info
        self.config = hf_model.config
        self.input = projection
        # an nn.Embedding, ViT's (1, n + 1, n_dim) parameter, or None (rotary families)
        self.positions = get_module(hf_model, arch.positions)
        self.position_offset = arch.position_offset(self.config)
        self.rotary = get_module(hf_model, arch.rotary)
        self.embed_norm = get_module(hf_model, arch.embed_norm)
        self.embed_dropout = get_module(hf_model, arch.embed_dropout)
        token_type = get_module(hf_model, arch.token_type)
        if token_type is not None:
            # Only type 0 is ever used: keep that one row as a fixed buffer.
            self.register_buffer("token_type0", token_type.weight[0].detach().clone())
        else:
            self.token_type0 = None
        self.blocks = nn.ModuleList(list(get_module(hf_model, arch.blocks))[:depth])
        self.windows = block_windows(self.config, arch)[:depth]
        self.final_norm = get_module(hf_model, arch.final_norm)
        self.norm_offset = arch.norm_offset
        self.attn_implementation = getattr(self.config, "_attn_implementation", "eager") or "eager"

    def cast(self, dtype: torch.dtype) -> Backbone:
        """Cast weights and buffers to ``dtype``, except the rotary frequencies, which stay exact in float32.

        Hugging Face's rotary modules compute cos/sin in float32 from
        ``inv_freq``; a frequency rounded to bf16 would move every angle by up
        to 0.4% (about 2 radians at position 500).
        """
        keep = {} if self.rotary is None else {n: b.clone() for n, b in self.rotary.named_buffers()}
        self.to(dtype=dtype)
        for name, value in keep.items():
            self.rotary.register_buffer(name, value, persistent=False)
        return self

    def position_table(self) -> torch.Tensor | None:
        """The learned position rows ``(rows, n_dim)`` (position 0 at row ``position_offset``); ``None`` if rotary."""
        if self.positions is None:
            return None
        if isinstance(self.positions, nn.Embedding):
            return self.positions.weight
        return self.positions.reshape(-1, self.positions.shape[-1])  # ViT: (1, n + 1, n_dim)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Layer 0: projected input plus positions (plus token type 0 and the embedding norm where they exist)."""
        h = self.project(x)  # (B, L, n_dim)
        table = self.position_table()
        if table is not None:
            L, lo = h.shape[1], self.position_offset
            h = h + table[lo: lo + L][None]  # (B, L, n_dim)
        if self.token_type0 is not None:
            h = h + self.token_type0
        if self.embed_norm is not None:
            h = self.embed_norm(h)
        return h if self.embed_dropout is None else self.embed_dropout(h)

    def attention_mask(self, lengths: torch.Tensor, L: int, dtype: torch.dtype,
                       padded: bool | None = None) -> dict[int | None, torch.Tensor | None]:
        """The masks the blocks get, in the form their attention implementation reads.

        Returns ``{None: mask}`` for blocks that see every earlier (or every)
        position, plus ``{w: mask}`` for each sliding window ``w < L`` some
        block has (:meth:`run_blocks` picks per block). Keys at positions
        ``>= lengths`` are hidden from every query; causal models also hide
        keys after the query, and a window ``w`` those ``w`` or more before
        it. SDPA takes a boolean mask (True = attend), eager attention an
        additive one. A mask is ``None`` when SDPA needs none: for causal
        models without a window below ``L`` always (right padding comes after
        every real position, so ``is_causal`` alone is exact at the positions
        read, and SDPA keeps its fastest kernels), for bidirectional ones when
        no sequence is padded. ``padded`` (any length below ``L``) is computed
        from ``lengths`` when not given, which waits for the device.
        """
        windows = {w for w in self.windows if w is not None and w < L}
        if padded is None and (windows or not (self.arch.causal and self.attn_implementation == "sdpa")):
            padded = bool((lengths < L).any())  # asked once, not per window
        masks = {None: self._mask(lengths, L, dtype, padded, None)}
        for w in windows:
            masks[w] = self._mask(lengths, L, dtype, padded, w)
        return masks

    def _mask(self, lengths: torch.Tensor, L: int, dtype: torch.dtype, padded: bool | None,
              window: int | None) -> torch.Tensor | None:
        """One mask (see :meth:`attention_mask`); ``padded`` is known unless causal SDPA needs no mask."""
        sdpa = self.attn_implementation == "sdpa"
        if self.arch.causal and sdpa and window is None:
            return None
        if not padded and window is None and (not self.arch.causal or sdpa):
            return None
        keep = torch.arange(L, device=lengths.device)[None, :] < lengths[:, None]  # (B, L) keys
        keep = keep[:, None, None, :]  # (B, 1, 1, L)
        if self.arch.causal:
            q = torch.arange(L, device=lengths.device)
            allowed = q[None, :] <= q[:, None]  # (L, L): query row, key column
            if window is not None:
                allowed &= q[:, None] - q[None, :] < window
            keep = keep & allowed[None, None]  # (B, 1, L, L)
        else:
            keep = keep.expand(-1, 1, L, L)
        if sdpa:
            return keep
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)

    def run_blocks(self, h: torch.Tensor, masks: dict[int | None, torch.Tensor | None], start: int, stop: int):
        """Yield ``(k, h_k)`` for blocks ``start+1..stop`` applied to layer-``start`` states ``h``.

        ``masks`` is what :meth:`attention_mask` returned. Rotary families get
        the rotary embeddings of positions ``0..L-1``, computed once here.
        """
        kwargs = {}
        if self.rotary is not None and stop > start:
            position_ids = torch.arange(h.shape[1], device=h.device)[None]  # (1, L)
            kwargs["position_embeddings"] = self.rotary(h, position_ids)  # (cos, sin), each (1, L, rotary dims)
        for k in range(start + 1, stop + 1):
            mask = masks.get(self.windows[k - 1], masks[None])
            out = self.blocks[k - 1](h, attention_mask=mask, **kwargs)
            h = out[0] if isinstance(out, tuple) else out  # (B, L, n_dim)
            yield k, h
