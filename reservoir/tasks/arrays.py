"""Splits from arrays: token sequences packed into padded splits, and a whole task from a user's arrays.

:func:`encode` packs variable-length token id sequences (ListOps, protein
sequences) into a right-padded :class:`~reservoir.tasks.base.Split`.
:func:`from_arrays` (called as :meth:`TaskData.from_arrays
<reservoir.tasks.base.TaskData.from_arrays>`) turns arrays a user already
holds into a task the extractor and the trainer take, checking every fact a
built-in task guarantees: shapes, dtypes, lengths in ``n_out_tokens..L``,
labels ``>= 0``, token ids inside the vocabulary, ``train`` and ``test``
present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.io import one_line
from reservoir.tasks.base import Split, TaskData
from reservoir.tasks.params import int_param

__all__ = ["checked_task", "encode", "from_arrays", "gather_splits", "pack", "pad_rows", "train_classes"]

#: Integer dtypes the backbone reads as token ids without a conversion (``ReservoirBackbone.project``).
TOKEN_DTYPES = (np.uint8, np.int16, np.int32, np.int64)
#: Largest vocabulary a token task may have: ids reach the backbone one-hot, through a (vocabulary x n_dim) projection.
MAX_VOCAB = 1 << 20
#: Most classes per head: the head is a (n_dim x classes) layer trained on every row.
MAX_CLASSES = 100_000
KINDS = ("tokens", "continuous")


def encode(seqs: Sequence[bytes | Sequence[int]], labels: Sequence[int]) -> Split:
    """Pack token id sequences into a right-padded :class:`Split`.

    ``seqs`` holds non-empty id sequences (ids < 256), ``labels`` one int each.
    Returns inputs uint8 ``(N, L)``, ``L`` the longest sequence, padded with 0;
    lengths int64 ``(N,)``; labels int64 ``(N,)``.

    Examples
    --------
    >>> encode([[3, 1], [2]], [0, 1]).inputs.tolist()
    [[3, 1], [2, 0]]
    """
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)  # (N,)
    return pack(b"".join(bytes(s) for s in seqs), lengths, labels)


def pack(flat: bytes, lengths: np.ndarray, labels: Sequence[int]) -> Split:
    """Concatenated token ids (one byte each) and their lengths -> a right-padded uint8 :class:`Split`."""
    inputs = pad_rows(np.frombuffer(flat, dtype=np.uint8), lengths)  # (N, L)
    return Split(inputs=inputs, lengths=lengths, labels=np.asarray(labels, dtype=np.int64))


def pad_rows(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated rows ``(sum(lengths), ...)`` -> right-padded ``(N, max(lengths), ...)``, padded with 0.

    Examples
    --------
    >>> pad_rows(np.array([3, 1, 2]), np.array([2, 1])).tolist()
    [[3, 1], [2, 0]]
    """
    width = int(lengths.max()) if len(lengths) else 0
    out = np.zeros((len(lengths), width, *flat.shape[1:]), dtype=flat.dtype)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat  # row by row, in order
    return out


def from_arrays(name: str, splits: Mapping[str, Any], *, kind: str | None = None, d_in: int | None = None,
                n_classes: int | None = None, n_out_tokens: int = 1, vocab: Sequence[str] | None = None,
                params: Mapping[str, Any] | None = None) -> TaskData:
    """A checked :class:`TaskData` from arrays; see :meth:`TaskData.from_arrays` for the parameters."""
    import reservoir.tasks  # noqa: F401  (registers the built-in tasks, whose names are taken)
    from reservoir.tasks.base import TASKS

    if not isinstance(name, str) or not name.strip():
        raise ReservoirError(f"expected a task name, a non-empty string; found {name!r}")
    if name in TASKS:
        raise ReservoirError(f"expected a name that is not a registered task's; found {name!r}, which is one")
    return checked_task(name, splits, kind=kind, d_in=d_in, n_classes=n_classes, n_out_tokens=n_out_tokens,
                        vocab=vocab, params=params)


def train_classes(labels: Any, where: str) -> np.ndarray:
    """The classes of a train split's labels, refusing (one line naming ``where``) fewer than two: nothing to learn,
    and a fit or a run would report the share of that one class (``fit-linear``, ``fit-raw``, ``train``).

    Examples
    --------
    >>> train_classes([0, 1, 1], "task 'x'")
    array([0, 1])
    """
    classes = np.unique(np.asarray(labels))
    if len(classes) < 2:
        found = f"class {int(classes[0])}" if len(classes) else "no label"
        raise ReservoirError(f"{where}: expected at least two classes in the train split; found only {found}")
    return classes


def gather_splits(splits: Mapping[str, Any] | None, train: Any = None, val: Any = None, test: Any = None,
                  lengths: Mapping[str, Any] | None = None) -> Any:
    """The splits of :meth:`TaskData.from_arrays`'s keyword form (``train=``, ``val=``, ``test=``, ``lengths=``).

    ``splits`` given, it is returned as it is (the keywords must then be
    absent). Otherwise ``{"train": train, "val": val, "test": test}`` without
    the ``None`` ones, each ``(inputs, labels)`` pair that ``lengths`` (a
    mapping from split name to lengths ``(N,)``) names becoming ``(inputs,
    lengths, labels)``.

    Examples
    --------
    >>> x, y = np.zeros((2, 3), dtype=np.int64), np.array([0, 1])
    >>> parts = gather_splits(None, train=(x, y), test=(x, y), lengths={"test": [1, 3]})
    >>> list(parts), len(parts["train"]), parts["test"][1]
    (['train', 'test'], 2, [1, 3])
    """
    named = {k: v for k, v in (("train", train), ("val", val), ("test", test)) if v is not None}
    if splits is not None:
        extra = [*named, *(["lengths"] if lengths is not None else [])]
        if extra:
            raise ReservoirError(f"expected splits as a mapping or as train=/val=/test= keywords, not both; found a "
                                 f"mapping and {', '.join(f'{k}=' for k in extra)}")
        return splits
    if not named:
        raise ReservoirError("expected splits, a mapping {'train': ..., 'test': ...}, or train= and test= arrays; "
                             "found neither")
    if lengths is None:
        return named
    if not isinstance(lengths, Mapping) or not set(lengths) <= set(named):
        found = sorted(map(str, lengths)) if isinstance(lengths, Mapping) else type(lengths).__name__
        raise ReservoirError(f"expected lengths=, a mapping from split names among {', '.join(map(repr, named))} to "
                             f"lengths (N,); found {found}")
    for s, ln in lengths.items():
        value = named[s]
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            found = f"{len(value)} items" if isinstance(value, (tuple, list)) else type(value).__name__
            raise ReservoirError(f"split {s!r}: expected (inputs, labels) when lengths= gives its lengths (not both "
                                 f"places); found {found}")
        named[s] = (value[0], ln, value[1])
    return named


#: What a split may be called: a name a store holds as a group, a file name, a results key.
_SPLIT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Names of a validation split other than ``val``, which training and readouts would not read.
VALIDATION_ALIASES = ("validation", "valid", "dev")


def checked_task(name: str, splits: Mapping[str, Any], *, kind: str | None = None, d_in: int | None = None,
                 n_classes: int | None = None, n_out_tokens: int = 1, vocab: Sequence[str] | None = None,
                 params: Mapping[str, Any] | None = None) -> TaskData:
    """:func:`from_arrays` without the check that ``name`` is free: what a registered builder (``data``) calls."""
    where = f"task {name!r}"
    params = _json_params(name, params)
    if not isinstance(splits, Mapping) or not {"train", "test"} <= set(splits) or not all(map(_is_str, splits)):
        found = list(splits) if isinstance(splits, Mapping) else type(splits).__name__
        raise ReservoirError(f"{where}: expected splits, a mapping from split names (str) including 'train' and "
                             f"'test'; found {found}")
    for s in splits:  # a name a store can hold; a validation split under another name than 'val' would go unused
        if s.lower() in VALIDATION_ALIASES:
            raise ReservoirError(f"{where}: expected the validation split named 'val' (what training and readouts "
                                 f"select on); found {s!r}")
        if not _SPLIT_NAME.fullmatch(s):
            raise ReservoirError(f"{where}: expected split names of letters, digits, '_' and '-' ('train', 'val', "
                                 f"'test', 'test_ood', ...); found {s!r}")
    if kind is not None and kind not in KINDS:
        raise ReservoirError(f"{where}: expected kind one of {', '.join(map(repr, KINDS))} or None; found {kind!r}")
    n_out_tokens = int_param(name, "n_out_tokens", n_out_tokens, 1)
    checked = {s: _split(f"{where}, split {s!r}", value, kind, n_out_tokens) for s, value in splits.items()}
    kinds = {k for k, _ in checked.values()}
    if len(kinds) > 1:
        raise ReservoirError(f"{where}: expected every split's inputs of one kind; found {' and '.join(sorted(kinds))}")
    kind = kinds.pop()
    out = {s: split for s, (_, split) in checked.items()}
    d_in = _token_d_in(name, out, d_in, vocab) if kind == "tokens" else _vector_d_in(name, out, d_in, vocab)
    n_classes = _n_classes(name, out, n_classes)
    return TaskData(name=name, params=params, kind=kind, d_in=d_in, n_classes=n_classes, splits=out,
                    n_out_tokens=n_out_tokens, vocab=None if vocab is None else list(vocab))


def _is_str(key: Any) -> bool:
    return isinstance(key, str)


def _json_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` as JSON reads them back (stores keep them, the fingerprint hashes them): a tuple becomes a list, a
    key a str, so the params a store records are the task's own."""
    where = f"task {name!r}"
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ReservoirError(f"{where}: expected params a mapping or None; found {type(params).__name__}")
    try:
        json.dumps(dict(params), sort_keys=True, allow_nan=False)  # as the fingerprint writes them
        return json.loads(json.dumps(dict(params)))
    except (TypeError, ValueError) as err:
        raise ReservoirError(f"{where}: expected params that JSON can write; found {err}") from None


def _split(where: str, value: Any, kind: str | None, n_out_tokens: int) -> tuple[str, Split]:
    """One split's ``(kind, Split)``, its arrays checked and in the dtypes the backbone reads."""
    if isinstance(value, Split):
        value = (value.inputs, value.lengths, value.labels)
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        found = f"{len(value)} items" if isinstance(value, (tuple, list)) else type(value).__name__
        raise ReservoirError(f"{where}: expected (inputs, lengths, labels) or (inputs, labels); found {found}")
    inputs, lengths, labels = (value[0], None, value[1]) if len(value) == 2 else value
    inputs = _array(where, "inputs", inputs)
    found_kind = _kind(where, inputs, kind)
    if 0 in inputs.shape:
        raise ReservoirError(f"{where}: expected inputs with at least one row, one position and (vectors) one "
                             f"number; found shape {inputs.shape}")
    if found_kind == "tokens":
        largest = int(inputs.max())  # in the inputs' own dtype: a uint64 id must not wrap
        if largest >= MAX_VOCAB:
            raise ReservoirError(f"{where}: expected token ids below {MAX_VOCAB:,} (a one-hot vocabulary); found id "
                                 f"{largest:,}: number the tokens 0..V-1, or give vectors (N, L, d)")
        inputs = inputs if inputs.dtype in TOKEN_DTYPES else inputs.astype(np.int64)
    else:
        with np.errstate(over="ignore"):  # beyond float32: infinity, refused just below
            inputs = np.asarray(inputs, dtype=np.float32)
        if not np.isfinite(inputs).all():
            raise ReservoirError(f"{where}: expected finite inputs; found NaN or infinity (as float32)")
    n, L = inputs.shape[:2]
    lengths = _lengths(where, lengths, n, L, n_out_tokens)
    labels = _labels(where, labels, n, n_out_tokens)
    return found_kind, Split(inputs=inputs, lengths=lengths, labels=labels)


def _array(where: str, what: str, value: Any) -> np.ndarray:
    """``value`` as an array (no copy for an array); ragged nested lists are refused in one line."""
    try:
        return np.asarray(value)
    except ValueError as err:  # e.g. rows of different lengths
        raise ReservoirError(f"{where}: expected {what} as a rectangular array; found {one_line(err)}") from None


def _kind(where: str, inputs: np.ndarray, kind: str | None) -> str:
    """``"tokens"`` for integer ``(N, L)``, ``"continuous"`` for numeric ``(N, L, d)``; else a one-line error."""
    numeric = inputs.dtype.kind in "biuf"
    if inputs.ndim == 2 and inputs.dtype.kind in "biu":
        found = "tokens"
    elif inputs.ndim == 3 and numeric:
        found = "continuous"
    else:
        hint = "; add a last axis of size 1 for one number per position" if inputs.ndim == 2 and numeric else ""
        raise ReservoirError(f"{where}: expected inputs of integer token ids (N, L) or numeric vectors (N, L, d_in); "
                             f"found {inputs.dtype} of shape {inputs.shape}{hint}")
    if kind is not None and kind != found:
        raise ReservoirError(f"{where}: expected inputs of kind {kind!r} "
                             f"({'integer (N, L)' if kind == 'tokens' else 'numeric (N, L, d_in)'}); "
                             f"found {inputs.dtype} of shape {inputs.shape}")
    return found


def _lengths(where: str, lengths: Any, n: int, L: int, n_out_tokens: int) -> np.ndarray:
    """Lengths int64 ``(n,)`` in ``n_out_tokens..L``; ``None`` is every row at full length ``L``."""
    if lengths is None:
        lengths = np.full(n, L, dtype=np.int64)
    lengths = _array(where, "lengths", lengths)
    if lengths.shape != (n,) or lengths.dtype.kind not in "iu":
        raise ReservoirError(f"{where}: expected lengths, integers of shape ({n},); found {lengths.dtype} of shape "
                             f"{lengths.shape}")
    lengths = lengths.astype(np.int64, copy=False)
    bad = (lengths < n_out_tokens) | (lengths > L)
    if bad.any():
        row = int(np.argmax(bad))
        why = f"n_out_tokens={n_out_tokens}, " if n_out_tokens > 1 else ""
        raise ReservoirError(f"{where}: expected lengths in {n_out_tokens}..{L} ({why}inputs of {L} positions); "
                             f"found {lengths[row]} at row {row}")
    return lengths


def _labels(where: str, labels: Any, n: int, n_out_tokens: int) -> np.ndarray:
    """Labels int64 ``(n, ...)``, ``>= 0``; with several output tokens ``(n, n_out_tokens, ...)``."""
    labels = _array(where, "labels", labels)
    if labels.ndim < 1 or len(labels) != n or labels.dtype.kind not in "biu" or 0 in labels.shape[1:]:
        raise ReservoirError(f"{where}: expected integer labels with {n} rows (one per input), each at least one "
                             f"label; found {labels.dtype} of shape {labels.shape}")
    if n_out_tokens > 1 and (labels.ndim < 2 or labels.shape[1] != n_out_tokens):
        raise ReservoirError(f"{where}: expected labels of shape ({n}, {n_out_tokens}, ...), one per output token; "
                             f"found {labels.shape}")
    if labels.ndim > (2 if n_out_tokens == 1 else 3):  # what a readout and a head read: rows, [tokens,] heads
        wanted = (f"({n},) or ({n}, heads)" if n_out_tokens == 1
                  else f"({n}, {n_out_tokens}) or ({n}, {n_out_tokens}, heads)")
        raise ReservoirError(f"{where}: expected labels of shape {wanted}; found {labels.shape}")
    if labels.size and int(labels.max()) >= MAX_CLASSES:  # in the labels' own dtype: a uint64 must not wrap
        raise ReservoirError(f"{where}: expected labels below {MAX_CLASSES:,} (one output per class); found "
                             f"{int(labels.max()):,}: number the classes 0..K-1")
    labels = labels.astype(np.int64, copy=False)
    if labels.size and labels.min() < 0:
        raise ReservoirError(f"{where}: expected labels >= 0; found {labels.min()}")
    return labels


def _token_d_in(name: str, splits: dict[str, Split], d_in: int | None, vocab: Sequence[str] | None) -> int:
    """The vocabulary size: ``d_in``, else ``len(vocab)``, else the largest id + 1; every id must be below it."""
    where = f"task {name!r}"
    lowest = min(int(s.inputs.min()) for s in splits.values())
    if lowest < 0:
        raise ReservoirError(f"{where}: expected token ids >= 0 at every position (padding too: the backbone reads "
                             f"every position); found {lowest}")
    largest = max(int(s.inputs.max()) for s in splits.values())
    if vocab is not None:
        if isinstance(vocab, str) or not all(isinstance(t, str) for t in vocab):
            raise ReservoirError(f"{where}: expected vocab a sequence of token strings; found {vocab!r:.60}")
        if d_in is not None and d_in != len(vocab):
            raise ReservoirError(f"{where}: expected d_in equal to len(vocab)={len(vocab)}; found d_in={d_in!r}")
        d_in = len(vocab)
    d_in = largest + 1 if d_in is None else int_param(name, "d_in", d_in, 1)
    if d_in > MAX_VOCAB:
        raise ReservoirError(f"{where}: expected a vocabulary of at most {MAX_VOCAB:,} tokens; found d_in={d_in:,}")
    if largest >= d_in:
        raise ReservoirError(f"{where}: expected token ids below the vocabulary size d_in={d_in}; found id {largest}")
    return d_in


def _vector_d_in(name: str, splits: dict[str, Split], d_in: int | None, vocab: Sequence[str] | None) -> int:
    """The vector size, the same in every split (and ``d_in`` when given)."""
    where = f"task {name!r}"
    if vocab is not None:
        raise ReservoirError(f"{where}: expected vocab=None for continuous inputs; found a vocab of {len(vocab)} "
                             "tokens")
    sizes = {s: split.inputs.shape[2] for s, split in splits.items()}
    if len(set(sizes.values())) > 1:
        raise ReservoirError(f"{where}: expected inputs of one vector size d_in in every split; found "
                             f"{', '.join(f'{s} {d}' for s, d in sizes.items())}")
    found = next(iter(sizes.values()))
    if d_in is not None and d_in != found:
        raise ReservoirError(f"{where}: expected d_in={d_in!r}, the inputs' last axis; found {found}")
    return found


def _n_classes(name: str, splits: dict[str, Split], n_classes: int | None) -> int:
    """Classes per head (at least 2): ``n_classes``, else the largest label + 1; every label must be below it."""
    where = f"task {name!r}"
    shapes = {s: split.labels.shape[1:] for s, split in splits.items()}
    if len(set(shapes.values())) > 1:
        raise ReservoirError(f"{where}: expected labels of one shape per row in every split; found "
                             f"{', '.join(f'{s} {shape}' for s, shape in shapes.items())}")
    largest = max(int(s.labels.max()) for s in splits.values())
    if n_classes is None:
        if largest < 1:
            raise ReservoirError(f"{where}: expected labels of at least 2 classes (or n_classes given); found every "
                                 f"label {largest}")
        return largest + 1
    n_classes = int_param(name, "n_classes", n_classes, 2)
    if n_classes > MAX_CLASSES:
        raise ReservoirError(f"{where}: expected at most {MAX_CLASSES:,} classes; found n_classes={n_classes:,}")
    if largest >= n_classes:
        raise ReservoirError(f"{where}: expected labels below n_classes={n_classes}; found {largest}")
    return n_classes
