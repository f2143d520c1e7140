"""Results files: one JSON per experiment cell, carrying its full config and provenance."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reservoir import __version__
from reservoir.errors import ReservoirError
from reservoir.tasks.files import one_line, publish


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded beside every result."""
    import numpy as np
    import torch

    return {
        "reservoir_version": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
    }


def writable_folder(path: str | os.PathLike) -> Path:
    """Create folder ``path`` (and its parents) and prove a file can be written in it.

    Called before expensive work whose results go there, so that an
    unwritable folder is refused before anything is computed.

    Raises
    ------
    ReservoirError
        One line naming the folder and why it cannot be written (a file in
        the way, no permission, a read-only disk).

    Examples
    --------
    >>> writable_folder(tempfile.mkdtemp()).is_dir()
    True
    """
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise _unwritable(folder, err) from None
    return folder


def _unwritable(folder: Path, err: OSError) -> ReservoirError:
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    found = f"{blocker} is a file" if blocker is not None and not blocker.is_dir() else (err.strerror or one_line(err))
    return ReservoirError(f"{folder}: expected a folder the results can be written to; found {found}")


def write_result(path: str | os.PathLike, result: dict[str, Any]) -> Path:
    """Write ``result`` (plus environment and timestamp) atomically as JSON; an unwritable path is one line."""
    p = Path(path)
    payload = {**result, "environment": environment(),
               "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name, suffix=".tmp")
    except OSError as err:
        raise _unwritable(p.parent, err) from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=False, default=float)
            f.write("\n")
        publish(tmp, p)
    except BaseException as err:  # a full disk, a folder in the way: no partial file is left
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise ReservoirError(f"{p}: could not write the results ({err.strerror or one_line(err)})") from None
        raise
    return p
