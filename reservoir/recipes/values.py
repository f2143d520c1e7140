"""Checking the values of a recipe file as YAML parsed them: numbers written as numbers, names that can name a
folder, mappings and lists where the schema has them; each refusal one line naming the key and where it is."""

from __future__ import annotations

import decimal
import math
import re
from typing import Any

from reservoir import options
from reservoir.errors import ReservoirError

#: Longest recipe name or tag: each is part of folder names, which the file system bounds.
MAX_ID = 64


def unknown_keys(d: dict, allowed: tuple[str, ...], where: str) -> None:
    """Refuse a key of ``d`` that is not ``allowed`` (a misspelling, say), naming the allowed ones."""
    for key in d:
        if key not in allowed:
            raise ReservoirError(f"unknown key {key!r} in {where}; expected one of: {', '.join(allowed)}")


def as_list(value: Any) -> list:
    """A list as written, or one value as a list of one."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


#: A number as YAML 1.1 leaves it a string (``1e-3``, ``1e4``): digits, a point, an exponent; no ``_``, no words.
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def number(value: Any, what: str, integer: bool = False) -> float | int:
    """YAML reads ``1e-3`` as a string; accept it (and ``1e4`` steps) as a number, written as a number is (not
    ``1_0``); an integer exactly (``4294967295.0000001`` is no integer, though it rounds to one as a float)."""
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 400 or not _NUMBER_TEXT.fullmatch(text):
            raise ReservoirError(f"{what} must be a number, found {options.shown(value)}")
        if integer:
            exact = decimal.Decimal(text)
            if exact != exact.to_integral_value():
                raise ReservoirError(f"{what} must be an integer, found {options.shown(value)}")
            if abs(exact.adjusted()) > 400:
                raise ReservoirError(f"{what} must be an integer of at most 400 digits, found {options.shown(value)}")
            return int(exact)
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReservoirError(f"{what} must be a number, found {value!r}")
    if isinstance(value, int):  # of any size: the bounds checked later say whether it is too large
        return value if integer else to_float(value, what)
    if integer:
        if not math.isfinite(value):  # (a real number's bounds say why it is refused)
            raise ReservoirError(f"{what} must be a finite number, found {value!r}")
        if not value.is_integer():
            raise ReservoirError(f"{what} must be an integer, found {value!r}")
        return int(value)
    return value


def integer(value: Any, what: str) -> int:
    """:func:`number` for a value that must be an integer."""
    return int(number(value, what, integer=True))


def to_float(value: int, what: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ReservoirError(f"{what} must be a finite number, found an integer of {len(str(abs(value))):,} "
                             "digits") from None


def choices(values: list, allowed: tuple[str, ...], what: str, where: str) -> list[str]:
    """``values`` as text, each checked to be one of ``allowed``."""
    for v in values:
        if v not in allowed:
            raise ReservoirError(f"unknown {what} {v!r} in {where}; expected one of: {', '.join(allowed)}")
    return [str(v) for v in values]


def takes(tasks: Any, param: str) -> bool:
    """Whether every task named takes ``param`` (defaults' task_params apply only there)."""
    from reservoir.tasks import TASKS

    return all(t not in TASKS or param in TASKS[t].defaults for t in as_list(tasks))


_ID = re.compile(r"[A-Za-z0-9._-]+")


def check_id(value: Any, what: str) -> str:
    """A recipe name or a cell tag: it names a results folder, so one safe folder name (no ``/``, not ``..``),
    written as text (YAML reads ``no`` as false, ``010`` as 8 and ``12:30`` as 750: quoted, they stay as written)."""
    if not isinstance(value, str):
        raise ReservoirError(f"{what}: expected text; found {options.shown(value)}, which YAML read as a "
                             f"{type(value).__name__} (quote it to keep it as written)")
    text = value
    if len(text) > MAX_ID:
        raise ReservoirError(f"{what}: expected at most {MAX_ID} characters (it names a folder), found "
                             f"{len(text):,}")
    if not _ID.fullmatch(text) or text in (".", ".."):
        raise ReservoirError(f"{what}: expected letters, digits, '.', '_' or '-' (one folder name, not '.' or '..'), "
                             f"found {text!r}")
    return text


def mapping(value: Any, what: str) -> dict[str, Any]:
    """A mapping from YAML (absent: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReservoirError(f"{what} must be a mapping, found {value!r}")
    return value


def once(values: list[Any], key: str, where: str) -> None:
    """Refuse a value listed twice under ``key`` (one run's results files would be read twice, as two seeds)."""
    twice = options.repeated(values)
    if twice is not None:
        raise ReservoirError(f"{key} in {where}: expected each value once, found {twice!r} twice")
