"""Low-level I/O shared by every package: errors on one line, JSON read safely, files published atomically, folders
proven writable.

Nothing here knows about tasks, stores or models; everything above imports it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

from reservoir.errors import ReservoirError

__all__ = ["ArrayHeader", "atomic_write", "available_memory", "cause", "check_inside", "check_local", "check_memory",
           "check_name", "check_regular", "control_char", "env_seconds", "file_kind", "first_sentence", "load_npy",
           "npy_header", "one_line", "process_alive", "publish", "read_json", "replaceable", "request_stop",
           "scratch_folder", "size_text", "stop_deferred", "unwritable", "within", "writable_folder",
           "zarr_store_around"]


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


#: Largest JSON file read (results, probes, metadata): far above any the toolkit writes, far below what parsing
#: (about 25 bytes of memory per byte of JSON) could not hold.
MAX_JSON_BYTES = 64 << 20

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def file_kind(mode: int) -> str:
    """What a ``stat`` mode is, in words (``"a FIFO"``)."""
    return "a regular file" if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def process_alive(pid: Any) -> bool:
    """Whether process ``pid`` of this host exists (a pid that is not a positive integer counts as alive)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


@contextlib.contextmanager
def scratch_folder(purpose: str) -> Iterator[Path]:
    """A temporary folder (in ``$TMPDIR``) removed on the way out, named by host and process id, so that one a
    killed process left behind (SIGKILL runs no cleanup) is removed by the next call of this host.

    Examples
    --------
    >>> with scratch_folder("doc") as tmp:
    ...     tmp.name.startswith("reservoir-doc-"), tmp.is_dir()
    (True, True)
    """
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64]
    prefix = f"reservoir-{purpose}-{host}-"
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{prefix}*"):
        pid = old.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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


#: The first bytes of every HDF5 file (its format signature).
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def replaceable(dest: str | os.PathLike) -> None:
    """Refuse (one line) to write ``dest`` unless nothing is there or a regular file is: never over a folder, a
    link, a device or a FIFO, a held lock file or an HDF5 file, and never inside a Zarr store."""
    store = zarr_store_around(dest)
    if store is not None:
        raise ReservoirError(f"{dest}: expected a file path to write outside any feature store; found it inside the "
                             f"Zarr store {store}, whose files (chunks, metadata) an output never replaces or joins")
    try:
        mode = os.lstat(dest).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file in the way of its folder is for the
        return                                       # folder's own check to name)
    except OSError as err:
        raise ReservoirError(f"{dest}: expected a file path to write, could not inspect it: "
                             f"{err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise ReservoirError(f"{dest}: expected a regular file (or no file) to write, found {file_kind(mode)}")
    try:
        with open(dest, "rb") as f:
            head = f.read(8)
            held = _held(f.fileno())
    except OSError:
        return  # unreadable: the write itself says why it fails, if it does
    if held:
        raise ReservoirError(f"{dest}: expected a file path to write; found a file a running process holds locked "
                             "(a store's or a run's lock), which is never replaced by an output")
    if head == HDF5_MAGIC:
        raise ReservoirError(f"{dest}: expected a file path to write; found an HDF5 file (a feature store?), which is "
                             "never replaced by an output: remove it first or choose another path")


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


def _held(fd: int) -> bool:
    """Whether another open file holds an exclusive ``flock`` on the file (a writer's lock file)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        return err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def publish(tmp: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Move a finished temporary file into place with ordinary permissions (mkstemp makes it 0600), the folder
    synced after; refuse (and remove the temporary) when ``dest`` is not a regular file (:func:`replaceable`)."""
    try:
        replaceable(dest)
    except ReservoirError:
        os.unlink(tmp)
        raise
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, dest)
    fsync_dir(Path(dest).absolute().parent)  # the rename itself survives a crash


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it, a file created in it) to disk; where a folder cannot be opened
    or synced (some filesystems), nothing."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: A stop request (SIGTERM, SIGHUP: :func:`request_stop`) that arrived inside a :func:`stop_deferred` block of the
#: main thread, raised when the outermost block ends; and how deep the main thread is in such blocks.
_STOP: dict[str, Any] = {"depth": 0, "pending": None}


@contextlib.contextmanager
def stop_deferred() -> Iterator[None]:
    """A block that a stop request waits for: raised at the block's end instead of inside it.

    Some writes are not safe to interrupt at an arbitrary line, such as
    ``torch.save``, whose zip writer an exception between two of its calls
    leaves unfinished. A stop request that arrives inside the block (on the
    main thread, where signal handlers run) is raised when the outermost
    block ends; Ctrl-C is not deferred.

    Examples
    --------
    >>> done = []
    >>> with stop_deferred():
    ...     request_stop(RuntimeError("stop"))  # the CLI's signal handler passes its Terminated
    ...     done.append("the block's end")
    Traceback (most recent call last):
    RuntimeError: stop
    >>> done
    ["the block's end"]
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STOP["depth"] += 1
    try:
        yield
    finally:
        _STOP["depth"] -= 1
        pending = _STOP["pending"] if _STOP["depth"] == 0 else None
        if pending is not None:
            _STOP["pending"] = None
            raise pending


def request_stop(stop: BaseException) -> None:
    """Raise ``stop`` now, or, inside a :func:`stop_deferred` block of the main thread, when the block ends."""
    if _STOP["depth"] > 0 and threading.current_thread() is threading.main_thread():
        _STOP["pending"] = _STOP["pending"] or stop
        return
    raise stop


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 110, fmt: str = "png") -> Path:
    """A matplotlib figure written at ``path`` (as ``fmt``, whatever the suffix says) through :func:`atomic_write`:
    a full disk is one line and no half-written figure is left."""
    path = Path(path)
    with atomic_write(path, "the figure") as f:
        fig.savefig(f, format=fmt, dpi=dpi)
    return path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, what: str, *, text: bool = False, note: str = "") -> Iterator[IO[Any]]:
    """A file to write ``path`` through: a temporary beside it, flushed to disk and renamed into place when the block
    ends; nothing is left at ``path`` or beside it when a write fails.

    A failed write (a full disk, an I/O error) is one line, ``<path>: could
    not write <what> (<reason>)``, followed by ``; <note>`` when given; the
    file already at ``path`` stays as it was. ``path`` must be a regular file
    or nothing (:func:`publish`).

    Examples
    --------
    >>> path = Path(tempfile.mkdtemp()) / "a.txt"
    >>> with atomic_write(path, "the note", text=True) as f:
    ...     _ = f.write("hello")
    >>> path.read_text()
    'hello'
    """
    path = Path(path)
    tail = f"; {note}" if note else ""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise ReservoirError(f"{path}: could not write {what} ({err.strerror or one_line(err)}){tail}") from None
    try:
        opened: IO[Any] = open(fd, "w", encoding="utf-8") if text else open(fd, "wb")  # noqa: SIM115 - closed below
        with opened as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    except OSError as err:
        raise ReservoirError(f"{path}: could not write {what} ({err.strerror or one_line(err)}){tail}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


#: Longest output name taken, in bytes: filesystems allow 255, and a store adds its temporary and lock suffixes.
MAX_NAME_BYTES = 230


def control_char(c: str) -> bool:
    """Whether ``c`` is an ASCII control character (below 32, or DEL): what splits a line or drives a terminal."""
    return ord(c) < 32 or ord(c) == 127


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


def unwritable(folder: Path, err: OSError, for_path: str | os.PathLike | None = None) -> ReservoirError:
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    found = f"{blocker} is a file" if blocker is not None and not blocker.is_dir() else (err.strerror or one_line(err))
    if for_path is not None:
        return ReservoirError(f"{for_path}: expected a writable output path; found {found}")
    return ReservoirError(f"{folder}: expected a folder the results can be written to; found {found}")


#: Longest duration a setting in seconds may ask for (a week): longer ones overflow timers and mean a typo.
MAX_SECONDS = 7 * 24 * 3600
#: Shortest one (10 ms): below it timers round to zero, which some libraries take as "no timeout" or fail on.
MIN_SECONDS = 0.01


def env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset); one line unless within
    :data:`MIN_SECONDS`..:data:`MAX_SECONDS`."""
    raw = os.environ.get(name)
    try:
        seconds = default if raw is None else float(raw)
    except ValueError:
        seconds = float("nan")
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ReservoirError(f"{name}: expected seconds from {MIN_SECONDS:g} to {MAX_SECONDS:,}, found {raw!r}")
    return seconds


def size_text(nbytes: int) -> str:
    """A byte count for people: ``"2.0 GiB"``."""
    size = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def available_memory() -> int | None:
    """Bytes of memory the machine can give now without swapping (Linux's ``MemAvailable``), or ``None`` when
    unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_memory(what: str, nbytes: int, things: str = "arrays") -> None:
    """Refuse (one line naming ``what`` and the limit) to allocate ``nbytes`` of ``things`` when the machine has less
    available."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise ReservoirError(f"{what}: expected {things} that fit in the {size_text(free)} of memory available; found "
                             f"{size_text(nbytes)}")


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
