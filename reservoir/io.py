"""Low-level I/O shared by every package: errors on one line, JSON read safely, files published atomically, folders
proven writable.

Nothing here knows about tasks, stores or models; everything above imports it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from reservoir.errors import ReservoirError

__all__ = ["cause", "first_sentence", "one_line", "publish", "read_json", "unwritable", "writable_folder"]


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


def read_json(path: str | os.PathLike, expected: str) -> Any:
    """The JSON value in the file ``path``; any reason it cannot be read is one line naming the file.

    ``expected`` says what the file should hold (e.g. ``"a results JSON
    object"``); the ReservoirError reads ``<path>: expected <expected>; found
    <what>`` for a missing or unreadable file, text that is not UTF-8, invalid
    JSON, or JSON nested too deeply to parse.

    Examples
    --------
    >>> read_json(os.devnull, "a JSON object")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: /dev/null: expected a JSON object; found invalid JSON (Expecting value at line 1)
    """
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


def replaceable(dest: str | os.PathLike) -> None:
    """Refuse (one line) to write ``dest`` unless nothing is there or a regular file is: never over a folder, a
    link, a device or a FIFO."""
    try:
        mode = os.lstat(dest).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file in the way of its folder is for the
        return                                       # folder's own check to name)
    except OSError as err:
        raise ReservoirError(f"{dest}: expected a file path to write, could not inspect it: "
                             f"{err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        kind = {stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link", stat.S_IFCHR: "a character device",
                stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}
        found = kind.get(stat.S_IFMT(mode), "not a regular file")
        raise ReservoirError(f"{dest}: expected a regular file (or no file) to write, found {found}")


def publish(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Move a finished temporary file into place with ordinary permissions (mkstemp makes it 0600); refuse (and
    remove the temporary) when ``dest`` is not a regular file (:func:`replaceable`)."""
    try:
        replaceable(dest)
    except ReservoirError:
        os.unlink(tmp)
        raise
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, dest)


#: Longest output name taken, in bytes: filesystems allow 255, and a store adds its temporary and lock suffixes.
MAX_NAME_BYTES = 230


def check_name(path: str | os.PathLike) -> None:
    """Refuse (one line) an output whose name is too long for the filesystem once the toolkit's suffixes are added."""
    name = os.fsencode(Path(path).name)
    if len(name) > MAX_NAME_BYTES:
        raise ReservoirError(f"{str(path)[:60]}...: expected an output name of at most {MAX_NAME_BYTES} bytes, found "
                             f"{len(name)}")


def writable_folder(path: str | os.PathLike, for_path: str | os.PathLike | None = None) -> Path:
    """Create folder ``path`` (and its parents) and prove a file can be written in it.

    Called before expensive work whose results go there, so that an
    unwritable folder is refused before anything is computed.

    Raises
    ------
    ReservoirError
        One line naming the folder (or ``for_path``, the output to be written
        in it) and why it cannot be written (a file in the way, no
        permission, a read-only disk).

    Examples
    --------
    >>> writable_folder(tempfile.mkdtemp()).is_dir()
    True
    """
    folder = Path(path)
    if for_path is not None:
        check_name(for_path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise unwritable(folder, err, for_path) from None
    return folder


def unwritable(folder: Path, err: OSError, for_path: str | os.PathLike | None = None) -> ReservoirError:
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    found = f"{blocker} is a file" if blocker is not None and not blocker.is_dir() else (err.strerror or one_line(err))
    if for_path is not None:
        return ReservoirError(f"{for_path}: expected a writable output path; found {found}")
    return ReservoirError(f"{folder}: expected a folder the results can be written to; found {found}")


#: Longest duration a setting in seconds may ask for (a week): longer ones overflow timers and mean a typo.
MAX_SECONDS = 7 * 24 * 3600


def env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset); one line unless above 0 and at most
    :data:`MAX_SECONDS`."""
    raw = os.environ.get(name)
    try:
        seconds = default if raw is None else float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_SECONDS:
        raise ReservoirError(f"{name}: expected seconds above 0 and at most {MAX_SECONDS:,}, found {raw!r}")
    return seconds
