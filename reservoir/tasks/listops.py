"""ListOps (Long Range Arena): nested MIN/MAX/MED/SM expressions over digits.

``[MAX 4 3 [MIN 2 3 ] 1 0 ]`` evaluates to 4; the task is to predict the value
(10 classes) of an expression read as a token sequence.

Generator
    ``lra_benchmarks/data/listops.py`` step for step (same draws, same order)
    but from a ``random.Random(seed)`` instead of the global RNG: from depth 1,
    a node below depth 10 draws ``r = random()``; ``r > 0.25`` gives a leaf
    ``choice(range(10))``, else ``randint(2, 10)`` children (inclusive), then
    the operator ``choice(OPERATORS)``; at depth 10 a leaf. Length: leaf 1,
    operator 2 + children (= the number of ``lra`` tokens). Trees are kept when
    ``min_length < length < max_length`` (LRA: 500, 2000). No deduplication
    (LRA's script keeps trees in a ``set``; at LRA's lengths duplicates are
    vanishingly rare, at small lengths they are not).

Tokenizations
    ``lra``: 15 tokens in the fixed order of :data:`LRA_VOCAB`; parentheses of
    the LRA file format are dropped, ``]`` or ``X`` is the closing token.
    ``fpt``: what the official FPT code (kzl/universal-computation) feeds the
    model. Its alphanumeric tokenizer drops every bracket, so the tree
    structure is lost and the task is ill-posed: ``[MAX 1 [MIN 2 3 ] 4 ]`` (= 4)
    and ``[MAX 1 [MIN 2 3 4 ] ]`` (= 2) both become ``MAX 1 MIN 2 3 4``.
    Vocabulary :data:`FPT_VOCAB` (14 tokens, our fixed order; the official code
    orders it by ``set`` iteration, so its ids change between runs) and
    sequences cut to 512 tokens, as there.

Files
    The LRA release ``basic_{train,val,test}.tsv`` (header ``Source\\tTarget``)
    are read by :func:`read_lra_split`.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
from numbers import Integral
from typing import Any, Sequence, Union

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.tasks.base import Split, TaskData, TaskSpec, register

__all__ = ["LRA_VOCAB", "FPT_VOCAB", "generate_tree", "sample_trees", "evaluate", "tree_tokens", "to_string",
           "tokenize_lra", "tokenize_fpt", "read_lra_split", "encode", "build_listops", "draw_ids", "generate_split"]  # fmt: skip

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
LRA_VOCAB = [*OPERATORS, CLOSE, *DIGITS]  # 15 tokens, ids 0..14
FPT_VOCAB = [op[1:] for op in OPERATORS] + list(DIGITS)  # 14 tokens, ids 0..13
MAX_DEPTH = 10
MAX_ARGS = 10
VALUE_P = 0.25
FPT_MAX_TOKENS = 512
SPLIT_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
HEADER = "Source\tTarget"
MAX_REJECTIONS = 1_000_000  # consecutive rejected draws before giving up

Tree = Union[int, tuple]  # a leaf value 0..9, or (operator, (child, ...))

_LRA_ID = {tok: i for i, tok in enumerate(LRA_VOCAB)} | {"X": LRA_VOCAB.index(CLOSE)}
_FPT_ID = {tok: i for i, tok in enumerate(FPT_VOCAB)}
_LRA_TO_FPT = [_FPT_ID[op[1:]] for op in OPERATORS] + [-1] + [_FPT_ID[d] for d in DIGITS]  # -1: dropped
_VALUES = range(10)
_LRA_WORD = re.compile(r"[^\s()]+")  # what tokenize_lra splits into
_FPT_WORD = re.compile(r"[^\s()\[\]]+")  # what tokenize_fpt splits into
_BRACKETS_TO_SPACE = str.maketrans({c: " " for c in "[]()"})


class _TooLong(Exception):
    """Raised inside :func:`generate_tree` once a tree cannot fit ``max_length``."""


def generate_tree(
    rng: random.Random, depth: int = 1, max_depth: int = MAX_DEPTH, max_args: int = MAX_ARGS,
    max_length: int | None = None,
) -> tuple[Tree | None, int]:
    """Draw one ListOps tree with the LRA process.

    Parameters
    ----------
    rng : random.Random
        With ``max_length=None`` the draws are LRA's, in LRA's order:
        ``random.Random(s)`` reproduces LRA's ``generate_tree`` after
        ``random.seed(s)``.
    depth : int
        Depth of this node (LRA starts the root at 1).
    max_depth, max_args : int
        Nodes at ``max_depth`` are leaves; operators take ``2..max_args`` args.
    max_length : int or None
        Abandon the tree once its length is certain to reach this (the rest of
        its draws are never made).

    Returns
    -------
    tree : int or tuple or None
        A leaf value, or ``(operator, children_tuple)``; None if abandoned.
    length : int
        Leaf 1, operator 2 + children; if abandoned, a bound ``>= max_length``.
    """
    count = [0]  # tokens committed so far (a leaf: 1, an operator: 2 when opened)
    limit = max_length if max_length is not None else float("inf")

    def grow(depth: int) -> tuple[Tree, int]:
        r = rng.random() if depth < max_depth else 1.0
        if r > VALUE_P:
            count[0] += 1
            if count[0] >= limit:
                raise _TooLong
            return rng.choice(_VALUES), 1
        count[0] += 2
        if count[0] >= limit:
            raise _TooLong
        length = 2
        children = []
        for _ in range(rng.randint(2, max_args)):
            child, child_length = grow(depth + 1)
            children.append(child)
            length += child_length
        return (rng.choice(OPERATORS), tuple(children)), length

    try:
        return grow(depth)
    except _TooLong:
        return None, count[0]


def sample_trees(rng: random.Random, n: int, min_length: int, max_length: int) -> list[Tree]:
    """Draw trees until ``n`` have ``min_length < length < max_length`` (exclusive; LRA: 500, 2000).

    Trees certain to reach ``max_length`` are abandoned early. That changes
    which random numbers later trees use, not their distribution: each kept
    tree is an LRA tree conditioned on the bounds. Returns the ``n`` trees in
    the order drawn, not deduplicated. Raises ReservoirError after
    :data:`MAX_REJECTIONS` rejections in a row.
    """
    trees: list[Tree] = []
    rejected = 0
    while len(trees) < n:
        tree, length = generate_tree(rng, max_length=max_length)
        if tree is not None and min_length < length < max_length:
            trees.append(tree)
            rejected = 0
        else:
            rejected += 1
            if rejected >= MAX_REJECTIONS:
                raise ReservoirError(
                    f"task 'listops': expected length bounds the LRA process can meet; found no tree with "
                    f"{min_length} < length < {max_length} in {MAX_REJECTIONS} draws"
                )
    return trees


#: Rows drawn from one seeded generator; blocks are independent, so they are drawn in parallel.
BLOCK_ROWS = 1000
_OP_IDS = {op: _LRA_ID[op] for op in OPERATORS}


def draw_ids(rng: random.Random, max_length: int) -> tuple[list[int] | None, int]:
    """One LRA tree drawn straight into ``lra`` token ids, with its value; ``None`` once it reaches ``max_length``.

    The same draws, in the same order, as :func:`generate_tree` with
    ``max_length`` (so the same trees), without building the tree: ids are
    appended in prefix order (an operator's slot is filled once its children
    are drawn, as LRA draws the operator last) and values are folded on the way
    back up. About twice as fast as building, tokenizing and evaluating a tree.
    """
    rand, choice, randint = rng.random, rng.choice, rng.randint
    ids: list[int] = []
    count = 0  # tokens committed, as in generate_tree: a leaf 1, an operator 2 (itself and its close) when opened
    close = _LRA_ID[CLOSE]

    def grow(depth: int) -> int:
        nonlocal count
        if depth >= MAX_DEPTH or rand() > VALUE_P:
            count += 1
            if count >= max_length:
                raise _TooLong
            v = choice(_VALUES)
            ids.append(v + 5)  # digits follow the 4 operators and ] in LRA_VOCAB
            return v
        count += 2
        if count >= max_length:
            raise _TooLong
        at = len(ids)
        ids.append(0)  # the operator's slot
        values = [grow(depth + 1) for _ in range(randint(2, MAX_ARGS))]
        op = choice(OPERATORS)
        ids[at] = _OP_IDS[op]
        ids.append(close)
        return _APPLY[op](values)

    try:
        value = grow(1)
    except _TooLong:
        return None, 0
    return ids, value


def _draw_block(args: tuple[str, int, int, int, str, int | None]) -> tuple[bytes, list[int], list[int]]:
    """``n`` kept trees of one block as ``(concatenated ids, lengths, labels)`` (picklable, for workers)."""
    seed_key, n, min_length, max_length, tokenization, max_tokens = args
    rng = random.Random(seed_key)
    chunks, lengths, labels, rejected = [], [], [], 0
    while len(labels) < n:
        ids, value = draw_ids(rng, max_length)
        if ids is None or len(ids) <= min_length:
            rejected += 1
            if rejected >= MAX_REJECTIONS:
                raise ReservoirError(
                    f"task 'listops': expected length bounds the LRA process can meet; found no tree with "
                    f"{min_length} < length < {max_length} in {MAX_REJECTIONS} draws"
                )
            continue
        rejected = 0
        if tokenization == "fpt":
            ids = [_LRA_TO_FPT[i] for i in ids if _LRA_TO_FPT[i] >= 0]
        if max_tokens is not None:
            ids = ids[:max_tokens]
        chunks.append(bytes(ids))
        lengths.append(len(ids))
        labels.append(value)
    return b"".join(chunks), lengths, labels


def generate_split(name: str, n: int, seed: int, min_length: int, max_length: int, tokenization: str = "lra",
                   max_tokens: int | None = None, workers: int | None = None) -> Split:
    """``n`` generated rows of split ``name``, drawn in blocks of :data:`BLOCK_ROWS` on ``workers`` processes.

    Block ``b`` of split ``name`` draws from ``random.Random("listops/<seed>/<name>/<b>")``,
    so the rows do not depend on the number of workers, nor one split on
    another's size. Blocks come back as packed token bytes, never as trees, so
    memory grows with the tokens kept, not with the trees drawn.
    """
    jobs = [(f"listops/{seed}/{name}/{b}", min(BLOCK_ROWS, n - lo), min_length, max_length, tokenization, max_tokens)
            for b, lo in enumerate(range(0, n, BLOCK_ROWS))]
    workers = min(len(jobs), workers or _cpu_count())
    # fork only: spawn and forkserver would re-run a user's script that has no __main__ guard
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            blocks = list(pool.map(_draw_block, jobs))
    else:
        blocks = [_draw_block(job) for job in jobs]
    lengths = np.array([x for _, ls, _ in blocks for x in ls], dtype=np.int64)  # (n,)
    return _pack(b"".join(ids for ids, _, _ in blocks), lengths, [v for _, _, vs in blocks for v in vs])


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _median_int(args: Sequence[int]) -> int:
    """``int(np.median(args))`` for non-negative ints, without numpy (faster)."""
    s = sorted(args)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2


_APPLY = {"[MIN": min, "[MAX": max, "[MED": _median_int, "[SM": lambda args: sum(args) % 10}


def evaluate(tree: Tree) -> int:
    """Value (0..9) of a tree: MIN, MAX, MED = ``int(np.median)`` (truncated), SM = sum mod 10."""
    if not isinstance(tree, tuple):
        return int(tree)
    op, children = tree
    return _APPLY[op]([evaluate(c) for c in children])


def tree_tokens(tree: Tree, out: list[str] | None = None) -> list[str]:
    """The ``lra`` tokens of a tree in prefix order, e.g. ``['[MAX', '4', '3', ']']``.

    ``len(tree_tokens(t))`` equals the length :func:`generate_tree` returns.
    """
    out = [] if out is None else out
    if isinstance(tree, tuple):
        op, children = tree
        out.append(op)
        for c in children:
            tree_tokens(c, out)
        out.append(CLOSE)
    else:
        out.append(str(tree))
    return out


def to_string(tree: Tree, parens: bool = False) -> str:
    """A tree as text: ``[MAX 4 3 ]``, or with ``parens`` the LRA file format ``( ( ( [MAX 4 ) 3 ) ] )``.

    The file format wraps every (partial expression, next item) pair in parentheses.
    """
    if not isinstance(tree, tuple):
        return str(tree)
    if not parens:
        return " ".join(tree_tokens(tree))
    op, children = tree
    s = f"( {op} {to_string(children[0], True)} )"
    for c in children[1:]:
        s = f"( {s} {to_string(c, True)} )"
    return f"( {s} {CLOSE} )"


def _unknown(source: str, tokenization: str) -> ReservoirError:
    """Error naming the first token of ``source`` outside the vocabulary (or saying it is empty)."""
    if tokenization == "lra":
        words, known, vocab = _LRA_WORD, _LRA_ID, " ".join(LRA_VOCAB) + " (or X for ])"
    else:
        words, known, vocab = _FPT_WORD, {**_FPT_ID, "X": -1}, " ".join(FPT_VOCAB) + " (brackets dropped)"
    for i, m in enumerate(words.finditer(source)):
        if m.group() not in known:
            return ReservoirError(
                f"expected ListOps tokens ({vocab}); found unknown token {m.group()!r} "
                f"at token {i} (column {m.start() + 1})"
            )
    return ReservoirError("expected a non-empty ListOps expression; found no tokens")


def tokenize_lra(source: str) -> list[int]:
    """``lra`` token ids of an expression, in the order of :data:`LRA_VOCAB`.

    Parameters
    ----------
    source : str
        LRA file format (``( ( ( [MAX 2 ) 9 ) ] )``) or plain (``[MAX 2 9 ]``):
        parentheses dropped, ``]`` or ``X`` closes, whitespace separates.

    Returns
    -------
    list of int
        Ids in ``0..14``, one per token.

    Raises
    ------
    ReservoirError
        On a token outside the vocabulary (named, with its position) or no tokens.
    """
    try:
        ids = [_LRA_ID[t] for t in source.replace("(", " ").replace(")", " ").split()]
    except KeyError:
        raise _unknown(source, "lra") from None
    if not ids:
        raise _unknown(source, "lra")
    return ids


def tokenize_fpt(source: str, max_tokens: int | None = FPT_MAX_TOKENS) -> list[int]:
    """Token ids the official FPT code would see (brackets dropped), in the order of :data:`FPT_VOCAB`.

    Every ``[``, ``]``, ``(``, ``)`` is removed (and ``X``, the other spelling
    of ``]``), so the tree structure is lost; the words left are looked up.

    Parameters
    ----------
    source : str
        An expression in either format :func:`tokenize_lra` accepts.
    max_tokens : int or None
        Keep at most this many tokens (official code: 512); None keeps all.

    Returns
    -------
    list of int
        Ids in ``0..13``. Raises ReservoirError on an unknown word or no words.
    """
    try:
        ids = [_FPT_ID[w] for w in source.translate(_BRACKETS_TO_SPACE).split() if w != "X"]
    except KeyError:
        raise _unknown(source, "fpt") from None
    if not ids:
        raise _unknown(source, "fpt")
    return ids[:max_tokens] if max_tokens is not None else ids


def encode(seqs: Sequence[bytes | Sequence[int]], labels: Sequence[int]) -> Split:
    """Pack token id sequences into a right-padded :class:`Split`.

    ``seqs`` holds non-empty id sequences (ids < 256), ``labels`` one int each.
    Returns inputs uint8 ``(N, L)``, ``L`` the longest sequence, padded with 0;
    lengths int64 ``(N,)``; labels int64 ``(N,)``.
    """
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)  # (N,)
    return _pack(b"".join(bytes(s) for s in seqs), lengths, labels)


def _pack(flat: bytes, lengths: np.ndarray, labels: Sequence[int]) -> Split:
    """Concatenated token ids (one byte each) and their lengths -> a right-padded uint8 :class:`Split`."""
    width = int(lengths.max()) if len(lengths) else 0
    inputs = np.zeros((len(lengths), width), dtype=np.uint8)  # (N, L)
    inputs[np.arange(width)[None, :] < lengths[:, None]] = np.frombuffer(flat, dtype=np.uint8)  # row by row
    return Split(inputs=inputs, lengths=lengths, labels=np.asarray(labels, dtype=np.int64))


def read_lra_split(path: str | os.PathLike, tokenization: str = "lra", max_tokens: int | None = None) -> Split:
    """Read one LRA ListOps file (``basic_{train,val,test}.tsv``).

    Parameters
    ----------
    path : str or path-like
        Tab-separated, header ``Source\\tTarget``, Source in the LRA format,
        Target an integer 0..9; blank lines are skipped.
    tokenization : {"lra", "fpt"}
        See the module docstring.
    max_tokens : int or None
        Cut every sequence to this many tokens; None keeps all.

    Returns
    -------
    Split
        As :func:`encode`. Malformed input (missing or empty file, wrong
        header or field count, bad target, unknown token, no examples) raises
        ReservoirError, one line naming file, line, expected and found.
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
                    continue
                if not line.strip():
                    continue
                fields = line.split("\t")
                if len(fields) != 2:
                    raise ReservoirError(f"expected 2 tab-separated fields (Source, Target); found {len(fields)}")
                source, target = fields
                try:
                    label = int(target.strip())
                except ValueError:
                    raise ReservoirError(f"expected an integer Target in 0..9; found {target[:60]!r}") from None
                if not 0 <= label <= 9:
                    raise ReservoirError(f"expected an integer Target in 0..9; found {label}")
                ids = tokenize_lra(source) if tokenization == "lra" else tokenize_fpt(source, None)
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


def _int_param(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < lo:
        raise ReservoirError(f"task 'listops': {name} must be an integer >= {lo}; found {value!r}")
    return int(value)


def _choice_param(name: str, value: Any, options: Sequence[str]) -> str:
    if value not in options:
        raise ReservoirError(f"task 'listops': {name} must be one of {', '.join(map(repr, options))}; found {value!r}")
    return value


def build_listops(
    source: str = "generate",
    data_dir: str | os.PathLike | None = None,
    tokenization: str = "lra",
    min_length: int = 20,
    max_length: int = 300,
    n_train: int = 4000,
    n_val: int = 0,
    n_test: int = 1000,
    seed: int = 0,
    max_tokens: int | None = None,
) -> TaskData:
    """Build the ``listops`` task.

    Parameters
    ----------
    source : {"generate", "lra"}
        Generate (LRA process, seeded) or read ``basic_{train,val,test}.tsv``
        from ``data_dir`` (all rows; ``n_*``, ``seed`` and the length bounds
        then do not apply and, like ``data_dir``, are left out of ``params``,
        so the fingerprint does not depend on where the files lie).
    data_dir : str or path-like or None
        Folder of the LRA files (``source="lra"`` only).
    tokenization : {"lra", "fpt"}
        15-token vocabulary, or the official FPT code's bracket-less tokens
        (ill-posed; see the module docstring).
    min_length, max_length : int
        Exclusive tree-length bounds of the generator (LRA: 500, 2000).
    n_train, n_val, n_test : int
        Generated examples per split, from one generator in that order; no
        ``val`` split when ``n_val == 0``.
    seed : int
        Seed of the generator's ``random.Random``.
    max_tokens : int or None
        Cut sequences to this many tokens; None: no cap (``lra``), 512 (``fpt``).

    Returns
    -------
    TaskData
        ``kind="tokens"``, ``d_in=len(vocab)``, ``n_classes=10``; inputs uint8
        ``(N, L)`` right-padded with 0, lengths int64 ``(N,)``, labels int64 ``(N,)``.
    """
    source = _choice_param("source", source, ("generate", "lra"))
    tokenization = _choice_param("tokenization", tokenization, ("lra", "fpt"))
    if max_tokens is not None:
        max_tokens = _int_param("max_tokens", max_tokens, 1)
    elif tokenization == "fpt":
        max_tokens = FPT_MAX_TOKENS
    vocab = LRA_VOCAB if tokenization == "lra" else FPT_VOCAB

    if source == "lra":
        folder = os.fspath(data_dir) if data_dir is not None else None
        paths = {k: os.path.join(folder, fn) for k, fn in SPLIT_FILES.items()} if folder is not None else {}
        missing = [os.path.basename(p) for p in paths.values() if not os.path.isfile(p)]
        if folder is None or missing:
            raise ReservoirError(
                "task 'listops' with source='lra': expected the LRA release files basic_train.tsv, basic_val.tsv, "
                "basic_test.tsv (lra_release/listops-1000/) in the folder data_dir; found "
                + ("data_dir=None" if folder is None else f"no {missing[0]} in {folder!r}")
            )
        splits = {name: read_lra_split(p, tokenization, max_tokens) for name, p in paths.items()}
        params = {"source": source, "tokenization": tokenization, "max_tokens": max_tokens}
    else:
        min_length = _int_param("min_length", min_length, 0)
        max_length = _int_param("max_length", max_length, 0)
        # Reachable lengths are 1 (a lone leaf) and every integer >= 4.
        if not (min_length < 1 < max_length or max(min_length + 1, 4) < max_length):
            raise ReservoirError(
                f"task 'listops': expected length bounds with a reachable length (1 or >= 4) strictly between them; "
                f"found min_length={min_length}, max_length={max_length}"
            )
        n_train = _int_param("n_train", n_train, 1)
        n_val = _int_param("n_val", n_val, 0)
        n_test = _int_param("n_test", n_test, 1)
        seed = _int_param("seed", seed, 0)
        splits = {name: generate_split(name, n, seed, min_length, max_length, tokenization, max_tokens)
                  for name, n in {"train": n_train, "val": n_val, "test": n_test}.items() if n}
        params = dict(source=source, tokenization=tokenization, min_length=min_length, max_length=max_length,
                      n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, max_tokens=max_tokens)  # fmt: skip
    return TaskData(name="listops", params=params, kind="tokens", d_in=len(vocab), n_classes=10, splits=splits,
                    n_out_tokens=1, vocab=list(vocab))  # fmt: skip


register(
    TaskSpec(
        name="listops",
        build=build_listops,
        defaults=dict(source="generate", data_dir=None, tokenization="lra", min_length=20, max_length=300,
                      n_train=4000, n_val=0, n_test=1000, seed=0, max_tokens=None),  # fmt: skip
        summary="nested MIN/MAX/MED/SM expressions over digits (LRA ListOps); predict the value 0-9",
        source="generated (seeded, LRA process) or the LRA release files basic_{train,val,test}.tsv",
        tokens="min_length..max_length (20..300); LRA files up to 2000",
        d_in="15 (lra) or 14 (fpt) one-hot",
        classes="10",
        splits="train, [val], test",
    )
)
