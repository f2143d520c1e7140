"""The LRA release's ListOps files: ``basic_{train,val,test}.tsv``, header ``Source\\tTarget``.

Source is an expression in the LRA file format (``( ( ( [MAX 2 ) 9 ) ] )``),
Target its value 0..9. :func:`read_lra_split` reads one file into a
:class:`~reservoir.tasks.base.Split`, refusing a malformed one in one line
that names the file and the line.
"""

from __future__ import annotations

import os
import re

from reservoir.errors import ReservoirError
from reservoir.tasks.arrays import encode
from reservoir.tasks.base import Split
from reservoir.tasks.listops.language import evaluate_ids, tokenize_fpt, tokenize_lra

__all__ = ["HEADER", "SPLIT_FILES", "read_lra_split"]

SPLIT_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
HEADER = "Source\tTarget"


def read_lra_split(path: str | os.PathLike, tokenization: str = "lra", max_tokens: int | None = None) -> Split:
    """Read one LRA ListOps file (``basic_{train,val,test}.tsv``).

    Parameters
    ----------
    path : str or path-like
        Tab-separated, header ``Source\\tTarget``, Source in the LRA format,
        Target an integer 0..9; blank lines are skipped.
    tokenization : {"lra", "fpt"}
        See :mod:`reservoir.tasks.listops.language`.
    max_tokens : int or None
        Cut every sequence to this many tokens; None keeps all.

    Returns
    -------
    Split
        As :func:`~reservoir.tasks.arrays.encode`. Malformed input (missing or
        empty file, wrong header or field count, bad target, unknown token, an
        expression that is not one tree, a Target that is not its value, no
        examples) raises ReservoirError, one line naming file, line, expected
        and found.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ReservoirError(f"ListOps file {path} not found; expected the LRA release file there")
    seqs: list[bytes] = []
    labels: list[int] = []
    lineno = 0
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if lineno == 1:
                    if line.lstrip("\ufeff") != HEADER:
                        raise ReservoirError(f"expected the header {HEADER!r}; found {line[:60]!r}")
                elif line.strip():
                    ids, label = _parse_row(line, tokenization)
                    seqs.append(bytes(ids[:max_tokens] if max_tokens is not None else ids))
                    labels.append(label)
    except ReservoirError as err:
        where = f"line {lineno}" if lineno else "start of file"
        raise ReservoirError(f"ListOps file {path}, {where}: {err}") from None
    except UnicodeDecodeError as err:
        raise ReservoirError(f"ListOps file {path}: expected UTF-8 text; found bad bytes ({err.reason})") from None
    if lineno == 0:
        raise ReservoirError(f"ListOps file {path}, line 1: expected the header {HEADER!r}; found an empty file")
    if not seqs:
        raise ReservoirError(f"ListOps file {path}: expected at least one example after the header; found none")
    return encode(seqs, labels)


def _parse_row(line: str, tokenization: str) -> tuple[list[int], int]:
    """Token ids and label of one ``Source\\tTarget`` row (errors without the file and line, added by the caller)."""
    fields = line.split("\t")
    if len(fields) != 2:
        raise ReservoirError(f"expected 2 tab-separated fields (Source, Target); found {len(fields)}")
    source, target = fields
    text = target.strip()
    if not re.fullmatch(r"-?[0-9]+", text):  # int() would take "+9", "0_9" and other scripts' digits
        raise ReservoirError(f"expected an integer Target in 0..9; found {target[:60]!r}")
    label = int(text)
    if not 0 <= label <= 9:
        raise ReservoirError(f"expected an integer Target in 0..9; found {label}")
    lra = tokenize_lra(source)
    value = evaluate_ids(lra)  # one well-formed tree, whose value is its Target
    if value != label:
        raise ReservoirError(f"expected the Target to be the expression's value, {value}; found {label}")
    return (lra if tokenization == "lra" else tokenize_fpt(source, None)), label
