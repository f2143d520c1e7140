"""Freeze schemes: which parameter groups of a backbone + head are trained.

Groups: ``input`` (the projection), ``positions`` (position embeddings),
``layernorm`` (every normalization module: embedding norm, the norms inside
blocks, the final norm), ``attention`` and ``feedforward`` (a block's attention
and feedforward submodules, without the norms they contain), ``recurrent`` (an
LSTM's recurrent weights; empty for transformers), ``output`` (the linear
head). Freezing is structural: everything is frozen, then groups are
unfrozen by module, found through the architecture table (never by substrings
of parameter names). Every parameter belongs to exactly one group.

Presets: ``fpt`` = input + positions + layernorm + output (Lu et al.),
``all`` = every group (Rothermel et al.'s unfrozen variants), ``output`` = the
head only (a live linear readout).
"""

from __future__ import annotations

import logging

from torch import nn

from reservoir.backbones.arch import get_module, norm_types
from reservoir.errors import ReservoirError

log = logging.getLogger("reservoir")

GROUPS = ("input", "positions", "layernorm", "attention", "feedforward", "recurrent", "output")
PRESETS = {
    "fpt": ("input", "positions", "layernorm", "output"),
    "all": GROUPS,
    "output": ("output",),
}


def parse_groups(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"fpt"``, ``"all"``, or a comma list of groups -> groups in canonical order.

    Examples
    --------
    >>> parse_groups("layernorm,output")
    ('layernorm', 'output')
    >>> parse_groups("fpt")
    ('input', 'positions', 'layernorm', 'output')
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    wanted: set[str] = set()
    named: set[str] = set()
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item in named:
            raise ReservoirError(f"--finetune: expected each group once; found {item!r} twice")
        named.add(item)
        if item in PRESETS:
            wanted.update(PRESETS[item])
        elif item in GROUPS:
            wanted.add(item)
        else:
            raise ReservoirError(
                f"unknown finetune group {item!r}; expected a comma list of {', '.join(GROUPS)} or one of "
                f"{', '.join(PRESETS)}"
            )
    if not wanted:
        raise ReservoirError("--finetune names no group; expected e.g. fpt, all or layernorm,output")
    return tuple(g for g in GROUPS if g in wanted)


def _params(module: nn.Module | nn.Parameter | None, skip_norms: bool = False) -> list[nn.Parameter]:
    if module is None:
        return []
    if isinstance(module, nn.Parameter):  # ViT's position table
        return [module]
    if not skip_norms:
        return list(module.parameters())
    norm_params = {id(p) for m in module.modules() if isinstance(m, norm_types()) for p in m.parameters()}
    return [p for p in module.parameters() if id(p) not in norm_params]


def parameter_groups(backbone: nn.Module, head: nn.Module, first_block: int = 0, states: bool = False
                     ) -> dict[str, list[nn.Parameter]]:
    """Map each group to its parameters, structurally.

    ``first_block`` > 0 restricts the block-level groups (and the norms) to
    blocks ``first_block+1..depth`` plus the final norm: what a split-point
    store at layer ``first_block`` can train. ``states``: the model is fed
    layer-``first_block`` states (layer 0 included), so the embedding (input
    projection, positions, embedding norm) is never in the graph either.
    """
    blocks = list(backbone.blocks)[first_block:]
    groups: dict[str, list[nn.Parameter]] = {g: [] for g in GROUPS}
    groups["output"] = list(head.parameters())
    arch = getattr(backbone, "arch", None)
    if arch is None:  # backbones outside the architecture table declare their own groups
        for name, params in backbone.parameter_groups(first_block).items():
            groups[name].extend(params)
        if states:
            groups["input"] = groups["positions"] = []
        return groups
    if first_block == 0 and not states:
        groups["input"] = _params(backbone.input)
        groups["positions"] = _params(backbone.positions)
        groups["layernorm"] += _params(backbone.embed_norm)
    for block in blocks:
        groups["layernorm"] += [p for m in block.modules() if isinstance(m, norm_types()) for p in m.parameters()]
        for path in arch.attention:
            groups["attention"] += _params(get_module(block, path), skip_norms=True)
        for path in arch.feedforward:
            groups["feedforward"] += _params(get_module(block, path), skip_norms=True)
    groups["layernorm"] += _params(backbone.final_norm)
    return groups


def apply_freeze(backbone: nn.Module, head: nn.Module, groups: tuple[str, ...], first_block: int = 0,
                 states: bool = False) -> dict[str, int]:
    """Freeze everything, then unfreeze ``groups``; return parameter counts (``first_block``, ``states``: as for
    :func:`parameter_groups`).

    Groups that hold no parameter of this backbone (``recurrent`` of a
    transformer, ``positions`` of a rotary family) train nothing; a choice of
    groups that trains nothing at all is refused in one line.

    Returns
    -------
    dict
        ``{"trainable": n, "total": n, **{group: n}}`` (group counts are the
        parameters of that group, trained or not).
    """
    by_group = parameter_groups(backbone, head, first_block, states)
    for p in [*backbone.parameters(), *head.parameters()]:
        p.requires_grad_(False)
    for g in groups:
        if g in ("input", "positions") and (first_block > 0 or states):
            raise ReservoirError(f"--finetune group {g!r} lies below the split layer {first_block}, where nothing is "
                                 "trained: expected groups of the blocks above it or the head (layernorm, attention, "
                                 f"feedforward, recurrent, output), found {g!r}")
        for p in by_group[g]:
            p.requires_grad_(True)
    if first_block == 0 and not states:
        seen = [id(p) for ps in by_group.values() for p in ps]
        everything = {id(p) for p in [*backbone.parameters(), *head.parameters()]}
        if len(seen) != len(set(seen)) or set(seen) != everything:  # the architecture table misses a module type
            raise ReservoirError(f"backbone {backbone.info.id!r}: expected every parameter in exactly one freeze "
                                 f"group, found {len(seen) - len(set(seen))} in two and "
                                 f"{len(everything - set(seen))} in none")
    counts = check_trains_something(backbone, by_group, groups, first_block)
    trainable = sum(p.numel() for p in [*backbone.parameters(), *head.parameters()] if p.requires_grad)
    if "positions" in groups and not by_group["positions"]:
        rotary = getattr(backbone, "rotary", None) is not None
        log.warning("backbone %s (%s) has no learned position table%s: the positions group is empty and trains "
                    "nothing", backbone.info.id, backbone.info.family, " (rotary positions)" if rotary else "")
    total = sum(p.numel() for p in [*backbone.parameters(), *head.parameters()])
    return {"trainable": trainable, "total": total, **counts}


def check_trains_something(backbone: nn.Module, by_group: dict[str, list[nn.Parameter]], groups: tuple[str, ...],
                           first_block: int = 0) -> dict[str, int]:
    """Each group's parameter count (:func:`parameter_groups`' ``by_group``); a choice of ``groups`` that holds
    none of them is refused in one line (an optimizer over no parameters cannot step)."""
    counts = {g: sum(p.numel() for p in ps) for g, ps in by_group.items()}
    if not any(counts[g] for g in groups):
        where = f" above layer {first_block}" if first_block > 0 else ""
        named = "the group " + groups[0] if len(groups) == 1 else "the groups " + ", ".join(groups)
        raise ReservoirError(f"--finetune {','.join(groups)}: expected parameters to train in backbone "
                             f"{backbone.info.id!r} ({backbone.info.family}); found {named} empty{where} (groups with "
                             f"parameters here: {', '.join(g for g in GROUPS if counts[g])})")
    return counts


def describe(counts: dict[str, int]) -> str:
    """``trainable params: X || all params: Y || trainable%: Z``"""
    pct = 100.0 * counts["trainable"] / max(counts["total"], 1)
    return f"trainable params: {counts['trainable']:,} || all params: {counts['total']:,} || trainable%: {pct:.4f}"
