"""What this machine and process offer: live processes, a scratch folder, durations from the environment, memory."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.io.text import size_text

__all__ = ["MAX_SECONDS", "MIN_SECONDS", "available_memory", "check_memory", "env_seconds", "process_alive",
           "scratch_folder"]


#: The largest pid a system gives (a signed 32-bit ``pid_t``): a record naming a larger one names no process.
MAX_PID = 2**31 - 1


def process_alive(pid: Any) -> bool:
    """Whether process ``pid`` of this host exists (a pid that is not a positive integer counts as alive; one beyond
    what a pid can be, none does)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True
    if pid > MAX_PID:
        return False
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
