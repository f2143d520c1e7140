"""The result of ``bench extract``, ``bench speedup`` and ``bench train``: what was measured, under the benchmark's
kind."""

from __future__ import annotations

import dataclasses
import resource
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.results import Result

#: Top-level keys a results file adds around the measurements (kept in ``extra``, not measured).
ENVELOPE = ("environment", "written", "recipe")


@dataclasses.dataclass
class BenchResult(Result):
    """A benchmark's measurements; its file holds ``kind`` and the measurements side by side, flat.

    Measurements are read by key (``r["pass_over_bare"]``, ``r["output_only"]["speedup"]``);
    :func:`~reservoir.bench.format_extract`, :func:`~reservoir.bench.format_speedup` and
    :func:`~reservoir.bench.format_train` print them.

    Attributes
    ----------
    kind : str
        ``"bench-extract"``, ``"bench-speedup"`` or ``"bench-train"`` (``"bench"`` in recipe results).
    measurements : dict
        Seconds, ratios, counts and the settings measured, as the benchmark
        function documents them.

    Examples
    --------
    >>> r = BenchResult("bench-extract", {"pass_over_bare": 1.09})
    >>> r["pass_over_bare"], r.to_dict()
    (1.09, {'kind': 'bench-extract', 'pass_over_bare': 1.09})
    """

    kind: str
    measurements: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.measurements[key]

    def __contains__(self, key: str) -> bool:
        return key in self.measurements

    def get(self, key: str, default: Any = None) -> Any:
        return self.measurements.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.measurements, **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        if not isinstance(data, dict) or "kind" not in data:
            found = "one without kind" if isinstance(data, dict) else type(data).__name__
            raise ReservoirError(f"expected a BenchResult as a JSON object with kind, found {found}")
        rest = {k: v for k, v in data.items() if k != "kind"}
        return cls(data["kind"], {k: v for k, v in rest.items() if k not in ENVELOPE},
                   extra={k: v for k, v in rest.items() if k in ENVELOPE})


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_device_mb(device) -> float | None:
    """Peak CUDA memory allocated so far (since the last reset), in MB; ``None`` on the CPU."""
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
