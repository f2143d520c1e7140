"""What a store is made of, with no store object in sight: array names, the per-row arrays, the layout of a new
store, checksums of blocks and attributes, and the finiteness of rows.

Pure functions of arrays and attribute dicts: :mod:`reservoir.store.files`
(creating a store), :mod:`reservoir.store.checks` (refusing a damaged one) and
:class:`~reservoir.store.FeatureStore` all import them; this module imports
none of them.
"""

from __future__ import annotations

import numpy as np

#: The attributes of a store on object storage while it is created in place (replaced by its own, written last).
BUILDING = {"reservoir": "building"}


ALGORITHM = "crc32c"


def crc(block: np.ndarray, where: str) -> int:
    """CRC32C of ``where`` (e.g. ``train/features/3``) then the array's bytes in C order.

    Naming the place in the checksum ties a chunk to its position: a chunk
    moved to another row block, split or store does not match.
    """
    import crc32c  # reads the array's memory in place, without the GIL: writer threads checksum in parallel

    data = np.ascontiguousarray(block)
    return int(crc32c.crc32c(data.data.cast("B") if data.size else b"", value=crc32c.crc32c(where.encode())))


#: Attributes left out of the attributes' checksum (``complete`` changes as chunks are written).
MUTABLE_ATTRS = ("complete", "attrs_crc32c")


def attrs_crc(attrs: dict) -> int:
    """Checksum of a store's attributes (all but :data:`MUTABLE_ATTRS`), over their canonical JSON."""
    import json

    fixed = {k: v for k, v in attrs.items() if k not in MUTABLE_ATTRS}
    text = json.dumps(fixed, sort_keys=True, separators=(",", ":"))
    return crc(np.frombuffer(text.encode(), np.uint8), "attrs")


def feature_array(pooling: str) -> str:
    """The row array holding a pooling's features: ``features`` for ``last`` (every store has had it), else
    ``features_<pooling>``."""
    return "features" if pooling == "last" else f"features_{pooling}"


def pooling_attrs(pooling: dict) -> dict:
    """A store's ``pooling`` attribute in the current form ``{kinds, n_out_tokens}`` (stores written before
    poolings existed say ``{kind: "last_real_token", n_out_tokens}``: the last real token(s) only)."""
    if "kinds" in pooling:
        return pooling
    return {"kinds": ["last"], "n_out_tokens": pooling["n_out_tokens"]}


def poolings(attrs: dict) -> list[str]:
    """The poolings a store holds, in its arrays' order (stores written before poolings existed: ``last``)."""
    return list(pooling_attrs(attrs["pooling"])["kinds"])


def layout(attrs: dict, splits: dict[str, tuple[int, tuple[int, ...]]], feature_shape: tuple[int, ...],
           chunk_rows: dict[str, int], states_length: int | None, d_in: int, norm: bool) -> dict[str, dict]:
    """Every array of a store with its shape and dtype (recorded in ``attrs["arrays"]``, checked at open)."""
    dtype = str(np.dtype(attrs["dtype"]))
    n_dim = feature_shape[-1]
    out = {"projection/weight": {"shape": [d_in, n_dim], "dtype": "float32"}}
    if norm:
        out.update({f"final_norm/{k}": {"shape": [n_dim], "dtype": "float32"} for k in ("weight", "bias")})
    for split, (n, label_shape) in splits.items():
        n_chunks = -(-n // chunk_rows[split])
        for pooling in poolings(attrs):
            out[f"{split}/{feature_array(pooling)}"] = {"shape": [n, *feature_shape], "dtype": dtype}
        out[f"{split}/labels"] = {"shape": [n, *label_shape], "dtype": "int64"}
        out[f"{split}/lengths"] = {"shape": [n], "dtype": "int64"}
        if states_length is not None:
            out[f"{split}/states"] = {"shape": [n, states_length, n_dim], "dtype": dtype}
        out[f"{split}/done"] = {"shape": [n_chunks], "dtype": "bool"}
        out[f"{split}/checksums"] = {"shape": [n_chunks, len(row_arrays(states_length is not None,
                                                                         poolings(attrs)))], "dtype": "uint32"}
    return out


def row_arrays(states: bool, kinds: list[str] | tuple[str, ...] = ("last",)) -> list[str]:
    """The arrays of a split whose chunks carry checksums, in the column order of ``checksums``: the features
    of each pooling (``features`` first when it is one), labels, lengths (and states)."""
    return [*map(feature_array, kinds), "labels", "lengths", *(["states"] if states else [])]


def finite_along(a: np.ndarray, axis: int = 0) -> np.ndarray:
    """``(a.shape[axis],)`` whether every value at each index along ``axis`` is finite.

    float16 is read through its exponent bits (all ones: inf or NaN), which
    numpy reduces about 10x faster than ``isfinite`` on half floats.

    Examples
    --------
    >>> finite_along(np.array([[1, np.inf], [0, 2]], np.float16)).tolist()
    [False, True]
    >>> finite_along(np.array([[1, np.nan], [0, 2]]), axis=1).tolist()
    [True, False]
    """
    others = tuple(i for i in range(a.ndim) if i != axis % a.ndim)
    if a.size == 0:
        return np.ones(a.shape[axis], bool)
    if a.dtype == np.float16:
        return np.bitwise_and(a.view(np.uint16), 0x7C00).max(axis=others) != 0x7C00
    return np.isfinite(a).all(axis=others)
