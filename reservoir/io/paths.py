"""What a path is and where it lies: regular files, paths kept inside a folder, Zarr stores around a path, output
names and folders checked before any work."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from reservoir.errors import ReservoirError
from reservoir.io.text import control_char, one_line

__all__ = ["MAX_NAME_BYTES", "ZARR_MARKERS", "check_inside", "check_local", "check_name", "check_regular",
           "file_kind", "lookup", "missing_folders", "removed_if_failed", "unwritable", "within", "writable_folder",
           "zarr_store_around"]


_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def file_kind(mode: int) -> str:
    """What a ``stat`` mode is, in words (``"a FIFO"``)."""
    return "a regular file" if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def check_regular(path: str | os.PathLike, expected: str) -> int:
    """Refuse (one line) to read ``path`` unless it is a regular file (a FIFO or a device would block or never end);
    return its size."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise ReservoirError(f"{path}: expected {expected}; found {err.strerror or one_line(err)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ReservoirError(f"{path}: expected {expected}; found {file_kind(st.st_mode)}")
    return st.st_size


def lookup(path: str | os.PathLike) -> os.stat_result | None:
    """``os.stat(path)`` (links followed), or ``None`` where nothing is there; refused in one line where the system
    cannot look the path up (a name longer than it takes, a loop of links, a folder above it that may not be read).

    Examples
    --------
    >>> lookup("no-such-file") is None
    True
    >>> lookup("x" * 300)
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: xxx...: expected a path this system can look up; found File name too long
    """
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        text = str(os.fspath(path))
        raise ReservoirError(f"{text if len(text) <= 200 else text[:60] + '...'}: expected a path this system can "
                             f"look up; found {err.strerror or one_line(err)}") from None


def check_inside(path: str | os.PathLike, root: str | os.PathLike, expected: str, doing: str = "read") -> None:
    """Refuse (one line) ``path`` unless, resolved, it lies strictly inside the folder ``root`` (resolved).

    What the toolkit reads, writes or removes inside a folder it was given (a
    results folder's runs and files, a recipe's store cache) stays inside it,
    whatever ids or links are planted there; ``doing`` says what was refused.
    """
    resolved, top = Path(path).resolve(), Path(root).resolve()
    if top not in resolved.parents:
        raise ReservoirError(f"{path}: expected {expected} inside {top}, found one resolving to {resolved}; refusing "
                             f"to {doing} it")


def within(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether ``path``, resolved, is the folder ``root`` (resolved) or lies inside it."""
    resolved, top = Path(path).resolve(), Path(root).resolve()
    return resolved == top or top in resolved.parents


#: The files that make a folder a Zarr group or array (format 3, and format 2's).
ZARR_MARKERS = ("zarr.json", ".zgroup", ".zarray")


def zarr_store_around(path: str | os.PathLike) -> Path | None:
    """The outermost Zarr group or array (a folder holding :data:`ZARR_MARKERS`) that ``path``, resolved, lies inside,
    or ``None``."""
    found = None
    for folder in Path(path).resolve().parents:
        if any(os.path.isfile(folder / m) for m in ZARR_MARKERS):
            found = folder
    return found


#: Longest output name taken, in bytes: filesystems allow 255, and a store adds its temporary and lock suffixes.
MAX_NAME_BYTES = 230


#: A path's first part that is a URL's scheme (``s3:`` of ``s3://b/x``, which a path reads as ``s3:/b/x``).
_SCHEME_PART = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:(?:/|$)")


def check_local(path: str | os.PathLike, what: str = "an output path") -> None:
    """Refuse (one line) a URL (``s3://bucket/x``) where only a local path is taken: as a path it names a folder
    ``s3:`` here, where files would be written under the URL's name."""
    text = str(os.fspath(path))
    if _SCHEME_PART.match(text):
        raise ReservoirError(f"{text}: expected {what} on this machine's filesystem; found a URL (only feature "
                             "stores are read and written on object storage)")


def check_name(path: str | os.PathLike) -> None:
    """Refuse (one line) an output whose name is too long for the filesystem once the toolkit's suffixes are added,
    whose path holds a control character (a newline would split every line that names it), or that is a URL
    (:func:`check_local`)."""
    check_local(path)
    text = str(os.fspath(path))
    if any(control_char(c) for c in text):
        raise ReservoirError(f"expected an output path without control characters (newlines, tabs, ...); found "
                             f"{text[:80]!r}")
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
        permission, a read-only disk, a Zarr store around it).

    Examples
    --------
    >>> writable_folder(tempfile.mkdtemp()).is_dir()
    True
    """
    check_local(path, "an output folder")
    folder = Path(path)
    if for_path is not None:
        check_name(for_path)
    store = zarr_store_around(folder / "_")  # the folder itself, or one above it
    if store is not None:
        raise ReservoirError(f"{for_path or folder}: expected an output folder outside any feature store; found it "
                             f"inside the Zarr store {store}, whose files an output never replaces or joins")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise unwritable(folder, err, for_path) from None
    return folder


def missing_folders(path: str | os.PathLike | None) -> list[Path]:
    """Folder ``path`` and those of its parents that do not exist, deepest first: what
    :func:`writable_folder` will make, for :func:`removed_if_failed`."""
    return [] if path is None else [p for p in (Path(path), *Path(path).parents) if not os.path.lexists(p)]


@contextlib.contextmanager
def removed_if_failed(folders: list[Path]) -> Iterator[None]:
    """Remove ``folders`` (deepest first, from :func:`missing_folders`) again if the block fails and they are still
    empty: a run refused after its results folder was made leaves no empty folder behind. A folder that holds
    anything (a checkpoint to resume from, another writer's file) is kept, and so are those above it.

    Examples
    --------
    >>> base = Path(tempfile.mkdtemp())
    >>> made = missing_folders(base / "a" / "b")
    >>> with contextlib.suppress(ValueError), removed_if_failed(made):
    ...     _ = writable_folder(base / "a" / "b")
    ...     raise ValueError
    >>> (base / "a").exists()
    False
    """
    try:
        yield
    except BaseException:
        for folder in folders:
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def unwritable(folder: Path, err: OSError, for_path: str | os.PathLike | None = None) -> ReservoirError:
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    found = f"{blocker} is a file" if blocker is not None and not blocker.is_dir() else (err.strerror or one_line(err))
    if for_path is not None:
        return ReservoirError(f"{for_path}: expected a writable output path; found {found}")
    return ReservoirError(f"{folder}: expected a folder the results can be written to; found {found}")
