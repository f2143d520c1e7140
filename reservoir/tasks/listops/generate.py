"""Drawing ListOps trees with the LRA process, and whole generated splits in parallel.

``lra_benchmarks/data/listops.py`` step for step (same draws, same order) but
from a ``random.Random(seed)`` instead of the global RNG: from depth 1, a node
below depth 10 draws ``r = random()``; ``r > 0.25`` gives a leaf
``choice(range(10))``, else ``randint(2, 10)`` children (inclusive), then the
operator ``choice(OPERATORS)``; at depth 10 a leaf. Length: leaf 1, operator
2 + children (= the number of ``lra`` tokens). Trees are kept when
``min_length < length < max_length`` (LRA: 500, 2000). No deduplication (LRA's
script keeps trees in a ``set``; at LRA's lengths duplicates are vanishingly
rare, at small lengths they are not).

:func:`generate_tree` and :func:`sample_trees` build trees (the reference);
:func:`draw_ids` makes the same draws straight into token ids, and
:func:`generate_split` draws a split's rows with it, in seeded blocks.
"""

from __future__ import annotations

import multiprocessing
import os
import random

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.tasks.arrays import pack
from reservoir.tasks.base import Split
from reservoir.tasks.listops.language import APPLY, CLOSE, LRA_ID, LRA_TO_FPT, OPERATORS, Tree

__all__ = ["BLOCK_ROWS", "MAX_ARGS", "MAX_DEPTH", "MAX_REJECTIONS", "VALUE_P", "draw_ids", "generate_split",
           "generate_tree", "sample_trees"]  # fmt: skip

MAX_DEPTH = 10
MAX_ARGS = 10
VALUE_P = 0.25
MAX_REJECTIONS = 1_000_000  # consecutive rejected draws before giving up
#: Rows drawn from one seeded generator; blocks are independent, so they are drawn in parallel.
BLOCK_ROWS = 1000

_VALUES = range(10)
_OP_IDS = {op: LRA_ID[op] for op in OPERATORS}


def _no_tree(min_length: int, max_length: int) -> ReservoirError:
    return ReservoirError(f"task 'listops': expected length bounds the LRA process can meet; found no tree with "
                          f"{min_length} < length < {max_length} in {MAX_REJECTIONS} draws")


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
                raise _no_tree(min_length, max_length)
    return trees


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
    close = LRA_ID[CLOSE]

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
        return APPLY[op](values)

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
                raise _no_tree(min_length, max_length)
            continue
        rejected = 0
        if tokenization == "fpt":
            ids = [LRA_TO_FPT[i] for i in ids if LRA_TO_FPT[i] >= 0]
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
    return pack(b"".join(ids for ids, _, _ in blocks), lengths, [v for _, _, vs in blocks for v in vs])


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
