"""TAPE remote homology: predict a protein's fold (1195 classes) from its amino-acid sequence.

Files
    TAPE's ``remote_homology_{split}.json`` (a JSON list of records) or
    ``remote_homology_{split}.lmdb`` (an LMDB environment: ``b"num_examples"``
    holds the pickled count, ``b"0"``, ``b"1"``, ... the pickled records), in
    ``data_dir`` or ``data_dir/remote_homology/``; JSON wins when both exist.
    A record's ``primary`` (the sequence) and ``fold_label`` (0..1194) are
    read; ``protein_length``, ``superfamily_label``, ``family_label``, ``id``
    and the rest are ignored.
Splits
    TAPE's ``train``, ``valid``, ``test_fold_holdout``,
    ``test_superfamily_holdout``, ``test_family_holdout``. ``valid`` becomes
    the split ``val`` (where a readout picks its regularization); the holdout
    named by ``test_split`` (default the fold holdout, TAPE's headline number)
    becomes ``test`` (what ``fit-linear`` reports); the other two holdouts keep
    their TAPE names. Order: train, val, test, then the other holdouts.
Tokens
    One amino acid per token, ids in the fixed order of :data:`VOCAB`: the 20
    standard amino acids ``ACDEFGHIKLMNPQRSTVWY`` (ids 0..19), then ``B O U X
    Z`` (20..24); ``d_in=25``, one-hot through the extractor. No special
    tokens (TAPE's 30-id vocabulary adds ``<pad> <mask> <cls> <sep> <unk>``).
    Sequences of length ``>= max_length`` (1024, as the paper) are dropped;
    the count per split is printed to stderr and kept in ``params["dropped"]``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.io import check_memory, check_regular, read_json
from reservoir.tasks.arrays import encode
from reservoir.tasks.base import Split, TaskData, TaskSpec, register
from reservoir.tasks.files import load_pickle
from reservoir.tasks.params import choice_param, int_param

__all__ = ["AMINO_ACIDS", "N_FOLDS", "TAPE_SPLITS", "VOCAB", "build_remote_homology", "encode_records",
           "find_split_file", "read_json_records", "read_lmdb_records", "read_split"]  # fmt: skip

NAME = "remote-homology"
AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWYBOUXZ"  # 20 standard, then B O U X Z
VOCAB = list(AMINO_ACIDS)
N_FOLDS = 1195
TAPE_SPLITS = ("train", "valid", "test_fold_holdout", "test_superfamily_holdout", "test_family_holdout")
HOLDOUTS = TAPE_SPLITS[2:]
TAPE_URL = "http://s3.amazonaws.com/songlabdata/proteindata/data_pytorch/remote_homology.tar.gz"
_TO_ID = str.maketrans({c: chr(i) for i, c in enumerate(AMINO_ACIDS)})
_LETTERS = frozenset(AMINO_ACIDS)


def find_split_file(data_dir: str, split: str, fmt: str = "auto") -> str | None:
    """Path of ``remote_homology_{split}.{json,lmdb}`` in ``data_dir`` or ``data_dir/remote_homology``.

    ``fmt="auto"`` tries JSON first, then LMDB (a folder or a single file).
    Returns None when there is none.
    """
    for ext in ("json", "lmdb") if fmt == "auto" else (fmt,):
        for folder in (data_dir, os.path.join(data_dir, "remote_homology")):
            path = os.path.join(folder, f"remote_homology_{split}.{ext}")
            if os.path.isfile(path) or (ext == "lmdb" and os.path.isdir(path)):
                return path
    return None


#: Bytes of Python objects per byte of JSON (numbers, strings and dicts of records).
JSON_OBJECTS_PER_BYTE = 10


def read_json_records(path: str, n: int | None = None) -> list:
    """The records of a TAPE JSON file (a list), the first ``n`` when given."""
    # TAPE's records carry per-residue fields (PSSMs): files of hundreds of MB, bound by memory, not a size cap
    size = check_regular(path, "a TAPE JSON list of records")
    check_memory(path, JSON_OBJECTS_PER_BYTE * size, "records read as Python objects (about ten times the file)")
    records = read_json(path, "a TAPE JSON list of records", max_bytes=size)
    if not isinstance(records, list):
        raise ReservoirError(f"TAPE file {path}: expected a JSON list of records; found a {type(records).__name__}")
    return records[:n]


def read_lmdb_records(path: str, n: int | None = None) -> list:
    """The records of a TAPE LMDB environment (``num_examples``, then keys ``b"0"``...), the first ``n`` when given.

    Values are unpickled with :func:`reservoir.tasks.files.load_pickle`
    (plain data and numpy arrays only); still, read only trusted files.
    """
    import lmdb

    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=os.path.isdir(path))
    except lmdb.Error as err:
        msg = " ".join(str(err).split())
        raise ReservoirError(f"TAPE file {path}: expected an LMDB environment; found an error ({msg})") from None

    def unpickle(key: bytes, raw: bytes) -> Any:
        try:
            return load_pickle(raw)
        except Exception as err:  # unpickling raises many types on bad bytes
            raise ReservoirError(f"TAPE file {path}, key {key!r}: expected a pickled value; found unreadable data "
                                 f"({type(err).__name__})") from None  # fmt: skip

    try:
        with env.begin(write=False) as txn:
            raw = txn.get(b"num_examples")
            if raw is None:
                raise ReservoirError(f"TAPE file {path}: expected the key b'num_examples'; found none")
            total = unpickle(b"num_examples", raw)
            if isinstance(total, bool) or not isinstance(total, Integral) or total < 0:
                raise ReservoirError(f"TAPE file {path}: expected num_examples a count >= 0; found {total!r}")
            records = []
            for i in range(int(total) if n is None else min(int(total), n)):
                raw = txn.get(str(i).encode())
                if raw is None:
                    raise ReservoirError(f"TAPE file {path}: expected a record under key b'{i}' "
                                         f"(num_examples={total}); found none")  # fmt: skip
                records.append(unpickle(str(i).encode(), raw))
    except lmdb.Error as err:
        msg = " ".join(str(err).split())
        raise ReservoirError(f"TAPE file {path}: expected a readable LMDB environment; found {msg}") from None
    finally:
        env.close()
    return records


def encode_records(records: Sequence[Any], path: str, max_length: int) -> tuple[Split, int]:
    """Token ids, lengths and fold labels of TAPE records; drops sequences of length ``>= max_length``.

    Parameters
    ----------
    records : sequence
        Dicts with ``primary`` (str of :data:`AMINO_ACIDS` letters, non-empty)
        and ``fold_label`` (int in 0..1194). Every record is checked, dropped or not.
    path : str
        The file they came from (named in errors).
    max_length : int
        Sequences with ``len(primary) >= max_length`` are dropped.

    Returns
    -------
    split : Split
        inputs uint8 ``(N, L)`` right-padded with 0 (``L`` the longest kept
        sequence), lengths int64 ``(N,)``, labels int64 ``(N,)``.
    dropped : int
        How many records were dropped for length.
    """
    seqs: list[bytes] = []
    labels: list[int] = []
    dropped = 0
    for i, rec in enumerate(records):
        where = f"TAPE file {path}, record {i}"
        if not isinstance(rec, dict):
            found = type(rec).__name__
            raise ReservoirError(f"{where}: expected a dict with 'primary' and 'fold_label'; found {found}")
        seq, label = rec.get("primary"), rec.get("fold_label")
        if not isinstance(seq, str) or not seq:
            found = "no 'primary'" if seq is None else f"{type(seq).__name__} {str(seq)[:20]!r}"
            raise ReservoirError(f"{where}: expected 'primary', a non-empty amino-acid string; found {found}")
        if isinstance(label, bool) or not isinstance(label, Integral) or not 0 <= label < N_FOLDS:
            found = "no 'fold_label'" if label is None else repr(label)
            raise ReservoirError(f"{where}: expected 'fold_label', an integer in 0..{N_FOLDS - 1}; found {found}")
        bad = set(seq) - _LETTERS
        if bad:
            pos = next(j for j, c in enumerate(seq) if c in bad)
            raise ReservoirError(f"{where}: expected amino-acid letters {AMINO_ACIDS}; found {seq[pos]!r} "
                                 f"at position {pos}")  # fmt: skip
        if len(seq) >= max_length:
            dropped += 1
            continue
        seqs.append(seq.translate(_TO_ID).encode("latin-1"))  # one byte per residue, ids 0..24
        labels.append(int(label))
    return encode(seqs, labels), dropped


def read_split(path: str, max_length: int = 1024, n: int | None = None) -> tuple[Split, int]:
    """Read one TAPE split file (``.json`` or ``.lmdb``) into a Split; see :func:`encode_records`.

    ``n`` keeps the first ``n`` records (before dropping long ones).
    """
    records = read_json_records(path, n) if path.endswith(".json") else read_lmdb_records(path, n)
    return encode_records(records, path, max_length)


def _bad(name: str, expected: str, value: Any) -> ReservoirError:
    return ReservoirError(f"task {NAME!r}: {name} must be {expected}; found {value!r}")


def _split_names(splits: Any) -> list[str]:
    """TAPE split names from a list, or from one string of names separated by commas (``"valid"`` is ``["valid"]``)."""
    names = [s.strip() for s in splits.split(",") if s.strip()] if isinstance(splits, str) else splits
    expected = f"a list of split names among {', '.join(TAPE_SPLITS)}"
    if not isinstance(names, (list, tuple)) or not names:
        raise _bad("splits", expected, splits)
    unknown = [s for s in names if s not in TAPE_SPLITS]
    if unknown:
        raise _bad("splits", expected, unknown[0])
    return list(names)


def build_remote_homology(
    data_dir: str | os.PathLike | None = None,
    splits: Sequence[str] | str = TAPE_SPLITS,
    test_split: str = "test_fold_holdout",
    format: str = "auto",
    max_length: int = 1024,
    n_per_split: int | None = None,
) -> TaskData:
    """Build the ``remote-homology`` task (see the module docstring).

    Parameters
    ----------
    data_dir : str or path-like
        Folder holding TAPE's files (or their ``remote_homology/`` folder).
    splits : sequence of str or str
        TAPE splits to read (a list, or names separated by commas); must
        include ``train`` and ``test_split``. Default: all five.
    test_split : str
        The holdout that becomes the split ``test``: ``test_fold_holdout``,
        ``test_superfamily_holdout`` or ``test_family_holdout``.
    format : {"auto", "json", "lmdb"}
        Which files to read; ``auto`` prefers JSON. Both give the same arrays,
        so ``format`` (like ``data_dir``) is left out of ``params``.
    max_length : int
        Drop sequences with ``length >= max_length`` (paper: 1024).
    n_per_split : int or None
        Read only the first n records of every split (quick runs); None: all.

    Returns
    -------
    TaskData
        ``kind="tokens"``, ``d_in=25``, ``n_classes=1195``, ``vocab`` the 25
        letters; inputs uint8 ``(N, L)``, lengths int64, labels int64 ``(N,)``.
        ``params["dropped"]`` maps each split name to its count of dropped sequences.
    """
    wanted, format, max_length, n_per_split = check_remote_homology(
        {"splits": splits, "test_split": test_split, "format": format, "max_length": max_length,
         "n_per_split": n_per_split})
    if data_dir is None:
        raise ReservoirError(f"task {NAME!r}: expected data_dir, the folder holding TAPE's remote_homology_"
                             f"<split>.{_ext(format)} files (from {TAPE_URL}); found data_dir=None")  # fmt: skip
    task_splits, dropped = _read_splits(os.fspath(data_dir), wanted, test_split, format, max_length, n_per_split)
    counts = ", ".join(f"{k} {v}" for k, v in dropped.items())
    print(f"{NAME}: dropped sequences of length >= {max_length}: {counts}", file=sys.stderr)
    tape_order = [s for s in TAPE_SPLITS if s in wanted]  # fixed order, duplicates removed
    params = {"splits": tape_order, "test_split": test_split, "max_length": max_length,
              "n_per_split": n_per_split, "dropped": dropped}  # fmt: skip
    return TaskData(name=NAME, params=params, kind="tokens", d_in=len(VOCAB), n_classes=N_FOLDS, splits=task_splits,
                    n_out_tokens=1, vocab=list(VOCAB))  # fmt: skip


def check_remote_homology(p: Mapping[str, Any]) -> tuple[list[str], str, int, int | None]:
    """The ``remote-homology`` parameters checked without reading a file (one line naming the first bad one): the
    splits wanted, the format, the length bound and the per-split count."""
    wanted = _split_names(p["splits"])
    test_split = p["test_split"]
    if test_split not in HOLDOUTS:
        raise _bad("test_split", f"one of {', '.join(HOLDOUTS)}", test_split)
    if "train" not in wanted or test_split not in wanted:
        raise _bad("splits", f"a list including 'train' and test_split={test_split!r}", wanted)
    return (wanted, choice_param(NAME, "format", p["format"], ("auto", "json", "lmdb")),
            int_param(NAME, "max_length", p["max_length"], 2),
            int_param(NAME, "n_per_split", p["n_per_split"], 1, none_ok=True))


def _ext(format: str) -> str:
    return "{json,lmdb}" if format == "auto" else format


def _read_splits(folder: str, wanted: list[str], test_split: str, format: str, max_length: int,
                 n_per_split: int | None) -> tuple[dict[str, Split], dict[str, int]]:
    """The splits ``wanted``, renamed (``valid`` -> ``val``, ``test_split`` -> ``test``) and in task order,
    with the count of sequences each dropped for length."""
    rename = {"valid": "val", test_split: "test"}
    order = ["train", "valid", test_split] + [s for s in HOLDOUTS if s != test_split]
    task_splits: dict[str, Split] = {}
    dropped: dict[str, int] = {}
    for tape in (s for s in order if s in wanted):
        path = find_split_file(folder, tape, format)
        if path is None:
            sub = os.path.join(folder, "remote_homology")
            raise ReservoirError(f"task {NAME!r}: expected remote_homology_{tape}.{_ext(format)} in {folder} or "
                                 f"{sub}; found none (TAPE data: {TAPE_URL})")  # fmt: skip
        split, n_dropped = read_split(path, max_length, n_per_split)
        if not len(split):
            raise ReservoirError(f"task {NAME!r}: expected sequences shorter than max_length={max_length} in "
                                 f"{path}; found none of {n_dropped + len(split)}")  # fmt: skip
        key = rename.get(tape, tape)
        task_splits[key] = split
        dropped[key] = n_dropped
    return task_splits, dropped


register(
    TaskSpec(
        name=NAME,
        build=build_remote_homology,
        check=check_remote_homology,
        summary="protein sequence (25 amino-acid letters, < 1024) -> one of 1195 folds (TAPE remote homology)",
        source="TAPE remote_homology_{split}.{json,lmdb} files (data_dir)",
        tokens="protein length, < max_length (1024)",
        d_in="25 one-hot",
        classes="1195",
        splits="train, val, test (= test_split), other holdouts",
    )
)
