"""Results: typed result objects, and their files (one JSON per experiment cell, with full config and provenance).

Every result type (:class:`~reservoir.readouts.run.FitResult`,
:class:`~reservoir.training.TrainResult`, ...) is a dataclass deriving from
:class:`Result`: its fields are the JSON file's top-level keys, so
``to_dict()`` gives what the file holds and ``from_dict()`` reads files
written by any version (keys a type does not know are kept in ``extra``).
Whoever owns an output folder writes the result files in it; functions that
compute results return them and write nothing unless given a path.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from reservoir import __version__
from reservoir.errors import ReservoirError
from reservoir.io import atomic_write, unwritable, writable_folder  # noqa: F401 - writable_folder re-exported
from reservoir.options import is_real, shown


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded beside every result: what a time or a last digit depends on (the CPU
    model and its native bf16, the GPUs, the library versions)."""
    import numpy as np
    import torch

    from reservoir.runtime import cpuinfo, native_bf16

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() \
        else []
    return {
        "reservoir_version": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpu": cpuinfo("model name") or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "native_bf16": native_bf16(),
        "cuda": gpus[0] if gpus else None,  # the first GPU, as earlier files recorded it
        "gpus": gpus,
        "cuda_version": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
    }


def _version(package: str) -> str | None:
    """An installed package's version from its metadata, without importing it (transformers takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def write_result(path: str | os.PathLike, result: dict[str, Any]) -> Path:
    """Write ``result`` (plus environment and timestamp) atomically as JSON; an unwritable path is one line."""
    p = Path(path)
    payload = {**result, "environment": environment(),
               "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise unwritable(p.parent, err) from None
    with atomic_write(p, "the results", text=True) as f:
        json.dump(plain_json(payload), f, indent=2, sort_keys=False, allow_nan=False)
        f.write("\n")
    return p


def plain_json(value: Any) -> Any:
    """``value`` as strict JSON holds it: a non-finite number (no validation accuracy, say) is ``null``,
    numpy scalars and arrays are Python numbers and lists."""
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # a numpy scalar or array
        return plain_json(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


R = TypeVar("R", bound="Result")


def check_accuracies(data: Any, where: str = "") -> None:
    """Refuse (one line) a result whose accuracies are not what an accuracy can be: every value under a key naming
    an accuracy is a number in [0, 1] (or ``None``: none), every interval two such numbers (``NaN`` too), the low
    one first, at any depth. (Earlier versions wrote a missing validation accuracy as ``NaN``: such a run is done
    again.)

    Examples
    --------
    >>> check_accuracies({"metrics": {"test_accuracy": 0.9, "test_interval": [0.88, 0.92]}})
    >>> check_accuracies({"metrics": {"test_accuracy": -5.0}})
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: expected accuracies in [0, 1], found metrics.test_accuracy = -5.0
    """
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{where}.{key}" if where else str(key)
            name = str(key)
            if name == "interval" and isinstance(value, str):
                continue  # how the intervals were computed, in words
            if "interval" in name:
                _check_interval(value, path)
            elif "accurac" in name:
                for v in (value if isinstance(value, list) else [value]):
                    if isinstance(v, (dict, list)):
                        check_accuracies(v, path)
                    elif not _a_fraction(v, nan_ok=False):
                        raise ReservoirError(f"expected accuracies in [0, 1], found {path} = {shown(v)}")
            else:
                check_accuracies(value, path)
    elif isinstance(data, list):
        for i, v in enumerate(data[:100_000]):
            check_accuracies(v, f"{where}[{i}]")


def _check_interval(value: Any, path: str) -> None:
    """An interval's value: ``[low, high]``, each an accuracy (``None`` or ``NaN``: none), low <= high; or ``None``;
    or a mapping of such."""
    if value is None:
        return
    if isinstance(value, dict):
        check_accuracies(value, path)
        return
    if isinstance(value, list) and len(value) == 2 and all(_a_fraction(v, nan_ok=True) for v in value):
        lo, hi = value
        if lo is None or hi is None or math.isnan(lo) or math.isnan(hi) or lo <= hi:
            return
    raise ReservoirError(f"expected an interval [low, high] of accuracies in [0, 1], found {path} = {shown(value)}")


def _a_fraction(v: Any, nan_ok: bool) -> bool:
    if v is None:
        return True
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if isinstance(v, float) and math.isnan(v):
        return nan_ok
    return 0 <= v <= 1


# -- per-row results: which test rows each result got right ---------------------------------------------------------
def encode_rows(correct: np.ndarray, heads: int) -> dict:
    """Per-row counts of correct heads as a JSON-ready record (little-endian unsigned integers, base64)."""
    dtype = np.uint8 if heads < 256 else (np.uint16 if heads < 65536 else np.uint32)
    data = np.asarray(correct).astype(dtype).astype(np.dtype(dtype).newbyteorder("<"))
    return {"heads": int(heads), "dtype": np.dtype(dtype).name, "rows": int(len(data)),
            "correct": base64.b64encode(data.tobytes()).decode("ascii")}


def decode_rows(record: dict, where: str = "results") -> tuple[np.ndarray, int]:
    """``(correct (n,), heads)`` from :func:`encode_rows`'s record; anything malformed is one line."""
    try:
        heads, rows, dtype = int(record["heads"]), int(record["rows"]), str(record["dtype"])
        if dtype not in ("uint8", "uint16", "uint32") or heads < 1:
            raise ValueError(f"dtype {dtype!r}, heads {heads}")
        raw = base64.b64decode(record["correct"], validate=True)
        correct = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<")).astype(np.int64)
    except (KeyError, TypeError, ValueError) as err:
        raise ReservoirError(f"{where}: expected per-row results (heads, rows, dtype, base64 counts); "
                             f"found a malformed record ({err})") from None
    if len(correct) != rows or (correct > heads).any():
        raise ReservoirError(f"{where}: expected {rows} per-row counts of at most {heads}; found {len(correct)} "
                             f"rows, largest {int(correct.max(initial=0))}")
    return correct, heads


def check_agreement(data: Any) -> None:
    """Refuse (one line) a result whose accuracies contradict each other: a split's accuracy outside its own interval,
    or a test accuracy other than its per-row results' (``rows.test``), which the paired differences are drawn from.
    Files written before intervals or per-row results existed have none to check.

    Examples
    --------
    >>> check_agreement({"metrics": {"test_accuracy": 0.99, "test_interval": [0.62, 0.70]}})
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: expected metrics.test_accuracy inside metrics.test_interval; found 0.99 ...
    """
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict):
        return
    for split in ("train", "val", "test"):
        acc, interval = metrics.get(f"{split}_accuracy"), metrics.get(f"{split}_interval")
        if not (is_real(acc) and isinstance(interval, list) and len(interval) == 2
                and all(is_real(v) for v in interval)):
            continue
        lo, hi = interval
        if not lo - 1e-9 <= acc <= hi + 1e-9:
            raise ReservoirError(f"expected metrics.{split}_accuracy inside metrics.{split}_interval; "
                                 f"found {shown(acc)} outside [{shown(lo)}, {shown(hi)}]")
    rows = data.get("rows")
    record = rows.get("test") if isinstance(rows, dict) else None
    acc = metrics.get("test_accuracy")
    if isinstance(record, dict) and is_real(acc):
        correct, heads = decode_rows(record, "rows.test")
        counted = int(correct.sum()) / (len(correct) * heads) if len(correct) else None
        if counted is not None and abs(counted - acc) > 1e-9:
            raise ReservoirError(f"expected metrics.test_accuracy to be its per-row results' (rows.test: "
                                 f"{counted:.6g}); found {shown(acc)}")


@dataclasses.dataclass
class Result:
    """Base of the typed results: dataclass fields are the JSON keys; unknown keys are kept in ``extra``.

    Examples
    --------
    >>> @dataclasses.dataclass
    ... class Demo(Result):
    ...     metrics: dict
    >>> r = Demo.from_dict({"metrics": {"test_accuracy": 0.5}, "written": "2026-01-01"})
    >>> r.metrics["test_accuracy"], r.extra, r.to_dict()
    (0.5, {'written': '2026-01-01'}, {'metrics': {'test_accuracy': 0.5}, 'written': '2026-01-01'})
    """

    extra: dict[str, Any] = dataclasses.field(default_factory=dict, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict: every field (``None`` fields left out), then the ``extra`` keys."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """A result from a dict (a results file's content); refuses one without the type's required keys."""
        if not isinstance(data, dict):
            raise ReservoirError(f"expected a {cls.__name__} as a JSON object, found {type(data).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        required = [n for n, f in known.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise ReservoirError(f"expected a {cls.__name__} with {', '.join(required)}, found one without "
                                 f"{', '.join(missing)}")
        check_accuracies(data)
        check_agreement(data)
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})

    @classmethod
    def read(cls: type[R], path: str | os.PathLike) -> R:
        """A result from its JSON file; any reason it cannot be read is one line naming the file."""
        from reservoir.io import read_json

        data = read_json(path, f"a {cls.__name__} JSON object")
        try:
            return cls.from_dict(data)
        except ReservoirError as err:
            raise ReservoirError(f"{path}: {err}") from None

    def write(self, path: str | os.PathLike) -> Path:
        """Write the result as JSON at ``path`` (see :func:`write_result`)."""
        return write_result(path, self.to_dict())
