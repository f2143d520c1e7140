"""The ListOps language: trees, their values and text, and the two tokenizations.

``[MAX 4 3 [MIN 2 3 ] 1 0 ]`` evaluates to 4. A tree is a leaf value 0..9 or
``(operator, (child, ...))``; MIN, MAX, MED (``int(np.median)``, truncated)
and SM (sum mod 10) are the operators.

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
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from reservoir.errors import ReservoirError

__all__ = ["APPLY", "CLOSE", "DIGITS", "FPT_MAX_TOKENS", "FPT_VOCAB", "LRA_ID", "LRA_TO_FPT", "LRA_VOCAB", "OPERATORS",
           "Tree", "evaluate", "evaluate_ids", "to_string", "tokenize_fpt", "tokenize_lra", "tree_tokens"]  # fmt: skip

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
DIGITS = tuple(str(d) for d in range(10))
LRA_VOCAB = [*OPERATORS, CLOSE, *DIGITS]  # 15 tokens, ids 0..14
FPT_VOCAB = [op[1:] for op in OPERATORS] + list(DIGITS)  # 14 tokens, ids 0..13
FPT_MAX_TOKENS = 512

Tree = int | tuple  # a leaf value 0..9, or (operator, (child, ...))

#: ``lra`` token -> id (``X`` is another spelling of ``]``).
LRA_ID = {tok: i for i, tok in enumerate(LRA_VOCAB)} | {"X": LRA_VOCAB.index(CLOSE)}
_FPT_ID = {tok: i for i, tok in enumerate(FPT_VOCAB)}
#: ``lra`` id -> ``fpt`` id, -1 where the token is dropped (``]``).
LRA_TO_FPT = [_FPT_ID[op[1:]] for op in OPERATORS] + [-1] + [_FPT_ID[d] for d in DIGITS]
_LRA_WORD = re.compile(r"[^\s()]+")  # what tokenize_lra splits into
_FPT_WORD = re.compile(r"[^\s()\[\]]+")  # what tokenize_fpt splits into
_BRACKETS_TO_SPACE = str.maketrans({c: " " for c in "[]()"})


def _median_int(args: Sequence[int]) -> int:
    """``int(np.median(args))`` for non-negative ints, without numpy (faster)."""
    s = sorted(args)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2


#: Operator -> the function of its children's values.
APPLY = {"[MIN": min, "[MAX": max, "[MED": _median_int, "[SM": lambda args: sum(args) % 10}


def evaluate(tree: Tree) -> int:
    """Value (0..9) of a tree: MIN, MAX, MED = ``int(np.median)`` (truncated), SM = sum mod 10."""
    if not isinstance(tree, tuple):
        return int(tree)
    op, children = tree
    return APPLY[op]([evaluate(c) for c in children])


def evaluate_ids(ids: Sequence[int]) -> int:
    """Value (0..9) of an expression given as ``lra`` token ids; an expression that is not one tree (a ``]`` with
    nothing open, an operator closed with no argument or never closed, tokens after the tree) is one line.

    Examples
    --------
    >>> evaluate_ids(tokenize_lra("[MAX 4 3 [MIN 2 3 ] 1 0 ]"))
    4
    >>> evaluate_ids(tokenize_lra("[MAX 2 3"))
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: expected one ListOps expression; found 1 operator never closed
    """
    close, ops = LRA_ID[CLOSE], {LRA_ID[op]: APPLY[op] for op in OPERATORS}
    stack: list[tuple[int, list[int]]] = []  # open operators and their argument values so far
    value: int | None = None
    for i, t in enumerate(ids):
        if value is not None:
            raise ReservoirError(f"expected one ListOps expression; found tokens after it ends at token {i - 1}")
        if t in ops:
            stack.append((t, []))
            continue
        if t == close:
            if not stack:
                raise ReservoirError(f"expected one ListOps expression; found ] at token {i} with nothing open")
            op, args = stack.pop()
            if not args:
                raise ReservoirError(f"expected one ListOps expression; found an operator closed with no "
                                     f"argument at token {i}")
            v = ops[op](args)
        else:
            v = t - LRA_ID["0"]  # a digit
        if stack:
            stack[-1][1].append(v)
        else:
            value = v
    if stack:
        raise ReservoirError(f"expected one ListOps expression; found {len(stack)} operator"
                             f"{'s' if len(stack) > 1 else ''} never closed")
    if value is None:
        raise ReservoirError("expected one ListOps expression; found no tokens")
    return value


def tree_tokens(tree: Tree, out: list[str] | None = None) -> list[str]:
    """The ``lra`` tokens of a tree in prefix order, e.g. ``['[MAX', '4', '3', ']']``.

    ``len(tree_tokens(t))`` equals the length :func:`~reservoir.tasks.listops.generate.generate_tree` returns.
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
        words, known, vocab = _LRA_WORD, LRA_ID, " ".join(LRA_VOCAB) + " (or X for ])"
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
        ids = [LRA_ID[t] for t in source.replace("(", " ").replace(")", " ").split()]
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

