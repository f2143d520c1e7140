"""Columnar data files for the ``data`` task: a ``datasets`` ``save_to_disk`` folder, a Parquet or a CSV file.

All three are read through pyarrow, which the optional extra ``pip install
'reservoir[datasets]'`` brings (with Hugging Face ``datasets``, needed for the
folders); nothing here is imported until such a file is read.

Columns
    One sequence and one label per row: :mod:`reservoir.tasks.cells` reads
    them into arrays.
Splits
    A ``DatasetDict`` folder: its splits ``train``, ``test`` and ``val`` (or
    ``validation``); any other split is skipped, and said so. A single table
    (a ``Dataset`` folder, a Parquet or a CSV file): the column ``split``
    says each row's split, ``train``, ``test``, ``val`` or ``validation``.

Every problem is one :class:`ReservoirError` line, ``<file>: <field>:
expected ...; found ...``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import check_memory, check_regular, one_line, read_json
from reservoir.tasks.cells import INSTALL, column_error, contiguous, parse_text, require_pyarrow

__all__ = ["SPLIT_COLUMN", "is_saved_dataset", "read_tables"]

log = logging.getLogger("reservoir")

SPLIT_COLUMN = "split"
#: Split names a file may use, and the task's name for each.
SPLIT_NAMES = {"train": "train", "val": "val", "validation": "val", "test": "test"}


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
    pa = require_pyarrow(source)
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
        table = _validated(source, "", loaded.select_columns(list(single)).with_format("arrow")[:])
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
            table = pacsv.read_csv(source, parse_options=pacsv.ParseOptions(newlines_in_values=True),  # quoted cells
                                   convert_options=pacsv.ConvertOptions(column_types={inputs: pa.string()}))
        except (OSError, pa.ArrowException) as err:
            if "invalid UTF8" in str(err):
                found = _not_utf8(source)
                raise ReservoirError(f"{source}: expected a CSV file of UTF-8 text; found {found}") from None
            raise ReservoirError(f"{source}: expected a CSV file with a header row; found {one_line(err)}") from None
        _has_columns(source, "", table.column_names, single)
        for name in single:
            if table.column_names.count(name) > 1:
                raise column_error(source, f"column {name!r}", "it once in the header row",
                                   f"it {table.column_names.count(name)} times")
            if pa.types.is_binary(table[name].type):  # text pyarrow could not read as UTF-8 is bytes, not refused
                raise ReservoirError(f"{source}: expected a CSV file of UTF-8 text; found {_not_utf8(source)}")
        # parsed whole, before the rows are split: tokens or numbers is one decision for the file (a writer that
        # prints 1.0 as 1 leaves one split all integers), and a bad cell's row is its row in the file
        parsed = parse_text(source, f"column {inputs!r}", contiguous(pa, table[inputs]))
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
    if "::" in str(source):  # fsspec reads "a::b" as a chain of filesystems and opens folder "a"
        raise ReservoirError(f"{source}: expected a folder path without '::' (datasets would read another folder, "
                             "the part before it); rename or move the folder")
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
            raise column_error(source, str(path.relative_to(source)), "files inside the folder",
                               f"a link to {path.resolve()}")
    for path in paths:
        where = str(path.relative_to(source))
        if path.name not in ("state.json", "dataset_dict.json") or not path.is_file():
            continue
        meta = read_json(path, "a datasets metadata file (JSON)")
        key, field = ("_data_files", "filename") if path.name == "state.json" else ("splits", None)
        listed = meta.get(key, []) if isinstance(meta, dict) else None
        if not isinstance(listed, list):
            raise column_error(source, f"{where}: {key}", "a list", type(listed).__name__)
        if key == "_data_files" and not listed:  # datasets writes no file for a split of no rows
            split = "the dataset" if path.parent == source else f"split {str(path.parent.relative_to(source))!r}"
            raise column_error(source, split, "at least one row", "none (its state.json lists no data files)")
        names = []
        for item in listed:
            name = item.get(field) if field and isinstance(item, dict) else item
            if not isinstance(name, str) or not name or "::" in name or not inside(path.parent / name):
                raise column_error(source, f"{where}: {key}", "names of files inside the folder", repr(name)[:200])
            if name in names:  # a shard read twice: its rows twice, a split of one split
                raise column_error(source, f"{where}: {key}", "each name once", f"{name!r} twice")
            names.append(name)


def _validated(source: Path, where: str, table: Any) -> Any:
    """A table read from a ``save_to_disk`` folder's Arrow files (mapped, their buffers checked lightly by the
    reader) checked whole: offsets or lengths that point outside its buffers would have the compute kernels read
    outside them (a crash, not an error)."""
    pa = require_pyarrow(source)
    try:
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as err:
        raise ReservoirError(f"{source}: {where}expected Arrow data as datasets writes it; found {one_line(err)}") \
            from None
    return table


def _has_columns(source: Path, where: str, names: list[str], wanted: dict[str, str]) -> None:
    """Refuse a missing column: ``wanted`` maps each name to what the message says about it."""
    for name, hint in wanted.items():
        if name not in names:
            raise column_error(source, f"{where}column {name!r}", f"a column of that name ({hint})",
                               f"columns {', '.join(names) or '(none)'}")


def _named_splits(source: Path, splits: dict[str, Any], wanted: dict[str, str]) -> dict[str, Any]:
    """A DatasetDict's splits under the task's names (``validation`` -> ``val``) as tables; others skipped."""
    out: dict[str, Any] = {}
    for name, ds in splits.items():
        ours = SPLIT_NAMES.get(name)
        if ours is None:
            continue
        if ours in out:
            raise column_error(source, "splits", "one validation split", "both 'val' and 'validation'")
        _has_columns(source, f"split {name!r}, ", ds.column_names, wanted)
        out[ours] = _validated(source, f"split {name!r}: ", ds.select_columns(list(wanted)).with_format("arrow")[:])
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
    pa = require_pyarrow(source)
    pc = pa.compute
    field = f"column {SPLIT_COLUMN!r}"
    try:
        col = pc.cast(table[SPLIT_COLUMN], pa.string())
    except pa.ArrowException:
        raise column_error(source, field, "split names (text)", str(table.schema.field(SPLIT_COLUMN).type)) from None
    if col.null_count:
        row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise column_error(source, field, "a split name in every row", f"a missing value at row {row}")
    present = pc.unique(col).to_pylist()
    unknown = [v for v in present if v not in SPLIT_NAMES]
    if unknown:
        raise column_error(source, field, f"split names among {', '.join(SPLIT_NAMES)}",
                           ", ".join(repr(v) for v in unknown[:5]))
    if "val" in present and "validation" in present:  # two names of one split: rows of one kept apart, not merged
        raise column_error(source, field, "one name for the validation split", "both 'val' and 'validation'")
    table = table.drop_columns([SPLIT_COLUMN])
    out = {}
    for ours in ("train", "val", "test"):
        names = pa.array([k for k, v in SPLIT_NAMES.items() if v == ours])
        rows = table.filter(pc.is_in(col, value_set=names))
        if rows.num_rows:
            out[ours] = rows
    return out
