"""Text for people: an error on one line, its first sentence or its cause, a byte count, control characters."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["cause", "control_char", "first_sentence", "one_line", "size_text"]


def one_line(err: Any) -> str:
    """An exception (or anything) as text on one line."""
    return " ".join(str(err).split()) or type(err).__name__


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` on one line, without its full stop (a library's reason, not its advice).

    Examples
    --------
    >>> first_sentence("Connection closed by peer. See the docs.")
    'Connection closed by peer'
    """
    return " ".join(text.split(". ")[0].rstrip(".").split())


def cause(err: BaseException) -> str:
    """The cause of a library error in a few words (HDF5's messages span lines and carry a C-level report)."""
    if isinstance(err, OSError) and err.errno:
        return os.strerror(err.errno)
    text = str(err).strip()
    found = re.search(r"error message = '([^']+)'", text)
    if found:
        return found.group(1)
    return text.splitlines()[0] if text else type(err).__name__


def size_text(nbytes: int) -> str:
    """A byte count for people: ``"2.0 GiB"``."""
    size = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def control_char(c: str) -> bool:
    """Whether ``c`` is an ASCII control character (below 32, or DEL): what splits a line or drives a terminal."""
    return ord(c) < 32 or ord(c) == 127
