"""Benchmarks: what caching buys, what extraction costs, how the readout compares.

* :func:`bench_extract` (``reservoir bench extract``): the extraction pass vs a
  bare forward of the same model on the same batches, vs the model's own
  Hugging Face forward, vs the naive way (full model, every hidden state,
  padded to the task's maximum, float32).
* :func:`speedup` (``reservoir bench speedup``): cached vs live training cost
  per epoch.
* :func:`readout_vs_sklearn` (``reservoir bench readout``).

Each returns a typed result (:class:`BenchResult`, :class:`ReadoutBenchResult`);
the CLI or the recipe runner writes it. Times are wall-clock on the machine at hand and noisy: compare ratios
measured in one run, not seconds across runs.
"""

from reservoir.bench.extract import bench_extract, format_extract
from reservoir.bench.readout import ReadoutBenchResult, readout_vs_sklearn
from reservoir.bench.result import BenchResult
from reservoir.bench.speedup import format_speedup, speedup

__all__ = ["BenchResult", "ReadoutBenchResult", "bench_extract", "format_extract", "format_speedup",
           "readout_vs_sklearn", "speedup"]
