"""Labelled arrays in a file as a task: the ``data`` task (``reservoir extract --data PATH``).

What ``path`` is decides how it is read:

``.npz`` (``numpy.savez``)
    Fields ``{split}_inputs``, ``{split}_labels`` and optional
    ``{split}_lengths`` for the splits ``train`` and ``test`` (required) and
    ``val`` (optional), and an optional integer ``vocab_size``. Integer inputs
    ``(N, L)`` are token ids (vocabulary ``vocab_size``, else the largest id
    + 1); numeric inputs ``(N, L, d)`` are vectors. Ragged sequences are
    right-padded, with lengths ``(N,)`` in ``1..L`` (default ``L``). Labels are
    integers ``(N, ...)`` ``>= 0``. A field named ``train_``/``val_``/
    ``validation_``/``test_`` + anything else, or any other split's
    ``*_inputs``/``*_labels``/``*_lengths`` (``valid_inputs``,
    ``VAL_labels``), is refused (a typo would otherwise be ignored); other
    fields are ignored.
a ``datasets`` ``save_to_disk`` folder, a ``.parquet`` or ``.csv`` file
    An input and a label column (``input_column``, ``label_column``); see
    :mod:`reservoir.tasks.columns` for the layout and the splits, :mod:`reservoir.tasks.cells` for the columns.

The task is built by :func:`~reservoir.tasks.arrays.checked_task`, so it is
checked and fingerprinted like a built-in one (from its name ``data``, its
parameters, the file's absolute path among them, and its arrays). The task
cache keys it by the file's size and modification time. Every problem is one
line naming the file and the field: ``<file>: train_labels: expected ...;
found ...``.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import ArrayHeader, check_local, check_memory, file_kind, lookup, npy_header, one_line
from reservoir.tasks.arrays import MAX_VOCAB, TOKEN_DTYPES, checked_task, train_classes
from reservoir.tasks.base import TaskData, TaskSpec, register

__all__ = ["build_data", "check_split", "read_npz"]

NAME = "data"
SPLITS = ("train", "val", "test")
PARTS = ("inputs", "labels", "lengths")
COLUMNAR = (".parquet", ".pq", ".csv")
_OURS = re.compile(r"(train|val|validation|test)_(.*)")
#: Any other split's field (``valid_inputs``, ``dev_labels``, ``VAL_inputs``): refused, never dropped unread.
_SPLIT_FIELD = re.compile(r"(.+)_(inputs|labels|lengths)", re.IGNORECASE)


def build_data(path: str | None = None, input_column: str = "inputs", label_column: str = "label") -> TaskData:
    """Build the ``data`` task from the file or folder at ``path`` (see the module docstring).

    Parameters
    ----------
    path : str
        An ``.npz``, ``.parquet`` or ``.csv`` file, or a ``save_to_disk`` folder.
    input_column, label_column : str
        The columns of a columnar file (unused for ``.npz``).

    Returns
    -------
    TaskData
        Named ``data``; ``params`` holds the absolute path (and the columns
        for a columnar file). Splits in the order train, val, test.
    """
    if path is None or not str(path).strip():
        raise ReservoirError(f"task {NAME!r}: expected path, the data file (--data PATH, or -p path=PATH); found none")
    check_local(path, "a data file")
    source = Path(os.path.expanduser(os.fspath(path))).resolve()
    kind = _kind_of(source)
    if kind == "npz":
        splits, vocab_size = read_npz(source)
        params: dict[str, Any] = {"path": str(source)}
    else:
        for name, value in (("input_column", input_column), ("label_column", label_column)):
            if not isinstance(value, str) or not value:
                raise ReservoirError(f"task {NAME!r}: expected {name} a column name; found {value!r}")
        splits, vocab_size = _read_columnar(source, input_column, label_column), None
        params = {"path": str(source), "input_column": input_column, "label_column": label_column}
    try:
        task = checked_task(NAME, splits, d_in=vocab_size, params=params)
    except ReservoirError as err:  # what only the whole task shows (one class, kinds or sizes that differ by split)
        raise ReservoirError(f"{source}: {err}") from None
    # a train split of one class: no readout or training can use the store, refused before its pass
    train_classes(task.splits["train"].labels, str(source))
    return task


def _kind_of(source: Path) -> str:
    """``"npz"``, ``"columns"`` (a Parquet or CSV file, a folder); anything else is refused in one line."""
    expected = "an .npz, .parquet or .csv file, or a folder written by datasets' save_to_disk"
    st = lookup(source)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return "columns"
    if st is None or not stat.S_ISREG(st.st_mode):
        found = "no such file or folder" if st is None else file_kind(st.st_mode)
        raise ReservoirError(f"{source}: expected {expected}; found {found}")
    suffix = source.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in COLUMNAR:
        return "columns"
    raise ReservoirError(f"{source}: expected {expected}; found a file ending in {suffix or '(no suffix)'!r}")


def read_npz(source: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray | None, np.ndarray]], int | None]:
    """The splits of an ``.npz`` file, each checked, and its ``vocab_size``.

    Returns
    -------
    splits : dict of str to tuple
        ``{"train": (inputs, lengths or None, labels), ...}`` in the order
        train, val, test, as :func:`check_split` returns them.
    vocab_size : int or None
    """
    fields = _npz_fields(source)
    names = _npz_names(source)  # every field of the file, read by the task or not
    found = ", ".join(names[:12]) + (f", ... ({len(names):,} in all)" if len(names) > 12 else "") or "(none)"
    splits = {}
    for split in SPLITS:
        have = [p for p in PARTS if f"{split}_{p}" in fields]
        if not have and split == "val":
            continue
        for part in ("inputs", "labels"):
            if part not in have:
                why = f"split {split!r} is required" if split != "val" else f"beside val_{have[0]}"
                raise ReservoirError(f"{source}: {split}_{part}: expected this field ({why}); found fields {found}")
        names = {p: f"{split}_{p}" for p in PARTS}
        inputs, lengths, labels = (fields.get(f"{split}_{p}") for p in ("inputs", "lengths", "labels"))
        splits[split] = check_split(source, names, inputs, lengths, labels)
    return splits, _vocab_size(source, fields.get("vocab_size"), splits)


def _npz_names(source: Path) -> list[str]:
    """The names of the fields of the ``.npz`` archive ``source`` (one already opened once), in the archive's order."""
    with zipfile.ZipFile(source) as archive:
        return [name.removesuffix(".npy") for name in archive.namelist()]


def _npz_fields(source: Path) -> dict[str, np.ndarray]:
    """The fields of an ``.npz`` the task reads (``{split}_{part}``, ``vocab_size``), loaded; no pickles.

    Every field's header is read and checked first (its data against the
    member's size, each split's shapes and kinds against each other, the total
    against the memory available), so a lying or oversized archive is refused
    before anything is decompressed.
    """
    expected = "an .npz archive written by numpy.savez"
    if not zipfile.is_zipfile(source):
        with open(source, "rb") as f:
            head = f.read(8)
        found = ("a damaged or truncated zip archive" if head.startswith(b"PK") else
                 f"a file that is not a zip archive (starting {head!r})")
        raise ReservoirError(f"{source}: expected {expected}; found {found}")
    headers = _npz_headers(source, expected)
    for split in SPLITS:
        names = {p: f"{split}_{p}" for p in PARTS}
        if names["inputs"] in headers and names["labels"] in headers:
            check_layout(source, names, *(headers[names[p]][0] if names[p] in headers else None
                                          for p in ("inputs", "lengths", "labels")))
    check_memory(str(source), sum(_resident(h) for h, _ in headers.values()),
                 "arrays read and converted (token ids to int64, numbers to float32)")
    out = {}
    try:
        with zipfile.ZipFile(source) as archive:
            for name, (_, info) in headers.items():  # the very members whose headers were checked
                with archive.open(info) as member:
                    out[name] = np.lib.format.read_array(member, allow_pickle=False)
    except (OSError, ValueError, EOFError, RuntimeError, zipfile.BadZipFile, NotImplementedError) as err:
        raise ReservoirError(f"{source}: expected {expected}; found {one_line(err)}") from None
    return out


def _npz_headers(source: Path, expected: str) -> dict[str, tuple[ArrayHeader, zipfile.ZipInfo]]:
    """The headers of the fields the task reads and their members, each checked against the member's declared size
    (no data read). A field stored twice (``x`` and ``x.npy``) is refused: which one a reader takes is not ours."""
    out: dict[str, tuple[ArrayHeader, zipfile.ZipInfo]] = {}
    try:
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                m = _OURS.fullmatch(name)
                if m and (m.group(1) not in SPLITS or m.group(2) not in PARTS):
                    split = "val" if m.group(1) == "validation" else m.group(1)
                    raise ReservoirError(f"{source}: {name}: expected {split}_inputs, {split}_labels or "
                                         f"{split}_lengths (the fields of split {split!r}); found {name!r}")
                if not m and _SPLIT_FIELD.fullmatch(name):
                    raise ReservoirError(f"{source}: {name}: expected the fields of the splits train, val and test "
                                         f"(train_inputs, val_labels, ...: a validation split is named val); found "
                                         f"{name!r}")
                if not m and name != "vocab_size":
                    continue
                if name in out:
                    raise ReservoirError(f"{source}: {name}: expected each field once; found the members "
                                         f"{out[name][1].filename!r} and {info.filename!r}")
                with archive.open(info) as member:  # RuntimeError: an encrypted member
                    out[name] = (npy_header(member, f"{source}: {name}", info.file_size), info)
    except (OSError, EOFError, RuntimeError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as err:
        raise ReservoirError(f"{source}: expected {expected}; found {one_line(err)}") from None
    return out


def _resident(header: ArrayHeader) -> int:
    """Bytes an array takes read, plus its converted copy where the task keeps another dtype (int8, bool, uint16
    or uint32 ids as int64: 8 bytes each however small the file's; float16 or float64 numbers as float32)."""
    n = int(np.prod(header.shape, dtype=object))
    dtype = np.dtype(header.dtype)
    if dtype.kind == "f":
        return header.nbytes + (0 if dtype == np.float32 else 4 * n)
    return header.nbytes + (0 if dtype in TOKEN_DTYPES else 8 * n)


def check_layout(source: Path, names: dict[str, str], inputs: Any, lengths: Any, labels: Any) -> None:
    """The kinds and shapes of one split's arrays (or of their ``.npy`` headers) checked against each other; see
    :func:`check_split`. Reads no values."""
    def fail(part: str, expected: str, found: str) -> ReservoirError:
        return ReservoirError(f"{source}: {names[part]}: expected {expected}; found {found}")

    kinds = "integer token ids (N, L) or numeric vectors (N, L, d)"
    kind, ndim, shape = inputs.dtype.kind, len(inputs.shape), tuple(inputs.shape)
    if kind not in "biuf" or ndim not in (2, 3) or (ndim == 2 and kind == "f"):
        hint = " (one number per position is (N, L, 1))" if ndim == 2 and kind == "f" else ""
        raise fail("inputs", kinds, f"{inputs.dtype} of shape {shape}{hint}")
    if 0 in shape:
        raise fail("inputs", "at least one row, one position (and one number per vector)", f"shape {shape}")
    n = shape[0]
    if labels.dtype.kind not in "biu":
        raise fail("labels", "integer labels (class ids >= 0)", f"{labels.dtype}")
    if len(labels.shape) < 1 or labels.shape[0] != n:
        found = f"{labels.shape[0]} rows" if labels.shape else "a single number"
        raise fail("labels", f"{n} rows, one per row of {names['inputs']}", found)
    if lengths is not None and (lengths.dtype.kind not in "iu" or tuple(lengths.shape) != (n,)):
        raise fail("lengths", f"integers of shape ({n},), one per row of {names['inputs']}",
                   f"{lengths.dtype} of shape {tuple(lengths.shape)}")


def check_split(source: Path, names: dict[str, str], inputs: Any, lengths: Any, labels: Any
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """One split's arrays checked against each other, every problem one line naming the file and the field.

    Parameters
    ----------
    source : Path
        The file, named in errors.
    names : dict
        What each array is called in errors: ``{"inputs": "train_inputs", "labels": ..., "lengths": ...}``.
    inputs : array
        Integer token ids ``(N, L)`` or numeric vectors ``(N, L, d)``, finite.
    lengths : array or None
        Integers ``(N,)`` in ``1..L``; ``None``: every row is full length.
    labels : array
        Integers ``(N, ...)`` ``>= 0``.

    Returns
    -------
    tuple
        ``(inputs, lengths, labels)`` as arrays (float inputs as float32).
    """
    def fail(part: str, expected: str, found: str) -> ReservoirError:
        return ReservoirError(f"{source}: {names[part]}: expected {expected}; found {found}")

    inputs, labels = np.asarray(inputs), np.asarray(labels)
    lengths = None if lengths is None else np.asarray(lengths)
    check_layout(source, names, inputs, lengths, labels)
    if inputs.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):  # beyond float32's range: infinity, refused just below
            inputs = inputs.astype(np.float32, copy=False)
        finite = np.isfinite(inputs).reshape(len(inputs), -1).all(axis=1)  # (N,)
        if not finite.all():
            row = int(np.argmin(finite))
            what = "NaN" if np.isnan(inputs[row]).any() else "infinity"
            raise fail("inputs", "finite numbers (as float32)", f"{what} at row {row}")
    n, L = inputs.shape[:2]
    if labels.size and labels.min() < 0:
        row = int(np.argmin(labels.reshape(n, -1).min(axis=1)))
        raise fail("labels", "labels >= 0", f"{labels.min()} at row {row}")
    if lengths is not None:
        bad = (lengths < 1) | (lengths > L)
        if bad.any():
            row = int(np.argmax(bad))
            raise fail("lengths", f"lengths in 1..{L} ({names['inputs']} has {L} positions)",
                       f"{lengths[row]} at row {row}")
    return inputs, lengths, labels


def _vocab_size(source: Path, value: Any, splits: dict[str, tuple]) -> int | None:
    """The file's ``vocab_size``, checked against the token ids (and refused for vector inputs)."""
    if value is None:
        return None
    if value.ndim != 0 or value.dtype.kind not in "iu":
        raise ReservoirError(f"{source}: vocab_size: expected one integer; found {value.dtype} of shape {value.shape}")
    size = int(value)
    if size > MAX_VOCAB:
        raise ReservoirError(f"{source}: vocab_size: expected at most {MAX_VOCAB:,} (a one-hot vocabulary); found "
                             f"{size:,}")
    if any(x.ndim != 2 for x, _, _ in splits.values()):
        raise ReservoirError(f"{source}: vocab_size: expected it only with token ids (integer inputs (N, L)); found "
                             "vector inputs (N, L, d)")
    largest = max(int(x.max()) for x, _, _ in splits.values())
    lowest = min(int(x.min()) for x, _, _ in splits.values())
    if size < 1 or largest >= size or lowest < 0:
        raise ReservoirError(f"{source}: vocab_size: expected a size above every token id (ids in {lowest}.."
                             f"{largest}, all >= 0); found {size}")
    return size


def _read_columnar(source: Path, input_column: str, label_column: str) -> dict[str, tuple]:
    """The splits of a Parquet or CSV file or a ``save_to_disk`` folder, each checked."""
    from reservoir.tasks.cells import label_array, sequence_arrays
    from reservoir.tasks.columns import read_tables

    tables = read_tables(source, input_column, label_column)
    if not {"train", "test"} <= set(tables):
        raise ReservoirError(f"{source}: splits: expected 'train' and 'test' (and optionally 'val'); found "
                             f"{', '.join(map(repr, tables)) or 'no rows'}")
    out = {}
    for split, table in tables.items():
        names = {"inputs": f"split {split!r}, column {input_column!r}",
                 "labels": f"split {split!r}, column {label_column!r}"}
        names["lengths"] = names["inputs"]
        inputs, lengths = sequence_arrays(source, names["inputs"], table[input_column])
        labels = label_array(source, names["labels"], table[label_column])
        out[split] = check_split(source, names, inputs, lengths, labels)
    return out


register(
    TaskSpec(
        name=NAME,
        build=build_data,
        summary="your labelled arrays from a file: .npz, a datasets save_to_disk folder, .parquet or .csv",
        source="the file at path (reservoir extract --data PATH); see README 'Tasks and data'",
        tokens="the file's L",
        d_in="vocab_size or largest id + 1 (tokens), d (vectors)",
        classes="largest label + 1",
        splits="train, test (val optional)",
    )
)
