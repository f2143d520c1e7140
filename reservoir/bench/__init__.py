"""Benchmarks: what caching buys, what extraction costs, how the readout compares.

* :func:`bench_extract` (``reservoir bench extract``): the extraction pass vs a
  bare forward of the same model on the same batches, vs the model's own
  Hugging Face forward, vs the naive way (full model, every hidden state,
  padded to the task's maximum, float32).
* :func:`speedup` (``reservoir bench speedup``): cached vs live training cost
  per epoch.
* :func:`bench_train` (``reservoir bench train``): the project's training step
  vs a plain PyTorch loop over the Hugging Face model, same groups and batches.
* :func:`readout_vs_sklearn` (``reservoir bench readout``).

Each returns a typed result (:class:`BenchResult`, :class:`ReadoutBenchResult`);
the CLI or the recipe runner writes it. Times are wall-clock on the machine at hand and noisy: compare ratios
measured in one run, not seconds across runs.
"""

from reservoir.bench.extract import bench_extract, format_extract
from reservoir.bench.readout import ReadoutBenchResult, readout_vs_sklearn
from reservoir.bench.result import BenchResult
from reservoir.bench.speedup import format_speedup, speedup
from reservoir.bench.train import PlainLoop, bench_train, format_train

__all__ = ["BenchResult", "PlainLoop", "ReadoutBenchResult", "bench_extract", "bench_train", "format_extract",
           "format_speedup", "format_train", "readout_vs_sklearn", "speedup"]
