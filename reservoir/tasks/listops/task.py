"""The ``listops`` task: generated with the LRA process, or read from the LRA release files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.tasks.base import Split, TaskData, TaskSpec, register
from reservoir.tasks.listops.generate import generate_split
from reservoir.tasks.listops.language import FPT_MAX_TOKENS, FPT_VOCAB, LRA_VOCAB
from reservoir.tasks.listops.lra import SPLIT_FILES, read_lra_split
from reservoir.tasks.params import check_size, choice_param, int_param

__all__ = ["build_listops"]

NAME = "listops"
#: The largest ``min_length`` the generator takes: a longer tree comes less than once in a thousand LRA draws.
MAX_MIN_LENGTH = 3000


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
        (ill-posed; see :mod:`reservoir.tasks.listops.language`).
    min_length, max_length : int
        Exclusive tree-length bounds of the generator (LRA: 500, 2000).
    n_train, n_val, n_test : int
        Generated examples per split; no ``val`` split when ``n_val == 0``.
        Each split is drawn in blocks of :data:`~reservoir.tasks.listops.generate.BLOCK_ROWS`
        rows, block ``b`` of split ``name`` from its own
        ``random.Random("listops/<seed>/<name>/<b>")``, so no split depends
        on another's size (:func:`~reservoir.tasks.listops.generate.generate_split`).
    seed : int
        Seed that keys every block's ``random.Random``.
    max_tokens : int or None
        Cut sequences to this many tokens; None: no cap (``lra``), 512 (``fpt``).

    Returns
    -------
    TaskData
        ``kind="tokens"``, ``d_in=len(vocab)``, ``n_classes=10``; inputs uint8
        ``(N, L)`` right-padded with 0, lengths int64 ``(N,)``, labels int64 ``(N,)``.
    """
    checked = check_listops({"source": source, "data_dir": data_dir, "tokenization": tokenization,
                             "min_length": min_length, "max_length": max_length, "n_train": n_train, "n_val": n_val,
                             "n_test": n_test, "seed": seed, "max_tokens": max_tokens})
    source, tokenization, max_tokens = checked["source"], checked["tokenization"], checked["max_tokens"]
    vocab = LRA_VOCAB if tokenization == "lra" else FPT_VOCAB
    if source == "lra":
        splits = _read_files(data_dir, tokenization, max_tokens)
        params = {"source": source, "tokenization": tokenization, "max_tokens": max_tokens}
    else:
        params = {k: v for k, v in checked.items() if k not in ("source", "tokenization", "max_tokens")}
        bounds = (params["min_length"], params["max_length"])
        splits = {name: generate_split(name, params[f"n_{name}"], params["seed"], *bounds, tokenization, max_tokens)
                  for name in ("train", "val", "test") if params[f"n_{name}"]}  # fmt: skip
        params = dict(source=source, tokenization=tokenization, **params, max_tokens=max_tokens)
    return TaskData(name=NAME, params=params, kind="tokens", d_in=len(vocab), n_classes=10, splits=splits,
                    n_out_tokens=1, vocab=list(vocab))  # fmt: skip


def check_listops(p: Mapping[str, Any]) -> dict[str, Any]:
    """The ``listops`` parameters checked (one line naming the first bad one): the source, the tokenization, the
    token cap (``None``: the tokenization's) and, for a generated task, the generator's."""
    source = choice_param(NAME, "source", p["source"], ("generate", "lra"))
    tokenization = choice_param(NAME, "tokenization", p["tokenization"], ("lra", "fpt"))
    max_tokens = p["max_tokens"]
    if max_tokens is not None:
        max_tokens = int_param(NAME, "max_tokens", max_tokens, 1)
    elif tokenization == "fpt":
        max_tokens = FPT_MAX_TOKENS
    out = {"source": source, "tokenization": tokenization, "max_tokens": max_tokens}
    if source == "generate" and p.get("data_dir") is not None:  # the files would be silently ignored
        raise ReservoirError(f"task {NAME!r}: data_dir is read with source=lra (the LRA release files); found "
                             f"data_dir={os.fspath(p['data_dir'])!r} with source=generate: add -p source=lra")
    if source == "generate":
        out.update(_generate_params(p["min_length"], p["max_length"], p["n_train"], p["n_val"], p["n_test"],
                                    p["seed"]))
    return out


def _read_files(data_dir: str | os.PathLike | None, tokenization: str, max_tokens: int | None) -> dict[str, Split]:
    """The three LRA release files in ``data_dir``, read; a missing folder or file is one line naming it."""
    folder = os.fspath(data_dir) if data_dir is not None else None
    paths = {k: os.path.join(folder, fn) for k, fn in SPLIT_FILES.items()} if folder is not None else {}
    missing = [os.path.basename(p) for p in paths.values() if not os.path.isfile(p)]
    if folder is None or missing:
        raise ReservoirError(
            f"task {NAME!r} with source='lra': expected the LRA release files basic_train.tsv, basic_val.tsv, "
            "basic_test.tsv (lra_release/listops-1000/) in the folder data_dir; found "
            + ("data_dir=None" if folder is None else f"no {missing[0]} in {folder!r}")
        )
    return {name: read_lra_split(p, tokenization, max_tokens) for name, p in paths.items()}


def _generate_params(min_length, max_length, n_train, n_val, n_test, seed) -> dict[str, int]:
    """The generator's parameters checked, as ints, in the order ``params`` keeps them."""
    min_length = int_param(NAME, "min_length", min_length, 0)
    max_length = int_param(NAME, "max_length", max_length, 0)
    # Reachable lengths are 1 (a lone leaf) and every integer >= 4.
    if not (min_length < 1 < max_length or max(min_length + 1, 4) < max_length):
        raise ReservoirError(
            f"task {NAME!r}: expected length bounds with a reachable length (1 or >= 4) strictly between them; "
            f"found min_length={min_length}, max_length={max_length}"
        )
    if min_length > MAX_MIN_LENGTH:  # reachable, but a kept tree would take more than a thousand draws
        raise ReservoirError(
            f"task {NAME!r}: expected min_length at most {MAX_MIN_LENGTH:,}: the LRA process draws a tree longer "
            f"than that less than once in a thousand draws (the longest of 20,000 draws had 5,462 tokens); found "
            f"min_length={min_length:,}"
        )
    out = {"min_length": min_length, "max_length": max_length, "n_train": int_param(NAME, "n_train", n_train, 1),
           "n_val": int_param(NAME, "n_val", n_val, 0), "n_test": int_param(NAME, "n_test", n_test, 1),
           "seed": int_param(NAME, "seed", seed, 0)}
    rows = out["n_train"] + out["n_val"] + out["n_test"]
    # the padded uint8 tokens (at most max_length - 1 wide; no wider than the longest tree, 10 x MAX_MIN_LENGTH
    # in practice), int64 lengths and labels
    check_size(NAME, rows * (min(max_length, 10 * MAX_MIN_LENGTH) + 16),
               f"{rows:,} rows of up to {min(max_length, 10 * MAX_MIN_LENGTH):,} tokens")
    return out


register(
    TaskSpec(
        name=NAME,
        build=build_listops,
        check=check_listops,
        summary="nested MIN/MAX/MED/SM expressions over digits (LRA ListOps); predict the value 0-9",
        source="generated (seeded, LRA process) or the LRA release files basic_{train,val,test}.tsv",
        tokens="strictly between min_length and max_length (21..299); LRA files up to 2000",
        d_in="15 (lra) or 14 (fpt) one-hot",
        classes="10",
        splits="train, [val], test",
    )
)
