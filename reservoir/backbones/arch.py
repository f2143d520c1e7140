"""One table of per-architecture facts.

Everything architecture-specific that reservoir needs (where the blocks, the
position embeddings and the norms live, whether attention is causal, how many
positions exist, which submodules of a block are attention and which are
feedforward) lives in :data:`ARCHS`. Code elsewhere looks modules up through
this table and never by substrings of parameter names.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from reservoir.errors import ReservoirError


@dataclass(frozen=True)
class ArchFacts:
    """Where things live in one Hugging Face architecture family.

    Paths are dotted attribute paths from the bare ``AutoModel`` (GPT2Model,
    BertModel); block-relative paths (``attention``, ``feedforward``) start at
    one block. ``None`` means the architecture has no such module.
    """

    family: str
    model_types: tuple[str, ...]
    blocks: str
    positions: str
    embed_dropout: str
    token_type: str | None
    embed_norm: str | None
    final_norm: str | None
    attention: tuple[str, ...]
    feedforward: tuple[str, ...]
    causal: bool
    max_positions_attr: str
    pre_norm: bool
    attention_weights: str  # block-relative module whose eager output is ``(out, weights (B, H, L, L))``


ARCHS: dict[str, ArchFacts] = {
    "gpt2": ArchFacts(
        family="gpt2",
        model_types=("gpt2",),
        blocks="h",
        positions="wpe",
        embed_dropout="drop",
        token_type=None,
        embed_norm=None,
        final_norm="ln_f",
        attention=("attn",),
        feedforward=("mlp",),
        causal=True,
        max_positions_attr="n_positions",
        pre_norm=True,
        attention_weights="attn",
    ),
    "bert": ArchFacts(
        family="bert",
        model_types=("bert",),
        blocks="encoder.layer",
        positions="embeddings.position_embeddings",
        embed_dropout="embeddings.dropout",
        token_type="embeddings.token_type_embeddings",
        embed_norm="embeddings.LayerNorm",
        final_norm=None,
        attention=("attention",),
        feedforward=("intermediate", "output"),
        causal=False,
        max_positions_attr="max_position_embeddings",
        pre_norm=False,
        attention_weights="attention.self",
    ),
}

#: Module types that count as normalization layers (the ``layernorm`` group).
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm,)


def arch_for(model_type: str) -> ArchFacts:
    """Look up the facts for a Hugging Face ``config.model_type``.

    Raises
    ------
    ReservoirError
        For an architecture outside the table, naming the supported ones.
    """
    for facts in ARCHS.values():
        if model_type in facts.model_types:
            return facts
    supported = sorted(t for f in ARCHS.values() for t in f.model_types)
    raise ReservoirError(
        f"unsupported architecture {model_type!r}; expected one of: {', '.join(supported)}"
    )


def get_module(root: nn.Module, path: str | None) -> nn.Module | None:
    """Follow a dotted attribute path (``"encoder.layer"``); ``None`` gives ``None``."""
    if path is None:
        return None
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module
