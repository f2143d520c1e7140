"""Columns as arrays, for the ``data`` task's columnar files (:mod:`reservoir.tasks.columns` reads the tables).

Inputs
    One sequence per row: a list of integers is token ids, a list of numbers
    one number per position (vectors of size 1), a list of lists of numbers
    one vector per position (every vector of one size ``d``). A CSV cell
    holds the list as JSON (``[3, 1, 4]``, ``[[0.5, 1.0], [0.2, 0.1]]``) or
    as numbers separated by spaces (``3 1 4``). Rows of different lengths are
    right-padded with 0 and their lengths kept.
Labels
    One integer ``>= 0`` per row.

pyarrow comes with the optional extra ``pip install 'reservoir[datasets]'``;
it is imported when a column is read. Every problem is one
:class:`ReservoirError` line, ``<file>: <field>: expected ...; found ...``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import check_memory, one_line
from reservoir.tasks.arrays import pad_rows

__all__ = ["INSTALL", "column_error", "contiguous", "label_array", "parse_text", "require_pyarrow",
           "sequence_arrays"]

INSTALL = "pip install 'reservoir[datasets]'"


def column_error(source: Path, field: str, expected: str, found: str) -> ReservoirError:
    """The refusal of a file's column, in the form every refusal here takes."""
    return ReservoirError(f"{source}: {field}: expected {expected}; found {found}")


def require_pyarrow(source: Path) -> Any:
    """The ``pyarrow`` module, or one line saying how to install it."""
    try:
        import pyarrow
        import pyarrow.compute  # noqa: F401
    except ImportError:
        raise ReservoirError(f"{source}: expected the optional package pyarrow to read Parquet, CSV or datasets "
                             f"folders; found it not installed ({INSTALL})") from None
    return pyarrow


def contiguous(pa: Any, column: Any) -> Any:
    """One contiguous array (chunks combined, an extension type's storage)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return arr.storage if isinstance(arr, pa.ExtensionArray) else arr


def _is_list(pa: Any, t: Any) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def sequence_arrays(source: Path, field: str, column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A column of sequences as right-padded inputs and their lengths.

    Returns
    -------
    inputs : np.ndarray
        int64 ``(N, L)`` token ids for lists of integers; float32 ``(N, L, d)``
        for lists of numbers (``d = 1``) or of vectors. Padded with 0.
    lengths : np.ndarray
        int64 ``(N,)``, each row's number of positions.
    """
    pa = require_pyarrow(source)
    arr = contiguous(pa, column)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = parse_text(source, field, arr)
    what = "a sequence per row: a list of token ids, of numbers, or of vectors"
    if not _is_list(pa, arr.type):
        raise column_error(source, field, what, f"values of type {arr.type}")
    if arr.null_count:
        row = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
        raise column_error(source, field, what, f"a missing value at row {row}")
    lengths = pa.compute.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)  # (N,)
    if len(lengths) and lengths.min() < 1:
        raise column_error(source, field, "at least one position per row",
                           f"an empty sequence at row {np.argmin(lengths)}")
    values = contiguous(pa, arr.flatten())
    d = None
    if _is_list(pa, values.type):  # one vector per position
        if values.null_count:
            raise column_error(source, field, "a vector at every position", "a missing one")
        sizes = pa.compute.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(sizes) and (sizes.min() != sizes.max() or sizes.min() < 1):
            raise column_error(source, field, "vectors of one size d >= 1 at every position",
                               f"sizes {sizes.min()} to {sizes.max()}")
        d = int(sizes[0]) if len(sizes) else 1
        values = contiguous(pa, values.flatten())
    t = values.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or values.null_count:
        found = "a missing value inside a sequence" if values.null_count else f"values of type {t}"
        raise column_error(source, field, "numbers inside each sequence (integers: token ids)", found)
    flat = values.to_numpy(zero_copy_only=False)
    tokens = d is None and pa.types.is_integer(t)
    width = int(lengths.max()) if len(lengths) else 0
    # the padded array, before it is made: one long row pads every other row to its length
    check_memory(f"{source}: {field}", len(lengths) * width * (8 if tokens else 4 * (d or 1)),
                 f"padded sequences ({len(lengths):,} rows x {width:,} positions)")
    if tokens:  # an id beyond int64 (uint64) stays as it is, for the vocabulary check to name it, not wrapped
        big = flat.dtype == np.uint64 and flat.size and flat.max() > np.iinfo(np.int64).max
        return pad_rows(flat if big else flat.astype(np.int64, copy=False), lengths), lengths
    with np.errstate(over="ignore"):  # a float64 beyond float32 becomes infinity, refused as not finite
        return pad_rows(flat.astype(np.float32, copy=False).reshape(-1, d or 1), lengths), lengths


#: A number as JSON writes it (and Python's ``json`` reads ``NaN``/``Infinity``), in RE2 syntax for pyarrow.
_NUMBER = r"(?:NaN|-?Infinity|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
#: A flat cell: numbers separated by spaces, or a JSON list of numbers (empty allowed: refused as empty below).
_FLAT_CELL = (rf"^(?:(?:{_NUMBER}(?:[\s\p{{Z}}]+{_NUMBER})*)?"  # spaces as str.split() takes them (Unicode's too)
              rf"|\[\s*(?:{_NUMBER}(?:\s*,\s*{_NUMBER})*)?\s*\])$")
#: Bytes parsing may take per byte of cell text: vectorised (copies, split strings and their offsets, the numbers)
#: or cell by cell as Python objects (a nested list of vectors: about 36 bytes per number).
_FLAT_PER_BYTE, _NESTED_PER_BYTE = 8, 20


def parse_text(source: Path, field: str, arr: Any) -> Any:
    """CSV text cells (a JSON list, or numbers separated by spaces) as a pyarrow list array.

    Flat cells, the common case, are parsed by pyarrow's compute kernels (a
    number's JSON form checked first, so nothing JSON would refuse is taken);
    cells of nested lists (a vector per position) are parsed cell by cell.
    """
    pa = require_pyarrow(source)
    pc = pa.compute
    text = pc.utf8_trim_whitespace(arr)
    flat = pc.match_substring_regex(text, _FLAT_CELL).to_numpy(zero_copy_only=False)  # None for a missing cell
    bad = np.flatnonzero(flat == False)  # noqa: E712 (an object array of True/False/None)
    if not len(bad):
        check_memory(f"{source}: {field}", _FLAT_PER_BYTE * arr.nbytes, "cells parsed (about eight times their text)")
        unbracketed = pc.replace_substring_regex(text, r"^\[|\]$", "")
        inner = pc.utf8_trim_whitespace(pc.replace_substring(unbracketed, ",", " "))
        empty = np.flatnonzero(pc.fill_null(pc.equal(pc.utf8_length(inner), 0), False))
        if len(empty):
            raise column_error(source, field, "at least one position per row", f"an empty sequence at row {empty[0]}")
        parts = pc.utf8_split_whitespace(inner)
        integers = pc.all(pc.match_substring_regex(parts.flatten(), r"^-?[0-9]+$")).as_py() is not False
        try:
            return pc.cast(parts, pa.list_(pa.int64() if integers else pa.float64()))
        except pa.ArrowException as err:  # an integer beyond int64
            raise column_error(source, field, "lists of numbers (or of vectors of numbers)", one_line(err)) from None
    unlisted = next((int(i) for i in bad if not arr[int(i)].as_py().lstrip().startswith("[")), None)
    if unlisted is not None:  # not a JSON list either: refused as it is
        raise _bad_cell(source, field, arr[unlisted].as_py(), unlisted)
    check_memory(f"{source}: {field}", _NESTED_PER_BYTE * arr.nbytes, "cells parsed (about 20 times their text)")
    rows: list[Any] = []
    for i, cell in enumerate(arr.to_pylist()):
        try:  # a flat cell among nested ones keeps its form: pyarrow then says they cannot mix
            t = None if cell is None else cell.strip()
            rows.append(None if t is None else json.loads(t) if t.startswith("[")
                        else [json.loads(v) for v in t.split()])
        except (ValueError, RecursionError):
            raise _bad_cell(source, field, cell, i) from None
    try:
        return pa.array(rows)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
        raise column_error(source, field, "lists of numbers (or of vectors of numbers)", one_line(err)) from None


#: A value that is not a finite number, as a cell may spell it (``nan``, ``-inf``, ``Infinity``; any case).
_NOT_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


def _bad_cell(source: Path, field: str, cell: str, row: int) -> ReservoirError:
    """The refusal of a text cell that is no list of numbers: naming a value that is not finite where it holds one
    (the cause, not the cell's form), else the form expected."""
    words = re.split(r"[\s,\[\]]+", cell)
    odd = next((w for w in words if _NOT_FINITE.fullmatch(w)), None)
    if odd is not None:
        return column_error(source, field, "finite numbers in every cell", f"{odd!r} at row {row}")
    return column_error(source, field, "a JSON list or numbers separated by spaces in every cell",
                        f"{cell[:40]!r} at row {row}")


def label_array(source: Path, field: str, column: Any) -> np.ndarray:
    """A column of integer labels as int64 ``(N,)``."""
    pa = require_pyarrow(source)
    arr = contiguous(pa, column)
    if not (pa.types.is_integer(arr.type) or pa.types.is_boolean(arr.type)):
        raise column_error(source, field, "integer labels (class ids >= 0)", f"values of type {arr.type}")
    if arr.null_count:
        row = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
        raise column_error(source, field, "a label in every row", f"a missing value at row {row}")
    values = arr.to_numpy(zero_copy_only=False)
    return values if values.dtype.kind in "iu" else values.astype(np.int64)  # a uint64 checked as it is, not wrapped
