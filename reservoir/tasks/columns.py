"""Columnar data files for the ``data`` task: a ``datasets`` ``save_to_disk`` folder, a Parquet or a CSV file.

All three are read through pyarrow, which the optional extra ``pip install
'reservoir[datasets]'`` brings (with Hugging Face ``datasets``, needed for the
folders); nothing here is imported until such a file is read.

Columns
    The input column holds one sequence per row: a list of integers is token
    ids, a list of numbers one number per position (vectors of size 1), a
    list of lists of numbers one vector per position (every vector of one
    size ``d``). A CSV cell holds the list as JSON (``[3, 1, 4]``,
    ``[[0.5, 1.0], [0.2, 0.1]]``) or as numbers separated by spaces
    (``3 1 4``). Rows of different lengths are right-padded with 0 and their
    lengths kept. The label column holds one integer ``>= 0`` per row.
Splits
    A ``DatasetDict`` folder: its splits ``train``, ``test`` and ``val`` (or
    ``validation``); any other split is skipped, and said so. A single table
    (a ``Dataset`` folder, a Parquet or a CSV file): the column ``split``
    says each row's split, ``train``, ``test``, ``val`` or ``validation``.

Every problem is one :class:`ReservoirError` line, ``<file>: <field>:
expected ...; found ...``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import check_memory, check_regular, one_line, read_json
from reservoir.tasks.arrays import pad_rows

__all__ = ["SPLIT_COLUMN", "label_array", "read_tables", "sequence_arrays"]

log = logging.getLogger("reservoir")

SPLIT_COLUMN = "split"
#: Split names a file may use, and the task's name for each.
SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}
INSTALL = "pip install 'reservoir[datasets]'"


def _fail(source: Path, field: str, expected: str, found: str) -> ReservoirError:
    return ReservoirError(f"{source}: {field}: expected {expected}; found {found}")


def _pyarrow(source: Path) -> Any:
    """The ``pyarrow`` module, or one line saying how to install it."""
    try:
        import pyarrow
        import pyarrow.compute  # noqa: F401
    except ImportError:
        raise ReservoirError(f"{source}: expected the optional package pyarrow to read Parquet, CSV or datasets "
                             f"folders; found it not installed ({INSTALL})") from None
    return pyarrow


def read_tables(source: Path, inputs: str, labels: str) -> dict[str, Any]:
    """The file's splits as pyarrow tables of the columns ``inputs`` and ``labels`` (each checked to exist).

    Parameters
    ----------
    source : Path
        A ``save_to_disk`` folder, a ``.parquet`` or a ``.csv`` file.
    inputs, labels : str
        The input and label columns.

    Returns
    -------
    dict of str to pyarrow.Table
        Split name (``train``, ``val``, ``test``, in that order) to that
        split's rows; the file's ``validation`` is ``val``. The caller checks
        which splits are present.
    """
    pa = _pyarrow(source)
    if inputs == labels:
        raise ReservoirError(f"{source}: expected the inputs and the labels in two columns; found {inputs!r} named for "
                             "both (--input-column, --label-column)")
    wanted = {inputs: "--input-column", labels: "--label-column"}
    single = {**wanted, SPLIT_COLUMN: "a single table names each row's split"}
    folder = source.is_dir()
    if folder:
        loaded = _load_from_disk(source)
        if isinstance(loaded, dict):  # a DatasetDict
            return _named_splits(source, loaded, wanted)
    if SPLIT_COLUMN in wanted:
        flag = wanted[SPLIT_COLUMN]
        raise ReservoirError(f"{source}: column {SPLIT_COLUMN!r}: expected another column for {flag}; found "
                             f"{SPLIT_COLUMN!r}, which names each row's split in a single table")
    if folder:
        _has_columns(source, "", loaded.column_names, single)
        table = loaded.select_columns(list(single)).with_format("arrow")[:]
    elif source.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            _has_columns(source, "", pq.read_schema(source).names, single)
            check_memory(str(source), _parquet_bytes(pq.ParquetFile(source).metadata, set(single)),
                         "decoded columns")
            table = pq.read_table(source, columns=list(single))
        except (OSError, pa.ArrowException) as err:
            raise ReservoirError(f"{source}: expected a Parquet file; found {one_line(err)}") from None
    else:
        import pyarrow.csv as pacsv

        # the table holds the file's text once, with offsets and numbers beside it: at most about twice its size
        check_memory(str(source), 2 * check_regular(source, "a CSV file"),
                     "columns read as a table (about twice the file's size)")
        _check_utf8_start(source)
        try:  # the inputs as text, parsed below: a cell of one number is a sequence of one, not an int column
            table = pacsv.read_csv(source, convert_options=pacsv.ConvertOptions(column_types={inputs: pa.string()}))
        except (OSError, pa.ArrowException) as err:
            if "invalid UTF8" in str(err):
                found = _not_utf8(source)
                raise ReservoirError(f"{source}: expected a CSV file of UTF-8 text; found {found}") from None
            raise ReservoirError(f"{source}: expected a CSV file with a header row; found {one_line(err)}") from None
        _has_columns(source, "", table.column_names, single)
        for name in single:
            if table.column_names.count(name) > 1:
                raise _fail(source, f"column {name!r}", "it once in the header row",
                            f"it {table.column_names.count(name)} times")
            if pa.types.is_binary(table[name].type):  # text pyarrow could not read as UTF-8 is bytes, not refused
                raise ReservoirError(f"{source}: expected a CSV file of UTF-8 text; found {_not_utf8(source)}")
        # parsed whole, before the rows are split: tokens or numbers is one decision for the file (a writer that
        # prints 1.0 as 1 leaves one split all integers), and a bad cell's row is its row in the file
        parsed = _parse_text(source, f"column {inputs!r}", _plain(pa, table[inputs]))
        table = table.set_column(table.column_names.index(inputs), inputs, parsed)
    return _split_column(source, table.select(list(single)))


def _parquet_bytes(meta: Any, columns: set[str]) -> int:
    """About how many bytes the ``columns`` of a Parquet file take decoded, from its footer alone: each column
    chunk's uncompressed pages, or 8 bytes a value where its encoding (a run of one value, a dictionary) is
    smaller than that."""
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            path = chunk.path_in_schema  # a list column's values: "<name>.list.element"
            if any(path == name or path.startswith(name + ".") for name in columns):
                total += max(chunk.total_uncompressed_size, 8 * chunk.num_values)
    return total


def _load_from_disk(source: Path) -> Any:
    """What ``datasets.load_from_disk`` reads from the folder (a Dataset or a DatasetDict)."""
    if not is_saved_dataset(source):  # refused now, not after walking a mistyped folder (/usr, say) twice
        raise ReservoirError(f"{source}: expected a folder written by datasets' save_to_disk (dataset_dict.json or "
                             "state.json at its top), or a data file (.npz, .parquet, .csv); found neither file")
    try:
        import datasets
    except ImportError:
        raise ReservoirError(f"{source}: expected the optional package datasets to read a save_to_disk folder; found "
                             f"it not installed ({INSTALL})") from None
    _check_contained(source)
    try:
        return datasets.load_from_disk(str(source))
    except Exception as err:  # noqa: BLE001 - any library error is a folder it cannot read
        raise ReservoirError(f"{source}: expected a folder written by datasets' save_to_disk (or a data file: .npz, "
                             f".parquet, .csv); found {one_line(err)}") from None


def is_saved_dataset(folder: Path) -> bool:
    """Whether ``folder`` has the top of a ``save_to_disk`` folder: ``dataset_dict.json`` (splits) or
    ``state.json`` (one dataset)."""
    return any((folder / name).is_file() for name in ("dataset_dict.json", "state.json"))


def _check_contained(source: Path) -> None:
    """Refuse a ``save_to_disk`` folder that would make ``datasets`` read outside it: a link out of the folder, a
    split in ``dataset_dict.json`` or a file in a ``state.json`` named by a path that leaves it."""
    root = source.resolve()

    def inside(path: Path) -> bool:
        return path.resolve().is_relative_to(root)

    paths = sorted(source.rglob("*"))
    for path in paths:
        if path.is_symlink() and not inside(path):
            raise _fail(source, str(path.relative_to(source)), "files inside the folder", f"a link to {path.resolve()}")
    for path in paths:
        where = str(path.relative_to(source))
        if path.name not in ("state.json", "dataset_dict.json") or not path.is_file():
            continue
        meta = read_json(path, "a datasets metadata file (JSON)")
        key, field = ("_data_files", "filename") if path.name == "state.json" else ("splits", None)
        listed = meta.get(key, []) if isinstance(meta, dict) else None
        if not isinstance(listed, list):
            raise _fail(source, f"{where}: {key}", "a list", type(listed).__name__)
        if key == "_data_files" and not listed:  # datasets writes no file for a split of no rows
            split = "the dataset" if path.parent == source else f"split {str(path.parent.relative_to(source))!r}"
            raise _fail(source, split, "at least one row", "none (its state.json lists no data files)")
        for item in listed:
            name = item.get(field) if field and isinstance(item, dict) else item
            if not isinstance(name, str) or not name or not inside(path.parent / name):
                raise _fail(source, f"{where}: {key}", "names of files inside the folder", repr(name)[:200])


def _has_columns(source: Path, where: str, names: list[str], wanted: dict[str, str]) -> None:
    """Refuse a missing column: ``wanted`` maps each name to what the message says about it."""
    for name, hint in wanted.items():
        if name not in names:
            raise _fail(source, f"{where}column {name!r}", f"a column of that name ({hint})",
                        f"columns {', '.join(names) or '(none)'}")


def _named_splits(source: Path, splits: dict[str, Any], wanted: dict[str, str]) -> dict[str, Any]:
    """A DatasetDict's splits under the task's names (``validation`` -> ``val``) as tables; others skipped."""
    out: dict[str, Any] = {}
    for name, ds in splits.items():
        ours = SPLIT_NAMES.get(name)
        if ours is None:
            continue
        if ours in out:
            raise _fail(source, "splits", "one validation split", "both 'val' and 'validation'")
        _has_columns(source, f"split {name!r}, ", ds.column_names, wanted)
        out[ours] = ds.select_columns(list(wanted)).with_format("arrow")[:]
    skipped = [name for name in splits if name not in SPLIT_NAMES]
    if skipped:
        log.info("data %s: skipped split(s) %s (reading train, val or validation, test)", source, ", ".join(skipped))
    return {s: out[s] for s in ("train", "val", "test") if s in out}


#: Byte-order marks of text that is not UTF-8 (UTF-32's first: it begins with UTF-16's).
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
               (b"\xfe\xff", "UTF-16"))


def _check_utf8_start(source: Path) -> None:
    """Refuse a CSV file that begins with another encoding's byte-order mark (pyarrow would read UTF-16 as
    garbled columns)."""
    with open(source, "rb") as f:
        head = f.read(4)
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            raise ReservoirError(f"{source}: expected a CSV file of UTF-8 text; found {name} (its byte-order mark): "
                                 "save it as UTF-8")


def _not_utf8(source: Path) -> str:
    """Where a file's text stops being UTF-8, for a refusal."""
    import codecs

    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(source, "rb") as f:
        while block := f.read(1 << 20):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                where = offset + err.start
                return f"a byte that is not UTF-8 at byte {where:,} (0x{block[err.start]:02x}): save it as UTF-8"
            offset += len(block)
    return "text pyarrow could not read as UTF-8"


def _split_column(source: Path, table: Any) -> dict[str, Any]:
    """One table's rows by the value of its ``split`` column."""
    pa = _pyarrow(source)
    pc = pa.compute
    field = f"column {SPLIT_COLUMN!r}"
    try:
        col = pc.cast(table[SPLIT_COLUMN], pa.string())
    except pa.ArrowException:
        raise _fail(source, field, "split names (text)", str(table.schema.field(SPLIT_COLUMN).type)) from None
    if col.null_count:
        row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise _fail(source, field, "a split name in every row", f"a missing value at row {row}")
    present = pc.unique(col).to_pylist()
    unknown = [v for v in present if v not in SPLIT_NAMES]
    if unknown:
        raise _fail(source, field, f"split names among {', '.join(SPLIT_NAMES)}",
                    ", ".join(repr(v) for v in unknown[:5]))
    if "val" in present and "validation" in present:  # two names of one split: rows of one kept apart, not merged
        raise _fail(source, field, "one name for the validation split", "both 'val' and 'validation'")
    table = table.drop_columns([SPLIT_COLUMN])
    out = {}
    for ours in ("train", "val", "test"):
        names = pa.array([k for k, v in SPLIT_NAMES.items() if v == ours])
        rows = table.filter(pc.is_in(col, value_set=names))
        if rows.num_rows:
            out[ours] = rows
    return out


def _plain(pa: Any, column: Any) -> Any:
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
    pa = _pyarrow(source)
    arr = _plain(pa, column)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = _parse_text(source, field, arr)
    what = "a sequence per row: a list of token ids, of numbers, or of vectors"
    if not _is_list(pa, arr.type):
        raise _fail(source, field, what, f"values of type {arr.type}")
    if arr.null_count:
        row = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
        raise _fail(source, field, what, f"a missing value at row {row}")
    lengths = pa.compute.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)  # (N,)
    if len(lengths) and lengths.min() < 1:
        raise _fail(source, field, "at least one position per row", f"an empty sequence at row {np.argmin(lengths)}")
    values = _plain(pa, arr.flatten())
    d = None
    if _is_list(pa, values.type):  # one vector per position
        if values.null_count:
            raise _fail(source, field, "a vector at every position", "a missing one")
        sizes = pa.compute.list_value_length(values).to_numpy(zero_copy_only=False)
        if len(sizes) and (sizes.min() != sizes.max() or sizes.min() < 1):
            raise _fail(source, field, "vectors of one size d >= 1 at every position",
                        f"sizes {sizes.min()} to {sizes.max()}")
        d = int(sizes[0]) if len(sizes) else 1
        values = _plain(pa, values.flatten())
    t = values.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or values.null_count:
        found = "a missing value inside a sequence" if values.null_count else f"values of type {t}"
        raise _fail(source, field, "numbers inside each sequence (integers: token ids)", found)
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


def _parse_text(source: Path, field: str, arr: Any) -> Any:
    """CSV text cells (a JSON list, or numbers separated by spaces) as a pyarrow list array.

    Flat cells, the common case, are parsed by pyarrow's compute kernels (a
    number's JSON form checked first, so nothing JSON would refuse is taken);
    cells of nested lists (a vector per position) are parsed cell by cell.
    """
    pa = _pyarrow(source)
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
            raise _fail(source, field, "at least one position per row", f"an empty sequence at row {empty[0]}")
        parts = pc.utf8_split_whitespace(inner)
        integers = pc.all(pc.match_substring_regex(parts.flatten(), r"^-?[0-9]+$")).as_py() is not False
        try:
            return pc.cast(parts, pa.list_(pa.int64() if integers else pa.float64()))
        except pa.ArrowException as err:  # an integer beyond int64
            raise _fail(source, field, "lists of numbers (or of vectors of numbers)", one_line(err)) from None
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
        raise _fail(source, field, "lists of numbers (or of vectors of numbers)", one_line(err)) from None


#: A value that is not a finite number, as a cell may spell it (``nan``, ``-inf``, ``Infinity``; any case).
_NOT_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


def _bad_cell(source: Path, field: str, cell: str, row: int) -> ReservoirError:
    """The refusal of a text cell that is no list of numbers: naming a value that is not finite where it holds one
    (the cause, not the cell's form), else the form expected."""
    words = re.split(r"[\s,\[\]]+", cell)
    odd = next((w for w in words if _NOT_FINITE.fullmatch(w)), None)
    if odd is not None:
        return _fail(source, field, "finite numbers in every cell", f"{odd!r} at row {row}")
    return _fail(source, field, "a JSON list or numbers separated by spaces in every cell",
                 f"{cell[:40]!r} at row {row}")


def label_array(source: Path, field: str, column: Any) -> np.ndarray:
    """A column of integer labels as int64 ``(N,)``."""
    pa = _pyarrow(source)
    arr = _plain(pa, column)
    if not (pa.types.is_integer(arr.type) or pa.types.is_boolean(arr.type)):
        raise _fail(source, field, "integer labels (class ids >= 0)", f"values of type {arr.type}")
    if arr.null_count:
        row = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
        raise _fail(source, field, "a label in every row", f"a missing value at row {row}")
    values = arr.to_numpy(zero_copy_only=False)
    return values if values.dtype.kind in "iu" else values.astype(np.int64)  # a uint64 checked as it is, not wrapped
