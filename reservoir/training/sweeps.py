"""Learning-rate sweeps (Rothermel et al.): every lr x seed trained, the lr with the best mean validation wins."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.results import Result
from reservoir.store.lock import run_folder_lock
from reservoir.training.builders import run
from reservoir.training.config import TrainConfig


@dataclass(kw_only=True)
class SweepResult(Result):
    """One lr sweep: the keys of its ``sweep.json``.

    ``runs`` holds one ``{lr, seed, **metrics}`` per training;
    ``mean_val_by_lr`` the mean best validation accuracy per lr (keys are
    the lrs as strings); ``metrics`` the chosen lr's ``test_accuracy_mean``,
    ``test_accuracy_std`` and ``test_accuracies`` over seeds.
    """

    kind: str = "sweep"
    config: dict[str, Any]
    lrs: list[float]
    seeds: int
    runs: list[dict[str, Any]]
    mean_val_by_lr: dict[str, float]
    best_lr: float
    metrics: dict[str, Any]


#: Most learning rates a sweep may try, and seeds per rate (each is a whole training run).
MAX_SWEEP_LRS, MAX_SWEEP_SEEDS = 1000, 1000


def parse_lr_sweep(spec: str) -> list[float]:
    """``"1e-6:1e-2:9"`` -> 9 learning rates log-spaced from 1e-6 to 1e-2.

    Examples
    --------
    >>> parse_lr_sweep("1e-4:1e-2:3")
    [0.0001, 0.001, 0.01]
    """
    try:
        lo, hi, n = spec.split(":")
        if "_" in spec:  # Python's numbers take 1_0 as 10: a typo here, as in every number a recipe gives
            raise ValueError(spec)
        lo_f, hi_f, n_i = float(lo), float(hi), int(n)
    except ValueError:
        raise ReservoirError(f"--lr-sweep expects LOW:HIGH:N (e.g. 1e-6:1e-2:9), found {spec!r}") from None
    if not (0 < lo_f < hi_f < math.inf and 2 <= n_i <= MAX_SWEEP_LRS):
        raise ReservoirError(f"--lr-sweep expects 0 < LOW < HIGH and 2 <= N <= {MAX_SWEEP_LRS}, found "
                             f"{options.shown(spec)}")
    # 12 significant digits: 1e-5, not 9.999999999999999e-06, in results and folder names
    return [float(f"{v:.12g}") for v in np.logspace(math.log10(lo_f), math.log10(hi_f), n_i)]


def lr_label(lr: float) -> str:
    """The learning rate as a sweep's run folders name it: three significant digits where they hold it exactly
    (``1e-05``, ``0.001``), else the shortest text that reads back as ``lr``; two rates never share a name.

    Examples
    --------
    >>> lr_label(1e-3), lr_label(2.5e-4), lr_label(1.002e-3), lr_label(0.00100100000001)
    ('0.001', '0.00025', '0.001002', '0.00100100000001')
    """
    short = f"{lr:.3g}"
    return short if float(short) == lr else repr(float(lr))


def run_name(lr: float, seed: int) -> str:
    """The folder, inside a sweep's, of its run at ``lr`` and ``seed``: ``lr<lr>-seed<seed>`` (:func:`lr_label`)."""
    return f"lr{lr_label(lr)}-seed{seed}"


def sweep(config: TrainConfig, lrs: list[float], seeds: int, progress: bool = True, *,
          extra: dict[str, Any] | None = None) -> SweepResult:
    """Train every lr in ``lrs`` x ``seeds`` seeds (from ``config.seed``); the lr with the best mean validation wins.

    Each run is :func:`~reservoir.training.run` into ``<out>/lr<lr>-seed<seed>``
    (:func:`run_name`; ``out``: ``config.out``, else :meth:`TrainConfig.default_out` ending
    ``sweep<low>-<high>x<n>-seeds<first>-<last>``, never a single run's folder); the
    sweep writes ``<out>/sweep.json`` with every run's metrics and the chosen
    lr's test accuracy mean and std over seeds. ``extra`` adds top-level keys
    to the result and its file.

    Examples
    --------
    >>> r = sweep(TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=50), [1e-3, 1e-2], seeds=2)
    ... # doctest: +SKIP
    >>> r.best_lr, r.metrics["test_accuracy_mean"]  # doctest: +SKIP
    """
    try:
        lrs = [float(lr) for lr in lrs]
    except (TypeError, ValueError):
        raise ReservoirError(f"expected lrs a list of learning rates; found {options.shown(lrs)}") from None
    if not 1 <= len(lrs) <= MAX_SWEEP_LRS or len(set(lrs)) != len(lrs):
        raise ReservoirError(f"expected lrs 1 to {MAX_SWEEP_LRS} distinct learning rates; found "
                             f"{options.shown(lrs)}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SWEEP_SEEDS:
        raise ReservoirError(f"--seeds must be an integer in 1..{MAX_SWEEP_SEEDS}, found {seeds!r}")
    if config.seed + seeds - 1 > options.SEED_MAX:
        raise ReservoirError(f"--seed {config.seed} with --seeds {seeds}: expected seeds up to "
                             f"{options.SEED_MAX}; found them up to {config.seed + seeds - 1}")
    out = Path(config.out or config.default_out(f"sweep{lr_label(min(lrs))}-{lr_label(max(lrs))}x{len(lrs)}-"
                                                f"seeds{config.seed}-{config.seed + seeds - 1}"))
    if (out / "results.json").exists() or (out / "best.pt").exists():
        raise ReservoirError(f"{out} holds a single run (results.json, best.pt); expected a sweep's folder or a new "
                             "one: pass another --out")
    # every run's settings checked before the first trains (an lr or seed out of range, refused after hours of
    # earlier runs, was the alternative)
    configs = [[replace(config, lr=lr, seed=s, out=str(out / run_name(lr, s)))
                for s in range(config.seed, config.seed + seeds)] for lr in lrs]
    runs, rows = [], {}
    with run_folder_lock(out):  # one sweep per folder (each run also locks its own)
        for lr, per_seed in zip(lrs, configs):
            for cfg in per_seed:
                s = cfg.seed
                r = run(cfg, progress=progress)
                runs.append({"lr": lr, "seed": s, **r.metrics})
                rows.setdefault(lr, []).append((r.rows or {}).get("test"))
        by_lr = {lr: [r for r in runs if r["lr"] == lr] for lr in lrs}
        mean_val = {lr: float(np.mean([r["best_val_accuracy"] for r in rs])) for lr, rs in by_lr.items()}
        best_lr = max(lrs, key=lambda lr: mean_val[lr])
        tests = [r["test_accuracy"] for r in by_lr[best_lr]]
        metrics = {"test_accuracy_mean": float(np.mean(tests)), "test_accuracy_std": float(np.std(tests)),
                   "test_accuracies": tests, "test_interval": _pooled_interval(rows[best_lr])}
        result = SweepResult(config=asdict(config), lrs=lrs, seeds=seeds, runs=runs, best_lr=best_lr, metrics=metrics,
                             mean_val_by_lr={str(k): v for k, v in mean_val.items()}, extra=dict(extra or {}))
        result.write(out / "sweep.json")
    return result


def _pooled_interval(records: list) -> list[float] | None:
    """The 95% interval of the mean test accuracy over seeds: each test row's correct heads summed over the
    seeds' runs, each row one unit of :func:`~reservoir.readouts.intervals.accuracy_interval` with heads x seeds
    labels (the seeds' spread is ``test_accuracy_std``)."""
    from reservoir.readouts.intervals import accuracy_interval, decode_rows

    if not records or any(r is None for r in records):
        return None
    decoded = [decode_rows(r) for r in records]
    total = np.sum([c for c, _ in decoded], axis=0)  # (N,)
    return list(accuracy_interval(total, decoded[0][1] * len(decoded)))
