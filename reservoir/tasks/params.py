"""Checking a task's parameters: one line naming the task, the parameter, what was expected and what came.

Every task builder checks its arguments with these before building anything,
so a bad value from the CLI (``-p n_train=0``), a recipe or Python fails the
same way::

    task 'bit-xor': n_bits must be an integer in [1, 256]; found 0
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.options import is_bool, shown

__all__ = ["MAX_SIZE", "bool_param", "choice_param", "int_param"]

#: Largest count or length a task parameter may ask for (rows, positions, bits): past it, arrays would not fit in
#: any machine's memory, and the request is refused before anything is allocated.
MAX_SIZE = 10**8


def bool_param(task: str, name: str, value: Any) -> bool:
    """``value`` as a ``bool`` (Python's or numpy's), else a one-line ReservoirError: a string such as ``"no"``
    would be true.

    Examples
    --------
    >>> import numpy as np
    >>> bool_param("mnist", "download", np.True_)
    True
    >>> bool_param("mnist", "download", "no")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: task 'mnist': download must be true or false; found 'no'
    """
    if is_bool(value):
        return bool(value)
    raise ReservoirError(f"task {task!r}: {name} must be true or false; found {shown(value)}")


def int_param(task: str, name: str, value: Any, lo: int, hi: int | None = None, *, none_ok: bool = False) -> Any:
    """``value`` as an ``int`` in ``[lo, hi]`` (``hi=None``: no upper bound), else a one-line ReservoirError.

    Parameters
    ----------
    task, name : str
        The task and the parameter, named in the error.
    value : Any
        What the caller passed. Integers of any type (numpy's too) are
        accepted; ``bool`` and non-integral numbers are not.
    lo, hi : int
        Inclusive bounds.
    none_ok : bool
        Also accept ``None`` (returned as is), for "all rows" style parameters.

    Returns
    -------
    int or None

    Examples
    --------
    >>> int_param("bit-xor", "n_bits", 5, 1, 256)
    5
    >>> int_param("mnist", "n_train", 0, 1, none_ok=True)
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: task 'mnist': n_train must be an integer >= 1 or None; found 0
    """
    if value is None and none_ok:
        return None
    bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    expected = f"an integer {bound}" + (" or None" if none_ok else "")
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ReservoirError(f"task {task!r}: {name} must be {expected}; found {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ReservoirError(f"task {task!r}: {name} must be {expected}; found {shown(value)}")
    if "seed" not in name and value > MAX_SIZE:  # a count or a length: bounded before anything is allocated
        raise ReservoirError(f"task {task!r}: {name} must be at most {MAX_SIZE:,} (a size bound of the toolkit); "
                             f"found {shown(value)}")
    return value


def choice_param(task: str, name: str, value: Any, options: Sequence[str]) -> str:
    """``value`` if it is one of ``options``, else a one-line ReservoirError listing them.

    Examples
    --------
    >>> choice_param("listops", "source", "lra", ("generate", "lra"))
    'lra'
    """
    if value not in options:
        raise ReservoirError(f"task {task!r}: {name} must be one of {', '.join(map(repr, options))}; found {value!r}")
    return value


def check_size(task: str, nbytes: int, made: str) -> None:
    """Refuse, before any array is made, parameters whose arrays (``made``: what they are, e.g. ``"2,500 rows of
    6,000 bits"``) would take more than the machine's available memory: one line, not a swapping machine or a
    killed process."""
    from reservoir.io import check_memory

    check_memory(f"task {task!r}", nbytes, f"arrays ({made})")
