"""Settings: the one helper that says which setting differs (used wherever a rerun is checked), and names.

A feature store against an extraction's settings, a run folder against a
training run's, a recipe's cached store against a cell's: each compares two
(possibly nested) dicts and reports the first differing key, dotted
(``backbone.init``), in the order of the new settings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); other values as they are."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def first_difference(old: dict[str, Any], new: dict[str, Any],
                     keys: Iterable[str] | None = None) -> tuple[str, Any, Any] | None:
    """The first setting whose values differ, as ``(dotted key, old value, new value)``; ``None`` when none does.

    ``keys`` limits the comparison to those top-level keys, in that order
    (default: every key of ``new``, then those only ``old`` has). Within a
    key, nested entries are compared in ``new``'s order.

    Examples
    --------
    >>> first_difference({"task": {"name": "a", "seed": 1}}, {"task": {"name": "a", "seed": 2}})
    ('task.seed', 1, 2)
    >>> first_difference({"lr": 0.1, "seed": 0}, {"lr": 0.1, "seed": 0}) is None
    True
    """
    if keys is None:
        keys = [*new, *(k for k in old if k not in new)]
    for key in keys:
        a, b = flatten(old.get(key), key), flatten(new.get(key), key)
        for k in [*b, *(k for k in a if k not in b)]:
            if a.get(k) != b.get(k):
                return k, a.get(k), b.get(k)
    return None


def describe_difference(diff: tuple[str, Any, Any]) -> str:
    """``"lr=0.01, this run has 0.001"`` for a difference from :func:`first_difference`."""
    key, old, new = diff
    return f"{key}={old!r}, this run has {new!r}"


def folder_only(name: str) -> bool:
    """Whether ``name`` can name only a folder, never a hub id (``name`` or ``org/name``): it starts with ``.``, ``~``
    or the path separator, or holds more than one ``/``."""
    return name.startswith((".", "~", os.sep)) or name.count("/") > 1


def is_folder(name: str) -> bool:
    """Whether ``name`` (``~`` expanded) is an existing folder; a name too long for a path is none."""
    try:
        return Path(os.path.expanduser(name)).is_dir()
    except OSError:
        return False


def slug(name: str) -> str:
    """A backbone name, hub id or folder (or a group list) as part of a file or folder name.

    A local folder gives its own name; a hub id its ``/`` as ``_``; a comma
    list its ``,`` as ``+``.

    Examples
    --------
    >>> slug("openai-community/gpt2"), slug("layernorm,output")
    ('openai-community_gpt2', 'layernorm+output')
    """
    folder = is_folder(name) or folder_only(name)
    return Path(name.rstrip("/" + os.sep)).name if folder else name.replace("/", "_").replace(",", "+")
