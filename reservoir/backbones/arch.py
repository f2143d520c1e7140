"""One table of per-architecture facts.

Everything architecture-specific that reservoir needs (where the blocks, the
position embeddings, the rotary module and the norms live, whether attention
is causal, how many positions exist, which submodules of a block are attention
and which are feedforward) lives in :data:`ARCHS`. Code elsewhere looks
modules up through this table and never by substrings of parameter names.

Families: ``gpt2``; Llama-style decoders with rotary positions and RMSNorm
(``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``);
``gpt_neox`` (Pythia, partial rotary); ``opt`` (learned positions offset by
2); the encoders ``bert``, ``roberta`` (positions offset by the padding index
+ 1), ``distilbert`` (no token types) and ``vit`` (its patch position table,
read without the CLS slot).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from reservoir.errors import ReservoirError


def _attr(name: str) -> Callable[[Any], int]:
    """A config reader: ``config.<name>`` as an int."""
    return lambda config: int(getattr(config, name))


def _zero(config: Any) -> int:
    return 0


def _after_padding(config: Any) -> int:
    """RoBERTa's first position id: the padding index + 1."""
    return int(config.pad_token_id) + 1


def _roberta_positions(config: Any) -> int:
    return int(config.max_position_embeddings) - _after_padding(config)


def _vit_patches(config: Any) -> int:
    """ViT's patch positions: its table holds one more row, the CLS slot (row 0), never read."""
    return (int(config.image_size) // int(config.patch_size)) ** 2


def _encoder_refusal(config: Any) -> str | None:
    """A BERT-style config set up as a decoder: Hugging Face runs its blocks causally, the family bidirectionally."""
    if getattr(config, "is_decoder", False):
        return "expected an encoder config (is_decoder false); found is_decoder true, a causal BERT-style model"
    return None


def _roberta_refusal(config: Any) -> str | None:
    if getattr(config, "pad_token_id", None) is None:
        return "expected pad_token_id in the config (RoBERTa's positions start after it); found none"
    return _encoder_refusal(config)


def _opt_refusal(config: Any) -> str | None:
    if getattr(config, "word_embed_proj_dim", config.hidden_size) != config.hidden_size:
        return ("expected word_embed_proj_dim equal to hidden_size (the input projection replaces the token "
                f"embedding); found {config.word_embed_proj_dim} and {config.hidden_size} (project_in/project_out, "
                "as in opt-350m, are not supported)")
    return None


@dataclass(frozen=True)
class ArchFacts:
    """Where things live in one Hugging Face architecture family.

    Paths are dotted attribute paths from the bare ``AutoModel`` (GPT2Model,
    LlamaModel, ...); block-relative paths (``attention``, ``feedforward``,
    ``attention_weights``) start at one block. ``None`` means the architecture
    has no such module.

    Attributes
    ----------
    positions : str or None
        The learned position table (an ``nn.Embedding``, or ViT's parameter
        ``(1, n + 1, n_dim)``); ``None`` for rotary families.
    position_offset : callable
        ``config -> int``: the table row of position 0 (OPT 2, RoBERTa
        ``pad_token_id + 1``, ViT 1: its CLS row).
    max_positions : callable
        ``config -> int``: how many positions a sequence may have.
    rotary : str or None
        The model's rotary module, called once per batch; its ``(cos, sin)``
        go to every block as ``position_embeddings``.
    norm_types : tuple of str
        Import paths of the family's normalization classes (the
        ``layernorm`` freeze group; see :func:`norm_types`).
    norm_offset : float
        Added to the final norm's weight (Gemma's RMSNorm scales by ``1 + w``).
    sliding : bool
        Whether ``config.sliding_window`` (per ``config.layer_types`` where
        given) limits how far back a block attends.
    eager : bool
        Whether the family runs eager attention only (Gemma 2: transformers
        has no SDPA path for it, which would not apply its logit soft-capping).
    refuse : callable
        ``config -> str or None``: why a config of this family cannot be used.
    """

    family: str
    model_types: tuple[str, ...]
    blocks: str
    positions: str | None
    embed_dropout: str | None
    token_type: str | None
    embed_norm: str | None
    final_norm: str | None
    attention: tuple[str, ...]
    feedforward: tuple[str, ...]
    causal: bool
    max_positions: Callable[[Any], int]
    pre_norm: bool
    attention_weights: str  # block-relative module whose eager output is ``(out, weights (B, H, L, L))``
    position_offset: Callable[[Any], int] = _zero
    rotary: str | None = None
    norm_types: tuple[str, ...] = ("torch.nn.LayerNorm",)
    norm_offset: float = 0.0
    sliding: bool = False
    eager: bool = False
    refuse: Callable[[Any], str | None] = lambda config: None

    @property
    def kept(self) -> tuple[str, ...]:
        """Paths of the modules a reservoir keeps (the rest, a pooler or the token embedding, never runs)."""
        paths = (self.blocks, self.positions, self.token_type, self.embed_norm, self.embed_dropout, self.final_norm,
                 self.rotary)
        return tuple(p for p in paths if p is not None)


def _llama_style(family: str, norm: str, **overrides: Any) -> ArchFacts:
    """A Llama-style decoder: rotary positions, RMSNorm before attention and MLP, a final RMSNorm."""
    facts = dict(
        family=family, model_types=(family,), blocks="layers", positions=None, embed_dropout=None, token_type=None,
        embed_norm=None, final_norm="norm", attention=("self_attn",), feedforward=("mlp",), causal=True,
        max_positions=_attr("max_position_embeddings"), pre_norm=True, attention_weights="self_attn",
        rotary="rotary_emb", norm_types=(f"transformers.models.{family}.modeling_{family}.{norm}",),
    )
    return ArchFacts(**{**facts, **overrides})


_BERT_LIKE = dict(
    blocks="encoder.layer", positions="embeddings.position_embeddings", embed_dropout="embeddings.dropout",
    token_type="embeddings.token_type_embeddings", embed_norm="embeddings.LayerNorm", final_norm=None,
    attention=("attention",), feedforward=("intermediate", "output"), causal=False,
    max_positions=_attr("max_position_embeddings"), pre_norm=False, attention_weights="attention.self",
)

ARCHS: dict[str, ArchFacts] = {
    "gpt2": ArchFacts(
        family="gpt2", model_types=("gpt2",), blocks="h", positions="wpe", embed_dropout="drop", token_type=None,
        embed_norm=None, final_norm="ln_f", attention=("attn",), feedforward=("mlp",), causal=True,
        max_positions=_attr("n_positions"), pre_norm=True, attention_weights="attn",
    ),
    "llama": _llama_style("llama", "LlamaRMSNorm"),
    "mistral": _llama_style("mistral", "MistralRMSNorm", sliding=True),
    "qwen2": _llama_style("qwen2", "Qwen2RMSNorm", sliding=True),
    "qwen3": _llama_style("qwen3", "Qwen3RMSNorm", sliding=True),
    "gemma": _llama_style("gemma", "GemmaRMSNorm", norm_offset=1.0),
    "gemma2": _llama_style("gemma2", "Gemma2RMSNorm", norm_offset=1.0, sliding=True, eager=True),
    "gpt_neox": ArchFacts(
        family="gpt_neox", model_types=("gpt_neox",), blocks="layers", positions=None, embed_dropout="emb_dropout",
        token_type=None, embed_norm=None, final_norm="final_layer_norm", attention=("attention",),
        feedforward=("mlp",), causal=True, max_positions=_attr("max_position_embeddings"), pre_norm=True,
        attention_weights="attention", rotary="rotary_emb",
    ),
    "opt": ArchFacts(
        family="opt", model_types=("opt",), blocks="decoder.layers", positions="decoder.embed_positions",
        embed_dropout=None, token_type=None, embed_norm=None, final_norm="decoder.final_layer_norm",
        attention=("self_attn",), feedforward=("fc1", "fc2"), causal=True,
        max_positions=_attr("max_position_embeddings"), pre_norm=True, attention_weights="self_attn",
        position_offset=lambda config: 2, refuse=_opt_refusal,
    ),
    "bert": ArchFacts(family="bert", model_types=("bert",), **_BERT_LIKE, refuse=_encoder_refusal),
    "roberta": ArchFacts(family="roberta", model_types=("roberta",),
                         **{**_BERT_LIKE, "max_positions": _roberta_positions}, position_offset=_after_padding,
                         refuse=_roberta_refusal),
    "distilbert": ArchFacts(
        family="distilbert", model_types=("distilbert",), blocks="transformer.layer",
        positions="embeddings.position_embeddings", embed_dropout="embeddings.dropout", token_type=None,
        embed_norm="embeddings.LayerNorm", final_norm=None, attention=("attention",), feedforward=("ffn",),
        causal=False, max_positions=_attr("max_position_embeddings"), pre_norm=False, attention_weights="attention",
    ),
    "vit": ArchFacts(
        family="vit", model_types=("vit",), blocks="layers", positions="embeddings.position_embeddings",
        embed_dropout="embeddings.dropout", token_type=None, embed_norm=None, final_norm="layernorm",
        attention=("attention",), feedforward=("mlp",), causal=False, max_positions=_vit_patches, pre_norm=True,
        attention_weights="attention", position_offset=lambda config: 1,
    ),
}


@functools.lru_cache(maxsize=None)
def norm_types() -> tuple[type[nn.Module], ...]:
    """Every normalization class of every family in :data:`ARCHS` (the ``layernorm`` freeze group).

    RMSNorm classes are per family in transformers; a family whose module
    the installed transformers lacks contributes nothing.
    """
    found: list[type[nn.Module]] = [nn.LayerNorm]
    for path in sorted({p for facts in ARCHS.values() for p in facts.norm_types}):
        module, _, name = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if cls not in found:
            found.append(cls)
    return tuple(found)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def config_refusal(config: Any, arch: ArchFacts) -> str | None:
    """Why ``config`` cannot be used (``None`` when it can): the family's own :attr:`ArchFacts.refuse`, then what
    every family needs and Hugging Face does not check when it builds the model (a negative head count builds, and
    fails only at the first forward; a window of 0 or less builds, and hides every key)."""
    why = arch.refuse(config)
    if why is not None:
        return why
    heads, groups = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if heads is not None and not _positive(heads):
        return f"expected a positive number of attention heads (num_attention_heads); found {heads!r}"
    if groups is not None and not (_positive(groups) and (heads is None or heads % groups == 0)):
        return (f"expected a number of key/value heads (num_key_value_heads) dividing the {heads} attention heads; "
                f"found {groups!r}")
    window = getattr(config, "sliding_window", None) if arch.sliding else None
    if window is not None and not _positive(window):
        return f"expected a sliding_window of at least 1 position (or null: none); found {window!r}"
    return None


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


def block_windows(config: Any, arch: ArchFacts) -> list[int | None]:
    """Per block, how many positions back it attends (``None``: all).

    ``config.layer_types`` (``"sliding_attention"`` or ``"full_attention"``)
    picks the blocks that ``config.sliding_window`` limits; without it a set
    window limits every block (Mistral).
    """
    n = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None) if arch.sliding else None
    if not window:
        return [None] * n
    types = getattr(config, "layer_types", None)
    if types is None:
        return [int(window)] * n
    return [int(window) if t == "sliding_attention" else None for t in types[:n]]


def get_module(root: nn.Module, path: str | None) -> nn.Module | None:
    """Follow a dotted attribute path (``"encoder.layer"``); ``None`` gives ``None``."""
    if path is None:
        return None
    module = root
    for part in path.split("."):
        module = getattr(module, part)
    return module
