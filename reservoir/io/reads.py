"""Files read safely: JSON of bounded size, ``.npy`` arrays whose header is checked before any data (no pickles)."""

from __future__ import annotations

import json
import os
from typing import IO, Any, Literal, NamedTuple

from reservoir.errors import ReservoirError
from reservoir.io.paths import check_regular
from reservoir.io.system import check_memory
from reservoir.io.text import one_line, size_text

__all__ = ["MAX_JSON_BYTES", "ArrayHeader", "load_npy", "npy_header", "read_json"]


#: Largest JSON file read (results, probes, metadata): far above any the toolkit writes, far below what parsing
#: (about 25 bytes of memory per byte of JSON) could not hold.
MAX_JSON_BYTES = 64 << 20


def read_json(path: str | os.PathLike, expected: str, max_bytes: int | None = None) -> Any:
    """The JSON value in the file ``path``; any reason it cannot be read is one line naming the file.

    Files over ``max_bytes`` (default :data:`MAX_JSON_BYTES`, for the
    toolkit's own small files) are refused before they are read; a data file
    passes its own bound (a memory check).

    ``expected`` says what the file should hold (e.g. ``"a results JSON
    object"``); the ReservoirError reads ``<path>: expected <expected>; found
    <what>`` for a missing or unreadable file, text that is not UTF-8, invalid
    JSON, or JSON nested too deeply to parse.

    Examples
    --------
    >>> read_json(os.devnull, "a JSON object")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: /dev/null: expected a JSON object; found a character device
    """
    size, limit = check_regular(path, expected), MAX_JSON_BYTES if max_bytes is None else max_bytes
    if size > limit:
        raise ReservoirError(f"{path}: expected {expected} of at most {size_text(limit)}; found {size_text(size)}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        found = err.strerror or one_line(err)
    except UnicodeDecodeError as err:
        found = f"text that is not UTF-8 ({one_line(err)})"
    except json.JSONDecodeError as err:
        found = f"invalid JSON ({err.msg} at line {err.lineno})"
    except RecursionError:
        found = "JSON nested too deeply to read"
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        found = f"unreadable JSON ({one_line(err)})"
    raise ReservoirError(f"{path}: expected {expected}; found {found}")


class ArrayHeader(NamedTuple):
    """What an ``.npy`` header claims, read before any data: the shape, the dtype and where the data starts."""

    shape: tuple[int, ...]
    dtype: Any  # numpy.dtype
    offset: int

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of data the header claims (exact: Python integers do not overflow)."""
        n = self.dtype.itemsize
        for dim in self.shape:
            n *= dim
        return n


def npy_header(fp: IO[bytes], where: str, size: int) -> ArrayHeader:
    """The header of the ``.npy`` data at ``fp`` (positioned at its start), checked against the ``size`` bytes it has.

    Refused in one line naming ``where``: not ``.npy`` data, a format other
    than 1.0 or 2.0, Python objects (which only a pickle can hold), or a
    shape whose data is not exactly what follows the header (a truncated
    file, a header that lies to make the reader allocate, or one that hides
    rows after its data). Nothing is allocated for the data.
    """
    import tokenize

    import numpy as np

    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f".npy format {version[0]}.{version[1]} (1.0 or 2.0 are read)")
        shape, _, dtype = read(fp)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError, tokenize.TokenError) as err:  # a garbled header
        raise ReservoirError(f"{where}: expected a numeric array (.npy data); found {one_line(err)}") from None
    if dtype.hasobject:
        raise ReservoirError(f"{where}: expected a numeric array; found Python objects ({dtype}), which only a pickle "
                             "can hold")
    header = ArrayHeader(tuple(int(d) for d in shape), dtype, fp.tell())
    data = size - header.offset  # the bytes after the header
    if header.nbytes != data:  # numpy writes the header and the data, nothing after them
        raise ReservoirError(f"{where}: expected the {size_text(header.nbytes)} of data its header claims (shape "
                             f"{header.shape}, {dtype}); found {size_text(max(data, 0))}"
                             + (" (trailing bytes)" if header.nbytes < data else ""))
    return header


def load_npy(path: str | os.PathLike, mmap_mode: Literal["r", "c"] | None = None) -> Any:
    """The array in the ``.npy`` file ``path``, its header checked first (:func:`npy_header`; and, unless memory-mapped,
    against the memory available); no pickles."""
    import numpy as np

    check_regular(path, "a .npy file")  # a FIFO would block the read
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        npy_header(f, str(path), size)
        if mmap_mode is None:
            check_memory(str(path), size)
    return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
