"""Results files: one JSON per experiment cell, carrying its full config and provenance."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reservoir import __version__
from reservoir.tasks.files import publish


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


def write_result(path: str | os.PathLike, result: dict[str, Any]) -> Path:
    """Write ``result`` (plus environment and timestamp) atomically as JSON."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    payload = {**result, "environment": environment(),
               "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=False, default=float)
        f.write("\n")
    publish(tmp, p)
    return p
