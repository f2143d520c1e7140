"""Bit tasks from FPT (Lu et al. 2021): bit XOR and bit memory.

Both are generated from a seeded :func:`numpy.random.default_rng`; the train
split is drawn first, then the test split, from the one generator. Inputs are
continuous (``kind="continuous"``): every token is a small float32 vector.

``bit-xor``
    Two bitstrings ``a``, ``b`` of ``n_bits`` bits, one bit per token:
    inputs ``(N, 2*n_bits, 1)`` in {0, 1} (``a`` then ``b``), labels
    ``(N, n_bits) = a XOR b``. The readout reads the last token.
``bit-memory``
    ``n_patterns`` patterns of ``n_bits`` bits in {-1, +1}, then a query: one
    of the patterns, chosen uniformly, with each bit set to 0 with probability
    0.5. Everything is cut into tokens of ``bits_per_token`` bits: inputs
    ``(N, (n_patterns+1)*n_bits/bits_per_token, bits_per_token)``. Labels are
    the unmasked chosen pattern as {0, 1} bits, ``(N, n_out_tokens,
    bits_per_token)`` with ``n_out_tokens = n_bits/bits_per_token``: the readout
    reads the last ``n_out_tokens`` tokens (those of the query), one bit per
    class head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.tasks.base import Split, TaskData, TaskSpec, register
from reservoir.tasks.params import check_size, int_param

__all__ = ["build_bit_memory", "build_bit_xor", "make_bit_memory", "make_bit_xor"]


# --------------------------------------------------------------------------- XOR


def make_bit_xor(rng: np.random.Generator, n: int, n_bits: int) -> Split:
    """Draw ``n`` bit-XOR examples from ``rng``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of randomness (advanced by one ``integers`` call).
    n : int
        Number of examples.
    n_bits : int
        Bits per string.

    Returns
    -------
    Split
        inputs float32 ``(n, 2*n_bits, 1)`` in {0, 1}; lengths int64 ``(n,)``
        all ``2*n_bits``; labels int64 ``(n, n_bits)`` equal to ``a ^ b``.
    """
    bits = rng.integers(0, 2, size=(n, 2, n_bits), dtype=np.int8)  # (n, 2, n_bits): a, b
    labels = np.bitwise_xor(bits[:, 0], bits[:, 1]).astype(np.int64)  # (n, n_bits)
    inputs = bits.reshape(n, 2 * n_bits, 1).astype(np.float32)  # (n, 2*n_bits, 1)
    lengths = np.full(n, 2 * n_bits, dtype=np.int64)  # (n,)
    return Split(inputs=inputs, lengths=lengths, labels=labels)


def build_bit_xor(n_bits: int = 5, n_train: int = 4000, n_test: int = 1000, seed: int = 0) -> TaskData:
    """Build the ``bit-xor`` task (see the module docstring).

    Parameters
    ----------
    n_bits : int
        Bits per string, 1..256.
    n_train, n_test : int
        Examples per split (>= 1).
    seed : int
        Seed of the one ``default_rng`` used for train then test (>= 0).

    Returns
    -------
    TaskData
        ``kind="continuous"``, ``d_in=1``, ``n_classes=2``, ``n_out_tokens=1``.
    """
    params = check_bit_xor({"n_bits": n_bits, "n_train": n_train, "n_test": n_test, "seed": seed})
    per_row, rows = 2 * params["n_bits"], params["n_train"] + params["n_test"]
    check_size("bit-xor", per_row * (8 * rows + 2 * max(params["n_train"], params["n_test"])),
               f"{rows:,} rows of {per_row:,} bits")
    rng = np.random.default_rng(params["seed"])
    splits = {
        "train": make_bit_xor(rng, params["n_train"], params["n_bits"]),
        "test": make_bit_xor(rng, params["n_test"], params["n_bits"]),
    }
    return TaskData(
        name="bit-xor", params=params, kind="continuous", d_in=1, n_classes=2, splits=splits, n_out_tokens=1
    )


def check_bit_xor(p: Mapping[str, Any]) -> dict[str, int]:
    """The ``bit-xor`` parameters checked, as ints (one line naming the first bad one)."""
    bounds = {"n_bits": (1, 256), "n_train": (1, None), "n_test": (1, None), "seed": (0, None)}
    return {k: int_param("bit-xor", k, p[k], lo, hi) for k, (lo, hi) in bounds.items()}


# ------------------------------------------------------------------------ memory


def make_bit_memory(
    rng: np.random.Generator, n: int, n_bits: int, n_patterns: int, bits_per_token: int
) -> Split:
    """Draw ``n`` bit-memory examples from ``rng``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of randomness (patterns, then query choice, then mask).
    n : int
        Number of examples.
    n_bits : int
        Bits per pattern; a multiple of ``bits_per_token``.
    n_patterns : int
        Patterns shown before the query.
    bits_per_token : int
        Bits per input token.

    Returns
    -------
    Split
        inputs float32 ``(n, (n_patterns+1)*n_bits/bits_per_token,
        bits_per_token)`` with patterns in {-1, +1} and the query in
        {-1, 0, +1}; lengths int64 all equal; labels int64 ``(n,
        n_bits/bits_per_token, bits_per_token)`` in {0, 1}, the chosen pattern
        as ``(x + 1) / 2``.
    """
    patterns = rng.integers(0, 2, size=(n, n_patterns, n_bits), dtype=np.int8) * 2 - 1  # (n, P, n_bits) ±1
    chosen = rng.integers(0, n_patterns, size=n)  # (n,)
    target = patterns[np.arange(n), chosen]  # (n, n_bits) ±1
    keep = rng.integers(0, 2, size=(n, n_bits), dtype=np.int8)  # (n, n_bits): 0 = masked (p = 0.5)
    query = target * keep  # (n, n_bits) in {-1, 0, 1}
    seq = np.concatenate([patterns, query[:, None, :]], axis=1)  # (n, P+1, n_bits)
    n_tokens = (n_patterns + 1) * n_bits // bits_per_token
    inputs = seq.reshape(n, n_tokens, bits_per_token).astype(np.float32)  # (n, T, bits_per_token)
    labels = ((target + 1) // 2).astype(np.int64).reshape(n, n_bits // bits_per_token, bits_per_token)
    lengths = np.full(n, n_tokens, dtype=np.int64)  # (n,)
    return Split(inputs=inputs, lengths=lengths, labels=labels)


def build_bit_memory(
    n_bits: int = 1000,
    n_patterns: int = 5,
    bits_per_token: int = 50,
    n_train: int = 2000,
    n_test: int = 500,
    seed: int = 0,
) -> TaskData:
    """Build the ``bit-memory`` task (see the module docstring).

    Parameters
    ----------
    n_bits : int
        Bits per pattern; must be a multiple of ``bits_per_token``.
    n_patterns : int
        Patterns shown before the query (>= 1).
    bits_per_token : int
        Bits per input token (>= 1); also ``d_in``.
    n_train, n_test, seed : int
        As for :func:`build_bit_xor`.

    Returns
    -------
    TaskData
        ``kind="continuous"``, ``d_in=bits_per_token``, ``n_classes=2``,
        ``n_out_tokens=n_bits // bits_per_token``.
    """
    params = check_bit_memory({"n_bits": n_bits, "n_patterns": n_patterns, "bits_per_token": bits_per_token,
                               "n_train": n_train, "n_test": n_test, "seed": seed})
    per_row = (params["n_patterns"] + 1) * params["n_bits"]  # bits in a row's sequence
    rows = params["n_train"] + params["n_test"]  # float32 kept, int8 working copies of the larger split
    check_size("bit-memory", per_row * (4 * rows + 3 * max(params["n_train"], params["n_test"])),
               f"{rows:,} rows of {per_row:,} bits")
    rng = np.random.default_rng(params["seed"])
    args = (params["n_bits"], params["n_patterns"], params["bits_per_token"])
    splits = {"train": make_bit_memory(rng, params["n_train"], *args),
              "test": make_bit_memory(rng, params["n_test"], *args)}
    return TaskData(name="bit-memory", params=params, kind="continuous", d_in=params["bits_per_token"], n_classes=2,
                    splits=splits, n_out_tokens=params["n_bits"] // params["bits_per_token"])


def check_bit_memory(p: Mapping[str, Any]) -> dict[str, int]:
    """The ``bit-memory`` parameters checked, as ints (one line naming the first bad one)."""
    name = "bit-memory"
    out = {k: int_param(name, k, p[k], 0 if k == "seed" else 1)
           for k in ("n_bits", "n_patterns", "bits_per_token", "n_train", "n_test", "seed")}
    if out["n_bits"] % out["bits_per_token"]:
        raise ReservoirError(f"task {name!r}: n_bits must be a multiple of bits_per_token={out['bits_per_token']}; "
                             f"found n_bits={out['n_bits']}")
    return out


register(
    TaskSpec(
        name="bit-xor",
        build=build_bit_xor,
        check=check_bit_xor,
        summary="two 5-bit strings, one bit per token; predict their XOR",
        source="generated (seeded)",
        tokens="2*n_bits (10)",
        d_in="1",
        classes="2 per bit, n_bits heads",
    )
)

register(
    TaskSpec(
        name="bit-memory",
        build=build_bit_memory,
        check=check_bit_memory,
        summary="five 1000-bit ±1 patterns, then one of them half-masked, 50 bits per token; reproduce it",
        source="generated (seeded)",
        tokens="(n_patterns+1)*n_bits/bits_per_token (120); output: last 20",
        d_in="bits_per_token (50)",
        classes="2 per bit, 50 heads per output token",
    )
)
